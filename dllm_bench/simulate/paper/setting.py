"""The paper's serving setting replayed at its scale: LLaDA-8B by shape, bf16; gen 256 = steps,
block 32, retention 0.5, Table 3's knobs; 1.0 req/s; the engine at its default share of the GPU's memory (0.9).
Inputs the paper does not give are declared, not fitted (`Declared`). The one fitted scalar, a
common efficiency u multiplying the profile's compute and bandwidth rates for every system, is
fitted on one published dLLM-Serve throughput (`fit_u`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from baselines import SYSTEMS
from dllm_bench.errors import UserError
from dllm_bench.metrics.serving import summarize
from dllm_bench.serve.presets import PAPER_BASELINE_KNOBS
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.hardware import Hardware, load
from dllm_bench.simulate.implementations import default_impl
from dllm_bench.simulate.paper.published import (
    BASELINES,
    DATASET_LABELS,
    ENGINE_POINTS,
    FIT_POINT,
    NAMES,
    TRACE,
)
from dllm_bench.simulate.simulator import SimSetup, resolve_sim_model, simulate_point
from dllm_bench.systems.spec import ENGINE, parse_system, retention_knobs
from engine.config import GPU_MEMORY_UTILIZATION
from engine.models import ModelConfig, config_from_pretrained
from workloads.serving import build_workload

TOKENS = {"l40s": 16384, "rtx4090": 4000}
GEN, BLOCK, RPS = 256, 32, 1.0
MAX_PROMPT = None     # the paper gives no prompt cap (BurstGPT's length model reaches 4,096 tokens)


def scaled(hw: Hardware, u: float) -> Hardware:
    return replace(hw, efficiency=hw.efficiency.scaled(u))


def impls() -> dict[str, str]:
    """The paper's systems as their upstream code runs them (the paper measured that code)."""
    return {n: default_impl(n, "gpu") for n in (ENGINE, *SYSTEMS)}


def setup(hw: Hardware, engine: dict | None = None) -> SimSetup:
    """LLaDA-8B on `hw` with the paper's knobs (the engine's overridable by `engine`)."""
    cfg = config_from_pretrained(resolve_sim_model("llada-8b")[0])
    base = {k: dict(v) for k, v in PAPER_BASELINE_KNOBS.items()}
    for name, r in retention_knobs(0.5).items():
        base.setdefault(name, {}).update(r)
    # The paper's dLLM-Serve: every request sparse (not the `engine` system's default, cache=auto).
    eng = dict(cache="sparse", max_num_batched_tokens=TOKENS.get(hw.name, 16384), max_num_logits=2048,
               max_num_seqs=512, retention=0.5) | (engine or {})
    return SimSetup(cfg, ModelShape.from_config(cfg, 2), hw, "bfloat16", impls(), hw.memory_bytes * GPU_MEMORY_UTILIZATION,
                    engine_defaults=eng, baseline_defaults=base)


@dataclass(frozen=True)
class Declared:
    """Inputs the paper does not give, declared by the user instead of our defaults: a fixed
    prompt length per dataset (default: our dataset length models) and a static batch per
    baseline (a third Table 4 scenario beside batch 1 and max-fit; Figures 7 and 8 divide by
    Sparse-dLLM at this batch instead of 1)."""
    prompt_len: dict[str, int] = field(default_factory=dict)
    batch: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"{DATASET_LABELS[k]} prompts {v} tokens" for k, v in self.prompt_len.items()]
        parts += [f"{NAMES[k]} batch {v}" for k, v in self.batch.items()]
        return "; ".join(parts) or "none (our length models; baselines at batch 1 and max-fit)"


DEFAULT = Declared()


def parse_declared(prompt_len: str | None, batch: str | None) -> Declared:
    """`osc=384,burstgpt=256` and `fast-dllm=3`: every key and value checked (UserError)."""
    return Declared(_pairs(prompt_len, "--paper-prompt-len", tuple(TRACE)),
                    _pairs(batch, "--paper-batch", BASELINES))


def _pairs(text: str | None, flag: str, keys: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for tok in (t.strip() for t in (text or "").split(",")):
        if not tok:
            continue
        k, sep, v = tok.partition("=")
        if not sep or k not in keys:
            raise UserError(f"{flag}: expected NAME=N with NAME one of {', '.join(keys)}, got {tok!r}")
        if not v.isdigit() or int(v) < 1:
            raise UserError(f"{flag}: {k} needs a positive integer, got {v!r}")
        out[k] = int(v)
    return out


def workload(ds: str, n: int, prompt_len: int | None = None, gen: int = GEN, seed: int = 0, rps: float = RPS,
             declared: Declared = DEFAULT):

    prompt_len = prompt_len or declared.prompt_len.get(ds)
    cfg = ModelConfig()
    kw = dict(random_input_len=prompt_len, random_output_len=gen) if prompt_len else {}
    return build_workload("random" if prompt_len else ds, num_prompts=n, rps=rps, seed=seed,
                          vocab_size=cfg.vocab_size, special_ids=[cfg.mask_token_id, cfg.eos_token_id],
                          block_length=BLOCK, gen_cap=gen, fixed_gen_length=gen, max_prompt_len=MAX_PROMPT, **kw)


def _quiet(msg: str) -> None:
    pass


LOG = {"fn": _quiet}      # replay() points this at the console: one line per simulated cell


def run(hw: Hardware, spec: str, wl, engine: dict | None = None) -> dict:
    """A simulated point's summary (+ its batch); a system that does not fit: NaN throughput."""

    try:
        out = simulate_point(parse_system(spec), setup(hw, engine), wl, BLOCK)
    except UserError as e:
        LOG["fn"](f"  {spec} on {hw.name}: {e}")
        return {"output_throughput": math.nan, "mean_e2el_ms": math.nan, "batch": None, "fits": None}
    s = summarize(out["result"])
    s["batch"], s["fits"] = out["info"].get("max_batch_size"), out["info"].get("fits_budget")
    LOG["fn"](f"  {spec} {engine or ''} on {hw.name}, {len(wl)} requests: {s['output_throughput']:.1f} tok/s, "
              f"mean E2EL {s['mean_e2el_ms'] / 1e3:.0f} s" + (f", B={s['batch']}" if s["batch"] else "")
              + (" (exceeds the memory budget!)" if s["fits"] is False else ""))
    return s


def fits(s: dict) -> str | None:
    """A baseline cell's static batch against the memory model: "no" = an OOM on that GPU."""
    return None if s.get("fits") is None else "yes" if s["fits"] else "no"


def fit_u(declared: Declared = DEFAULT, point: tuple[str, str] = FIT_POINT, wl=None) -> float:
    """u such that dLLM-Serve's simulated throughput at `point` (GPU, dataset) is the published
    one (secant steps on log u; throughput grows monotonically with u). `wl`: the point's
    workload when the caller has built it already."""
    gpu, ds = point
    hw, target = load(gpu), ENGINE_POINTS[point]
    wl = wl if wl is not None else workload(ds, TRACE[ds], declared=declared)
    lo_u, lo = 0.5, run(scaled(hw, 0.5), "engine", wl)["output_throughput"]
    hi_u, hi = 1.0, run(scaled(hw, 1.0), "engine", wl)["output_throughput"]
    for _ in range(6):
        x = math.log(lo_u) + (math.log(target) - math.log(lo)) * (math.log(hi_u) - math.log(lo_u)) / (
            math.log(hi) - math.log(lo))
        u = min(max(math.exp(x), 1e-3), 4.0)
        got = run(scaled(hw, u), "engine", wl)["output_throughput"]
        if abs(got / target - 1) < 0.005:
            return u
        lo_u, lo, hi_u, hi = hi_u, hi, u, got
    return u
