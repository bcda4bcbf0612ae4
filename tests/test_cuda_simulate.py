"""`simulate --hardware GPU` resolves its options as `serve` resolves them on that GPU
(device_defaults.SimulatedGpu): the same preset, dtype, memory budget, CUDA graphs, token and
logit budgets, ridge and attention as `serve` on a faked 80 GB CUDA device whose free memory and
peaks are the h100 profile's, without torch.cuda being asked; a flag or a knob still wins; a
tensor-parallel engine runs eager as its ranks do."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from dllm_bench import inputs
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.simulate.hardware import load
from dllm_bench.simulate.options import simulation
from dllm_bench.simulate.simulator import resolve_sim_model, simulate_point
from dllm_bench.simulate.work import keys_in_place
from dllm_bench.systems import ridge
from dllm_bench.systems.build import WARM_UP
from dllm_bench.systems.spec import engine_knobs
from engine.attention import choose_backend, flash_attn_import_error, torch_varlen
from engine.config import DTYPES, EngineConfig
from tests.helpers import run_cli

H100 = "NVIDIA H100 80GB HBM3"
TOTAL = 81559 * 2**20          # what the driver reports for an H100 80GB
SMALL = dict(num_prompts=3, rps="inf", length_scale=0.05, gen_length=32, gen_cap=32)
# What a user simulates, and the serve run on the GPU it models: the paper preset; a checkpoint
# without a preset (model: tiny's directory); a CPU preset, which serve runs on a GPU given --device
# cuda, and sized for the GPU given --memory-budget auto (its own budget sizes a CPU run).
CASES = {
    "paper": (dict(preset="paper", model="llada-8b", systems="engine,fast-dllm,dllm-cache,sparse-dllm",
                   num_prompts=3, rps="inf"), {}),
    "checkpoint": (dict(model=None, systems="engine,fast-dllm", **SMALL), {}),
    "cpu preset": (dict(preset="tiny", model="tiny", systems="engine,llada", num_prompts=3, rps="inf"),
                   {"device": "cuda", "memory_budget": "auto"}),
}


def _no_cuda(monkeypatch):
    """This machine as it is (no GPU), and any question to torch.cuda beyond that an error."""
    def asked(*args, **kwargs):
        raise AssertionError("the simulation asked torch.cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("device_count", "mem_get_info", "empty_cache", "get_device_name", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, asked)
    monkeypatch.setattr(ridge, "peak_rates", asked)


def _h100(monkeypatch, hw):
    """A faked H100 whose free memory and timed peaks are those the profile states."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(hw.memory_bytes), TOTAL))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: H100)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=TOTAL))
    monkeypatch.setattr(ridge, "peak_rates", lambda *args, **kwargs: (hw.peak_flops, hw.bandwidth))


def _defaults(run) -> dict:
    p = run.preset
    return {"preset": p.name, "dtype": p.dtype, "device": p.device, "memory_budget": run.memory_budget,
            "engine": run.engine_defaults, "baselines": run.baseline_defaults, "block": p.block_length,
            "gen_length": p.gen_length}


@pytest.mark.parametrize("case", CASES)
def test_simulate_on_h100_resolves_the_defaults_serve_resolves_on_an_80gb_cuda_device(monkeypatch, case):
    hw = load("h100")
    args, serve_flags = CASES[case]
    args = {**args, "model": args["model"] or str(inputs.checkpoint_dir("tiny"))}
    _no_cuda(monkeypatch)
    sim, _ = simulation(ServeOptions(**args), hw)
    _h100(monkeypatch, hw)
    model_dir, loadable = resolve_sim_model(args["model"])       # llada-8b: its shape, as simulate reads it
    served = resolve_run(ServeOptions(**{**args, "model": args["model"] if loadable else str(model_dir), **serve_flags}),
                         weights=loadable, wall_clock=False)
    # Alike but for the step overhead cache=auto weighs: the profile's fitted host and kernel
    # costs in the simulation; a measured run measures none (dllm_bench.systems.ridge)
    assert sim.engine_defaults["overhead_rows"] > 0 and served.engine_defaults["overhead_rows"] == 0
    assert _defaults(sim) == _defaults(served) | {"engine": served.engine_defaults | {
        "overhead_rows": sim.engine_defaults["overhead_rows"]}}
    d = sim.engine_defaults
    assert sim.preset.device == "cuda" and sim.preset.dtype == "bfloat16" and d["cuda_graphs"] is True
    assert d["ridge_rows"] == 265                           # bf16 on the profile's 693 TFLOP/s / 2.61 TB/s
    if case == "paper":           # (2.09 ms + 32 layers x 0.41 ms) x 693 TFLOP/s / (2 x 7.5 G weights)
        assert d["overhead_rows"] == 703
    assert sim.memory_budget == int(hw.memory_bytes * 0.9)
    if case == "paper":                                     # LLaDA-8B's shape at 0.9 x 79 GiB: capped
        assert (d["max_num_batched_tokens"], d["max_num_logits"]) == (32768, 2048)
        assert "on h100 (simulated)" in sim.preset.tokens_rule and H100 in served.preset.tokens_rule
    if case == "checkpoint":                                # a checkpoint without a preset: the GPU preset
        assert sim.preset.name == "paper"
    if case == "cpu preset":                                # its own step budgets, in bf16
        assert (d["max_num_batched_tokens"], d["max_num_logits"]) == (256, 64)
    # attention: the simulated engine reads keys in place where serve's engine picks a packed kernel
    cfg = EngineConfig(dtype=sim.preset.dtype, **engine_knobs(sim.systems[0], d))
    if torch_varlen() is not None or flash_attn_import_error() is None:
        assert choose_backend(cfg.attention_backend, "cuda", DTYPES[served.preset.dtype]).name != "sdpa"
        assert keys_in_place(cfg, gpu=True)


def test_a_flag_or_a_knob_still_wins_on_a_gpu_profile(monkeypatch):
    _no_cuda(monkeypatch)
    hw = load("h100")
    sim, _ = simulation(ServeOptions(preset="paper", systems="engine,engine:cuda_graphs=false", num_prompts=2, rps="inf",
                                     dtype="float16", memory_budget="40GB", max_num_batched_tokens=4000), hw)
    assert (sim.preset.dtype, sim.memory_budget, sim.engine_defaults["max_num_batched_tokens"]) == ("float16", 40 * 10**9,
                                                                                                     4000)
    assert [engine_knobs(v, sim.engine_defaults)["cuda_graphs"] for v in sim.systems] == [True, False]
    off, _ = simulation(ServeOptions(preset="paper", systems="engine", num_prompts=2, rps="inf", cuda_graphs=False), hw)
    assert off.engine_defaults["cuda_graphs"] is False
    cpu, _ = simulation(ServeOptions(preset="tiny", systems="engine", num_prompts=2, rps="inf"), load("cpu"))
    assert (cpu.preset.device, cpu.preset.dtype, cpu.engine_defaults["cuda_graphs"]) == ("cpu", "float32", False)


def test_the_engine_replays_graphs_on_one_gpu_and_runs_eager_over_ranks(monkeypatch):
    """As engine.parallel.driver on every rank: a tensor-parallel engine's ranks capture no graphs."""
    _no_cuda(monkeypatch)
    sim, setup = simulation(ServeOptions(preset="paper", systems="engine,engine:tensor_parallel_size=2",
                                         num_prompts=4, rps="inf"), load("rtx4090"))
    wl = next(iter(sim.workloads.values()))
    setup.cost_fn = lambda fw: 1e-3 if fw.graph else 2e-3         # a replay wins: every bucket keeps its graph
    for variant, graphs in zip(sim.systems, (True, False), strict=True):
        info = simulate_point(variant, setup, wl, sim.preset.block_length)["info"]
        assert info["engine_config"]["cuda_graphs"] is True
        assert (info["graph_capture"] is not None) is graphs and (info["graph_keep"] == "timed") is graphs
        assert bool(info["graphs"] and info["graphs"]["kept"]) is graphs, variant.label


def test_simulate_cli_on_h100_records_what_serve_would_run(tmp_path, monkeypatch, capsys):
    _no_cuda(monkeypatch)
    for run_id, flag, graphs in (("on", (), True), ("off", ("--no-cuda-graphs",), False)):
        r = run_cli(monkeypatch, capsys, "simulate", "--hardware", "h100", "--preset", "paper", "--systems", "engine",
                    "--num-prompts", "2", "--rps", "inf", *flag, "--result-dir", str(tmp_path), "--run-id", run_id)
        assert r.returncode == 0, r.stderr[-2000:]
        cfg = json.loads((tmp_path / run_id / "config.json").read_text())["config"]
        assert (cfg["preset"]["device"], cfg["preset"]["dtype"], cfg["preset"]["cuda_graphs"]) == ("cuda", "bfloat16",
                                                                                                    graphs)
        assert cfg["engine_defaults"]["max_num_batched_tokens"] == 32768
        (point,) = (tmp_path / run_id / "points").iterdir()
        s = json.loads((point / "summary.json").read_text())
        assert (s["graph_capture"], s["graph_keep"]) == ((WARM_UP, "timed") if graphs else (None, None))
        # the fitted h100's replays cost more than eager steps (c_graph > 0): its buckets keep none
        assert (s.get("graphs_kept"), s.get("graphs_eager", 0) > 0) == ((0, True) if graphs else (None, False))
