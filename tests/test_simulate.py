"""The simulator runs the real schedulers: with a cost of one unit per query token, the simulated
engine and baselines take exactly the steps, batches and per-request counts the real systems
take on a tiny LLaDA and a tiny Dream with the same virtual clock (each baseline by its own
family's rules: blocks, block ends). Plus: determinism of a simulated point."""
from __future__ import annotations

import pytest
import torch

from baselines import make_policy
from baselines.static_batch import Delegating, StaticBatchSystem
from dllm_bench.serve.loadgen import run_open_loop
from dllm_bench.serve.presets import PAPER_BASELINE_KNOBS
from dllm_bench.simulate import hardware
from dllm_bench.simulate.clock import VirtualClock, VirtualTimed
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.runners import CostPolicy, ShapeModel
from dllm_bench.simulate.simulator import SimSetup, simulate_point
from dllm_bench.systems.spec import baseline_knobs, engine_knobs, parse_system
from engine import EngineConfig, LLMEngine, SamplingParams
from tests.dream_helpers import BOS, tiny_dream
from tests.helpers import tiny_model
from workloads.serving import build_workload

UNIT = 1e-3   # simulated seconds per query token
BLOCK = 8


def _workload(n=10, rps=40.0, seed=3, vocab=298):
    return build_workload("livebench", num_prompts=n, rps=rps, seed=seed, vocab_size=vocab, special_ids=[],
                          length_scale=0.05, block_length=BLOCK, gen_cap=24)


def _params(item, steps_per_token: int = 1) -> SamplingParams:
    return SamplingParams(gen_length=item.gen_length, steps=steps_per_token * item.gen_length, block_length=BLOCK)


# family -> (its tiny model in float32, its prompt ids' bound)
FAMILIES = {"llada": (lambda: tiny_model(torch.float32), 298),
            "Dream": (lambda: tiny_dream(max_position_embeddings=1024).float(), BOS)}


# graphs off as on this CPU (the real engine here pads nothing); test_graph_padding_is_the_engines checks them
ENGINE_KNOBS = dict(max_num_batched_tokens=96, max_num_logits=20, max_num_seqs=6, retention=0.5, cuda_graphs=False)
BASE_KNOBS = {k: dict(v) for k, v in PAPER_BASELINE_KNOBS.items()}


def _setup(model) -> SimSetup:
    cfg = model.config
    return SimSetup(cfg, ModelShape.from_config(cfg, 4), hardware.load("h100"), "float32",
                    {n: "engine" for n in ("engine", "llada", "dream", "fast-dllm", "dllm-cache", "sparse-dllm")},
                    memory_budget=1e12, engine_defaults=ENGINE_KNOBS, baseline_defaults=BASE_KNOBS,
                    real_capacity=lambda v, seed=None: {"kv_pool_tokens": 60, "max_batch_size": 3},
                    cost_fn=lambda fw: fw.query_tokens * UNIT)


class _TimedRunner:
    """The real ModelRunner, charged one unit per query token it reports."""

    def __init__(self, inner, clock):
        self.inner, self.clock, self.last = inner, clock, []
        self.model_config, self.dtype, self.device = inner.model.config, inner.model.dtype, inner.model.device

    def run(self, batch):
        st = self.inner.run(batch)
        self.last = [r for r, _ in batch]
        self.clock.advance(st.query_tokens * UNIT)
        return st


class _TimedPolicy(Delegating):
    """A real baseline policy, charged one unit per query token it reports."""

    def __init__(self, real, clock):
        super().__init__(real)
        self.clock, self.last = clock, []

    def step(self, batch):
        res = self.real.step(batch)
        self.last = list(batch.reqs)
        self.clock.advance(res.query_tokens * UNIT)
        return res


def _real(model, variant, wl, params=_params):
    clock = VirtualClock()
    if variant.is_baseline:
        knobs = baseline_knobs(variant, BASE_KNOBS)
        pol = _TimedPolicy(make_policy(variant.name, model, **knobs), clock)
        system, last = StaticBatchSystem(model, pol, 3), (lambda: pol.last)
    else:
        cfg = EngineConfig(dtype="float32", device="cpu", sampling=False, kv_pool_tokens=60,
                           **engine_knobs(variant, ENGINE_KNOBS))
        system = LLMEngine(cfg, model=model)
        runner = system.runner = _TimedRunner(system.runner, clock)
        last = lambda: runner.last  # noqa: E731
    return run_open_loop(VirtualTimed(system, clock, last), wl, params, clock=clock.now, sleep=clock.sleep)


def _simulated_baseline(model, variant, wl, params):
    """A baseline as simulate_point builds it (its real policy over the model's shape, charged by
    CostPolicy), for sampling shapes simulate_point does not make (steps != gen_length)."""
    clock, shape_model = VirtualClock(), ShapeModel(model.config, model.dtype)
    real = make_policy(variant.name, shape_model, **baseline_knobs(variant, BASE_KNOBS))
    pol = CostPolicy(real, ModelShape.from_config(model.config, 4), lambda fw: fw.query_tokens * UNIT, clock)
    system = StaticBatchSystem(shape_model, pol, 3)
    return run_open_loop(VirtualTimed(system, clock, lambda: pol.last), wl, params, clock=clock.now, sleep=clock.sleep)


def _same_run(real, sim) -> None:
    """Every counter and request time of the simulated run equals the real run's."""
    for k in STAT_KEYS:
        if k in real["stats"]:
            assert sim["stats"][k] == real["stats"][k], k
    key = lambda r: r["request_id"]  # noqa: E731
    for a, b in zip(sorted(real["records"], key=key), sorted(sim["records"], key=key), strict=True):
        for k in RECORD_KEYS:
            assert a[k] == pytest.approx(b[k], abs=1e-9), (k, a["request_id"])   # sums of UNIT-multiples
    assert sim["duration"] == pytest.approx(real["duration"], abs=1e-9)


RECORD_KEYS = ("request_id", "prompt_len", "output_len", "nfe", "logits_rows", "kv_tokens", "kv_bytes",
               "arrival_time", "admitted_time", "first_token_time", "finished_time", "cache", "steps_per_block")
STAT_KEYS = ("steps", "forwards", "query_tokens", "logits_rows", "max_logits_rows_in_step", "batch_sizes",
             "step_composition", "refresh_steps", "reuse_steps", "peak_kv_tokens", "stalled_requests",
             "deferred_requests", "requests_dual", "requests_sparse")


LLADA_SPECS = ["engine", "engine:cache=sparse", "engine:cache=dual", "engine:max-num-logits=none",
               "engine:scheduler=lookahead",
               "engine:scheduler=lookahead,retention=0.25,max_num_batched_tokens=110,cache=sparse", "llada",
               "fast-dllm", "fast-dllm:fast_dllm_cache=prefix", "dllm-cache", "sparse-dllm"]
# Dream's baselines: Fast-dLLM and Sparse-dLLM commit block_start alone at a block's full forward;
# Dream's sampler and dLLM-Cache have no blocks (one block of gen_length: the first token time is the end)
DREAM_SPECS = ["engine", "dream", "fast-dllm", "fast-dllm:fast_dllm_cache=prefix", "dllm-cache", "sparse-dllm"]


@pytest.mark.parametrize(("family", "spec"), [("llada", s) for s in LLADA_SPECS] + [("Dream", s) for s in DREAM_SPECS])
def test_simulated_schedule_is_the_real_one(family, spec):
    torch.manual_seed(0)
    make, vocab = FAMILIES[family]
    model = make()
    variant = parse_system(spec)
    wl = _workload(vocab=vocab)
    real = _real(model, variant, wl)
    sim = simulate_point(variant, _setup(model), wl, BLOCK, keep_steps=True)["result"]
    assert len(real["records"]) == len(wl) and real["rejected"] == []
    _same_run(real, sim)
    # The KV pool really limited admission (queueing happened), so the test can see a wrong pool.
    if spec in ("engine", "engine:cache=sparse"):
        assert any(r["admitted_time"] > r["arrival_time"] + 1e-9 for r in real["records"])
    # The engine's default (cache=auto) served both modes: the simulator chose each one as it did.
    if spec == "engine":
        assert real["stats"]["requests_dual"] > 0 and real["stats"]["requests_sparse"] > 0
    # The plan made requests wait (collisions staggered), so the test sees the planner's steps.
    if spec == "engine:scheduler=lookahead,retention=0.25,max_num_batched_tokens=110,cache=sparse":
        assert real["stats"]["deferred_requests"] > 0


@pytest.mark.parametrize(("family", "spec"), [("llada", "fast-dllm"), ("Dream", "fast-dllm"),
                                            ("Dream", "fast-dllm:fast_dllm_cache=prefix"), ("Dream", "sparse-dllm"),
                                            ("Dream", "dream")])
def test_a_simulated_block_ends_where_its_family_ends_it(family, spec):
    """Two steps per token (S = 2 x block_length): LLaDA's Fast-dLLM skips its schedule's zero tail
    (one forward per token), Dream's takes all S (its grid's zero counts come first), as the real
    policies do; the simulated counters and times are the real ones."""
    make, vocab = FAMILIES[family]
    model = make()
    variant = parse_system(spec)
    wl = _workload(n=6, vocab=vocab)
    params = lambda item: _params(item, steps_per_token=2)  # noqa: E731
    real = _real(model, variant, wl, params)
    sim = _simulated_baseline(model, variant, wl, params)
    assert len(real["records"]) == len(wl) and real["rejected"] == []
    _same_run(real, sim)
    per_token = 1 if (family, variant.name) == ("llada", "fast-dllm") else 2
    assert all(r["nfe"] == per_token * r["output_len"] for r in real["records"])


def test_same_seed_same_simulated_summary():
    from dllm_bench.metrics.serving import summarize

    model = tiny_model(torch.float32)
    setup = _setup(model)
    setup.cost_fn = None
    setup.impls = {n: "engine" for n in setup.impls}
    outs = [summarize(simulate_point(parse_system(s), setup, _workload(seed=7), BLOCK)["result"])
            for s in ("engine", "fast-dllm", "engine", "fast-dllm")]
    assert outs[0] == outs[2] and outs[1] == outs[3]
    assert outs[0] != outs[1]


def test_simulate_cli_writes_serve_layout(tmp_path):
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "simulate", "--preset", "tiny", "--hardware", "h100",
                        "--systems", "engine,fast-dllm:batch=2", "--rps", "4,8", "--num-prompts", "4",
                        "--result-dir", str(tmp_path), "--run-id", "sim", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "sim"
    doc = json.loads(r.stdout)
    assert doc["simulated"] and len(doc["points"]) == 4 and doc["plots"]
    assert json.loads((run / "config.json").read_text())["kind"] == "simulate"
    for p in (run / "points").iterdir():
        s = json.loads((p / "summary.json").read_text())
        assert s["simulated"] is True and s["hardware"] == "h100" and s["completed"] == 4
        assert len((p / "requests.jsonl").read_text().splitlines()) == 4
    assert (run / "metrics.csv").is_file()


def test_simulate_llada_8b_by_its_shape_alone(tmp_path):
    """`--model llada-8b` has a config and no weights: simulate needs the shape only (serve's
    input checks, which want weights, must not refuse it), on the model's real dimensions."""
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "simulate", "--model", "llada-8b", "--hardware", "l40s",
                        "--systems", "engine", "--rps", "1", "--num-prompts", "6", "--result-dir", str(tmp_path),
                        "--run-id", "shape", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["simulated"] and len(doc["points"]) == 1
    m = json.loads((tmp_path / "shape" / "config.json").read_text())["config"]["model"]
    assert (m["d_model"], m["n_layers"], m["mlp_hidden_size"], m["vocab_size"]) == (4096, 32, 12288, 126464)
    s = json.loads(next((tmp_path / "shape" / "points").iterdir()).joinpath("summary.json").read_text())
    assert s["completed"] == 6 and s["output_throughput"] > 0
