"""`dllm-bench ablate` (paper §6.6, Fig. 8): the ladder's definition and checks.

From Sparse-dLLM, each rung switches ONE EngineConfig field over the rung before it (engine,
then phase scheduler, then logit budget), over the same arrivals and memory budget; every engine
rung names `cache=sparse` (the paper's system), never the `engine` default `cache=auto`. Beyond
the paper: `beyond_rungs` (the §7 look-ahead scheduler, kept out of the Fig. 8 claims) and
cache-policy rows (the full engine with only cache/selection switched). Points run through
serve's worker machinery (dllm_bench.serve.points.measure_points) into a run of kind "ablate";
tables and figures: dllm_bench.ablate.tables. The rungs, budgets and output: docs/ABLATE.md.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dllm_bench.errors import UserError
from dllm_bench.systems.spec import baseline_knobs, engine_knobs, parse_system
from dllm_bench.units import comma_list
from engine.config import EngineConfig

DATASETS = ("livebench", "osc", "burstgpt")
THROUGHPUT = "output_throughput"   # tok/s: the paper's Fig. 8 "relative throughput"
# Knob order of every engine rung, so equal configurations get equal labels (one point).
KNOB_ORDER = ("scheduler", "max_num_logits", "cache", "selection")

# The ladder's engine token/logit budgets per serve preset. Rungs 1-2 materialize monolithic
# [query tokens x vocab] logits; at serve-126k's serve token budget (1024) that alone is
# ~0.5 GB of float32 at LLaDA's vocabulary and the monolithic profile does not fit the 1 GiB
# budget (1.5 GB activation peak), so the ladder runs every engine rung at a token budget the
# monolithic rungs can hold (384: ~0.6 GB peak) with the preset's logits:tokens ratio (1:4).
# Presets not listed use their serve values. `--max-num-batched-tokens/--max-num-logits` override.
ABLATION_ENGINE = {
    "serve-126k": {"max_num_batched_tokens": 384, "max_num_logits": 96},
}
# Fewer prompts than `serve` (16) on the CPU preset: 3 datasets x up to 7 systems must fit in
# about ten minutes on 2 cores. Presets not listed use their serve num_prompts.
ABLATION_PROMPTS = {"serve-126k": 8, "cpu-default": 3}


@dataclass(frozen=True)
class Rung:
    key: str                       # baseline | engine | scheduler | logits | lookahead | cache-none | ...
    title: str                     # row name in tables and figures
    spec: str                      # --systems spec text (dllm_bench.systems.spec grammar)
    switched: tuple[str, ...]      # EngineConfig fields switched vs the rung it is compared with
    group: str = "ladder"          # ladder | beyond | cache (beyond, cache: vs the full engine)
    note: str = ""

    def to_dict(self) -> dict:
        return {"key": self.key, "title": self.title, "spec": self.spec, "switched": list(self.switched),
                "group": self.group, "note": self.note}


def _engine_spec(**knobs: Any) -> str:
    def fmt(v: Any) -> str:
        return "none" if v is None else str(v)
    order = [k for k in KNOB_ORDER if k in knobs] + [k for k in knobs if k not in KNOB_ORDER]
    return "engine:" + ",".join(f"{k}={fmt(knobs[k])}" for k in order)


BASELINE = "sparse-dllm"      # the ladder's first rung: the paper's baseline


def ladder(max_num_logits: int) -> list[Rung]:
    """The paper's Fig. 8 ladder: baseline, then one component switched on per rung."""
    if max_num_logits is None or max_num_logits < 1:
        raise UserError("the logit-budget rung needs a logit budget (--max-num-logits N, not none)")
    base = dict(scheduler="request", max_num_logits=None, cache="sparse", selection="head")
    return [
        Rung("baseline", "Sparse-dLLM (baseline)", BASELINE, (),
             note="request-level static batch, uniform sparse cache (retention = the engine's)"),
        Rung("engine", "+ inference engine", _engine_spec(**base), (),
             note="continuous batching over packed varlen batches, head-centric dense KV, "
                  "request-level scheduling, monolithic logits"),
        Rung("scheduler", "+ phase-multiplexed scheduler", _engine_spec(**{**base, "scheduler": "phase"}),
             ("scheduler",), note="Reuse steps are charged their block, Refresh steps their canvas"),
        Rung("logits", "+ logit-aware budgeting",
             _engine_spec(**{**base, "scheduler": "phase", "max_num_logits": max_num_logits}),
             ("max_num_logits",), note=f"at most {max_num_logits} logit rows per step; the freed "
                                        "activation memory goes to the KV pool"),
    ]


def beyond_rungs(max_num_logits: int) -> list[Rung]:
    """Rungs after the paper's ladder, each switched from the full engine (rung 3)."""
    full = dict(scheduler="lookahead", max_num_logits=max_num_logits, cache="sparse", selection="head")
    return [Rung("lookahead", "+ look-ahead scheduler (§7, beyond the paper)", _engine_spec(**full), ("scheduler",),
                 "beyond", "future Refreshes planned within the token budget: staggered at admission, no stalls")]


def cache_rows(max_num_logits: int) -> list[Rung]:
    """The full engine (rung 3) under each cache policy; only cache/selection differ."""
    full = dict(scheduler="phase", max_num_logits=max_num_logits)
    return [
        Rung("cache-none", "cache=none (exact LLaDA)", _engine_spec(**full, cache="none", selection="head"),
             ("cache",), "cache", "no KV cache: every step runs the whole canvas"),
        Rung("cache-dual", "cache=dual (Fast-dLLM)", _engine_spec(**full, cache="dual", selection="head"),
             ("cache",), "cache", "prefix+suffix KV stored at each block's Refresh, reused dense"),
        Rung("cache-auto", "cache=auto (the engine system's default)",
             _engine_spec(**full, cache="auto", selection="head"), ("cache",), "cache",
             "each request dual while the KV pool holds it, head-centric sparse when memory binds and steps "
             "are weight-bound"),
        Rung("cache-sparse-head", "cache=sparse, head (dLLM-Serve)",
             _engine_spec(**full, cache="sparse", selection="head"), (), "cache",
             "the full engine (= the logit-budget rung)"),
        Rung("cache-sparse-uniform", "cache=sparse, uniform (Sparse-dLLM selection)",
             _engine_spec(**full, cache="sparse", selection="uniform"), ("selection",), "cache",
             "one token set for all heads of a layer"),
    ]


CACHE_ROW_CHOICES = ("all", "first", "none")


def parse_cache_rows(text: str) -> str:
    t = str(text).strip().lower()
    if t not in CACHE_ROW_CHOICES:
        raise UserError(f"--cache-rows must be one of {', '.join(CACHE_ROW_CHOICES)}, got {text!r}")
    return t


def parse_dataset_list(text: str | None, allowed: Sequence[str] = DATASETS) -> list[str]:
    out = comma_list(text or ",".join(allowed), "--datasets")
    for d in out:
        if d not in allowed:
            raise UserError(f"unknown dataset {d!r}; choose from {', '.join(allowed)}")
    return out


def ablation_settings(preset_name: str, serve_num_prompts: int, max_num_batched_tokens: int | None = None,
                      max_num_logits: str | None = None, num_prompts: int | None = None) -> dict:
    """The ladder's token budget, logit budget (CLI text: 'none' allowed) and prompts per
    dataset: the flags when given, else ABLATION_ENGINE / ABLATION_PROMPTS for the preset, else
    None (= the serve preset's value)."""
    d = ABLATION_ENGINE.get(preset_name, {})
    return {"max_num_batched_tokens": max_num_batched_tokens if max_num_batched_tokens is not None
            else d.get("max_num_batched_tokens"),
            "max_num_logits": max_num_logits if max_num_logits is not None
            else (str(d["max_num_logits"]) if "max_num_logits" in d else None),
            "num_prompts": num_prompts if num_prompts is not None else ABLATION_PROMPTS.get(preset_name, serve_num_prompts)}


# ---------------------------------------------------------------- effective configurations
def effective_engine_config(variant, engine_defaults: Mapping[str, Any], *, model_dir: str = "",
                            dtype: str = "float32", device: str = "cpu", memory_budget: int | None = None,
                            max_model_len: int | None = None):
    """The EngineConfig the worker builds for an engine variant (dllm_bench.systems.spec' rule:
    run-wide defaults, then the variant's knobs; serving is greedy, sampling=False), before the
    profiler sets kv_pool_tokens."""
    return EngineConfig(model=str(model_dir), dtype=dtype, device=device, sampling=False,
                        memory_budget=memory_budget, max_model_len=max_model_len,
                        **engine_knobs(variant, engine_defaults))


def effective_configs(rungs: Sequence[Rung], engine_defaults: Mapping[str, Any],
                      baseline_defaults: Mapping[str, Mapping[str, Any]] | None = None, **kw) -> list[dict]:
    """Per rung: {"system": ..., "config": dict}. Engine rungs: EngineConfig.to_dict();
    baselines: the policy knobs they are built with (dllm_bench.systems.spec.baseline_knobs)."""
    out = []
    for r in rungs:
        v = parse_system(r.spec)
        if v.is_baseline:
            out.append({"system": v.name, "config": baseline_knobs(v, baseline_defaults or {})})
        else:
            out.append({"system": "engine", "config": effective_engine_config(v, engine_defaults, **kw).to_dict()})
    return out


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any], ignore: Iterable[str] = ()) -> set[str]:
    """Fields whose values differ between two config dicts (missing = None)."""
    ign = set(ignore)
    return {k for k in set(a) | set(b) if k not in ign and a.get(k) != b.get(k)}


# Set by the profiler from the budget, not by the rung: differs as a consequence of the switch.
CONSEQUENTIAL = ("kv_pool_tokens",)


def check_ladder_configs(configs: Sequence[Mapping[str, Any] | None], rungs: Sequence[Rung],
                         reference: Mapping[str, Any] | None = None) -> list[str]:
    """Problems (empty = fine): each engine rung must differ from the rung before it (ladder) or
    from `reference` (beyond rungs and cache rows: the full engine) in exactly its `switched` fields, ignoring
    CONSEQUENTIAL ones. `configs[i]` is rung i's EngineConfig dict (None: baseline/not run)."""
    problems = []
    prev = None
    for cfg, r in zip(configs, rungs, strict=True):
        other = prev if r.group == "ladder" else reference
        if cfg is not None and other is not None:
            d = config_diff(other, cfg, CONSEQUENTIAL)
            if d != set(r.switched):
                problems.append(f"{r.title}: differs in {sorted(d) or 'nothing'}, expected {sorted(r.switched) or 'nothing'}")
        if r.group == "ladder":
            prev = cfg
    return problems
