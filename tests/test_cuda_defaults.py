"""The GPU path as users take it, on a CUDA faked on the CPU: every command defaults to bfloat16
and to one memory budget (free memory x 0.9, measured once) for every system of a run; the
crashes of issue 38 each have a test here. Nothing runs a model on the fake device: the tests
stop at the functions that turn options into run configs (or fake the model's device)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dllm_bench import device_defaults as dd
from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.systems import ridge
from tests.standins.peaks import fake_peaks
from tests.test_inputs import cli  # noqa: F401  (the fixture)
from tests.test_serve import RUN_DEFAULTS

GIB = 2**30
FREE, TOTAL = 70 * GIB, 80 * GIB
H100 = "NVIDIA H100 80GB HBM3"
KNOBS = {k: None for k in ("cache", "selection", "retention", "scheduler", "max_num_batched_tokens",
                           "max_num_logits", "max_num_seqs")}


class FakeCuda:
    """One GPU whose caching allocator holds `cached` bytes the driver does not count as free
    until empty_cache() returns them."""

    def __init__(self):
        self.cached = 0
        self.empty_calls = 0
        self.measures = 0
        self.name = H100

    def mem_get_info(self, device=None):
        self.measures += 1
        return FREE - self.cached, TOTAL

    def empty_cache(self):
        self.empty_calls += 1
        self.cached = 0


@pytest.fixture
def cuda(monkeypatch) -> FakeCuda:
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", fake.mem_get_info)
    monkeypatch.setattr(torch.cuda, "empty_cache", fake.empty_cache)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: fake.name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=TOTAL))
    monkeypatch.setattr(ridge, "peak_rates", fake_peaks)   # the ridge's peaks, not timed on a fake GPU
    return fake


AUTO = int(FREE * dd.GPU_MEMORY_UTILIZATION)


# ---------------------------------------------------------------- the one place
def test_device_defaults_on_cpu_stay_float32_and_unbounded():
    assert dd.default_dtype("cpu") == "float32" and dd.default_dtype("auto") == "float32"
    assert dd.resolve_budget("auto", "cpu").bytes is None and dd.resolve_budget(None, "cpu").bytes is None
    assert dd.resolve_budget("none", "cpu").bytes is None
    assert dd.resolve_budget("1GiB", "cpu").bytes == GIB
    for bad in ("auto", "none"):
        with pytest.raises(UserError, match="--memory-budget"):
            dd.resolve_budget(bad, "cpu", required=True)
    with pytest.raises(UserError, match="expected a size"):
        dd.resolve_budget("lots", "cpu")
    assert dd.gpu_identity("cpu") is None


def test_device_defaults_on_cuda_are_bf16_and_free_memory_x_09_after_empty_cache(cuda):
    assert dd.default_dtype("auto") == dd.default_dtype("cuda") == dd.default_dtype("cuda:0") == "bfloat16"
    assert dd.default_dtype("cpu") == "float32"
    cuda.cached = 5 * GIB                       # an earlier engine's freed pool, still cached
    b = dd.resolve_budget("auto", "cuda", required=True)
    assert b.bytes == AUTO and cuda.empty_calls == 1 and b.spec == "auto"
    assert H100 in b.detail and "at the start of the run" in b.detail
    assert dd.resolve_budget(None, "auto").bytes == AUTO
    assert dd.resolve_budget("22GiB", "cuda").bytes == 22 * GIB
    assert dd.gpu_identity("cuda") == {"name": H100, "total_memory": TOTAL}
    opts = dd.resolve_device_options("auto", None, "auto")
    assert (opts.device.type, opts.dtype, opts.budget.bytes) == ("cuda", "bfloat16", AUTO)
    assert dd.resolve_device_options("cpu", None, "auto").dtype == "float32"
    with pytest.raises(UserError, match="--dtype"):
        dd.resolve_device_options("cuda", "float8")


# ---------------------------------------------------------------- serve, ablate, sweep
def _paper_run(**over):
    from dllm_bench.serve.options import ServeOptions, resolve_run

    args = {**RUN_DEFAULTS, "systems": "engine,fast-dllm,dllm-cache,sparse-dllm", "preset": "paper",
            "num_prompts": 2, "length_scale": 0.05, "gen_length": 32, "gen_cap": 32, **over}
    return resolve_run(ServeOptions(**args))


def test_serve_paper_preset_without_a_budget_gives_every_system_the_auto_budget(cuda):
    """Was: no budget at all, and every max-fit baseline refused after the engine's first point."""
    from dllm_bench.serve.process import worker_spec
    from dllm_bench.serve.workload import workload_shape

    run = _paper_run()
    assert run.memory_budget == AUTO
    assert run.preset.dtype == "bfloat16" and run.preset.device == "cuda"
    assert run.describe()["memory_budget_source"]["spec"] == "auto"
    assert run.fingerprint()["memory_budget"] == "auto"
    shape = workload_shape(run)
    wl = next(iter(run.workloads.values()))
    cuda.cached = 3 * GIB                       # whatever happens later is not re-measured
    specs = [worker_spec(run, v, wl, shape) for v in run.systems]
    assert {(s["memory_budget"], s["dtype"], s["device"]) for s in specs} == {(AUTO, "bfloat16", "cuda")}
    assert cuda.measures == 1                   # measured once, for the whole run
    assert run.preset.ridge_rows == 262 and run.preset.ridge_rule.startswith(f"measured on {H100}")
    assert {s["engine_defaults"]["ridge_rows"] for s in specs} == {262}        # the run's ridge, once


def test_serve_checkpoint_dir_on_cuda_takes_the_gpu_preset(cuda):
    tiny_dir = str(inputs.checkpoint_dir("tiny"))
    run = _paper_run(preset=None, model=tiny_dir)
    assert run.preset.name == "paper" and run.preset.dtype == "bfloat16" and run.memory_budget == AUTO
    # A CPU preset moved to CUDA runs in bfloat16 and keeps its own (explicit) budget.
    run = _paper_run(preset="tiny", model="tiny", device="cuda", length_scale=None, gen_length=None, gen_cap=None)
    assert run.preset.dtype == "bfloat16" and run.memory_budget == 8 * 2**20


def test_a_gpu_preset_resolved_for_the_simulator_keeps_its_dtype():
    """`simulate` resolves the paper preset with device cpu: it models bfloat16 weights."""
    run = _paper_run(device="cpu", memory_budget="20GiB")
    assert run.preset.dtype == "bfloat16" and run.memory_budget == 20 * GIB


def test_serve_budget_auto_on_cpu_is_one_clear_error_and_cpu_dtype_stays_float32():
    from dllm_bench.serve.options import ServeOptions, resolve_run

    with pytest.raises(UserError, match="needed on CPU"):
        resolve_run(ServeOptions(**{**RUN_DEFAULTS, "memory_budget": "auto"}))
    with pytest.raises(UserError, match="needed on CPU"):
        resolve_run(ServeOptions(systems="engine", dataset="livebench", rps="inf", model="tiny", num_prompts=2,
                                 memory_budget="auto"))
    run = resolve_run(ServeOptions(**RUN_DEFAULTS))
    assert run.preset.dtype == "float32" and run.memory_budget == 8 * 2**20


def test_ablate_and_sweep_take_auto_on_cuda(cuda):
    from dllm_bench.serve.options import ServeOptions, resolve_run

    run = resolve_run(ServeOptions(systems="engine,sparse-dllm", dataset="random", rps="inf", model="tiny",
                                   preset="paper", num_prompts=2, memory_budget="auto", gen_length=32))
    assert run.memory_budget == AUTO and run.preset.dtype == "bfloat16"


def test_a_resumed_run_keeps_the_auto_budget_it_started_with(cuda, tmp_path):
    from dllm_bench.serve.points import keep_run_budget

    run = _paper_run()
    (tmp_path / "config.json").write_text(json.dumps({"config": {"memory_budget": AUTO - 123}}))
    keep_run_budget(run, tmp_path)
    assert run.memory_budget == AUTO - 123
    given = _paper_run(memory_budget="20GiB")
    keep_run_budget(given, tmp_path)
    assert given.memory_budget == 20 * GIB and given.fingerprint()["memory_budget"] == 20 * GIB


# ---------------------------------------------------------------- server
def test_server_model_dir_on_cuda_is_paper_knobs_bf16_budget_auto(cuda):
    """Was: cpu-default's knobs, float32 (32 GB of LLaDA-8B weights), 1300 MiB on CPU."""
    from dllm_bench.serve.presets import PRESETS
    from dllm_bench.server.options import ServerOptions, resolve_server_options

    opts = resolve_server_options(ServerOptions(model=str(inputs.checkpoint_dir("tiny")), **KNOBS))
    assert opts.preset.name == "paper"
    scaled = ("max_num_batched_tokens", "max_num_logits")     # scaled with the GPU (tests/test_step_budgets.py)
    assert opts.preset.engine_defaults() == {**PRESETS["paper"].engine_defaults(), "cuda_graphs": True,
                                             **{k: opts.preset.engine_defaults()[k] for k in scaled},
                                             "ridge_rows": 262}    # measured on the (fake) H100

    assert opts.preset.tokens_rule.startswith("auto: ") and H100 in opts.preset.tokens_rule
    assert (opts.device, opts.run.dtype, opts.run.budget.bytes) == ("cuda", "bfloat16", AUTO)
    given = ServerOptions(model="tiny", memory_budget="auto", device="cuda", **KNOBS)
    assert resolve_server_options(given).run.budget.bytes == AUTO


def test_server_accepts_auto_on_cpu_and_refuses_a_budget_below_the_weights_before_loading():
    from dllm_bench.server.options import ServerOptions, resolve_server_options

    opts = resolve_server_options(ServerOptions(model="tiny", memory_budget="auto", device="cpu", **KNOBS))
    assert opts.run.budget.bytes is None and opts.run.dtype == "float32" and opts.preset.name == "tiny"
    with pytest.raises(UserError, match="does not even hold the weights"):
        resolve_server_options(ServerOptions(model="tiny", memory_budget="4KiB", device="cpu", **KNOBS))


# ---------------------------------------------------------------- accuracy, lm-eval, generate
def test_accuracy_on_cuda_is_bf16_with_one_budget_for_every_point(cuda):
    from dllm_bench.accuracy.run import device_options

    opts, system_kw = device_options("auto", None, "auto", max_num_seqs=64, batch=32)
    assert (opts.device.type, opts.dtype) == ("cuda", "bfloat16")
    assert system_kw == {"max_num_seqs": 64, "batch": 32, "memory_budget": AUTO, "cuda_graphs": True}
    opts, system_kw = device_options("auto", None, "auto", max_num_seqs=64, batch=32)
    assert system_kw["memory_budget"] == AUTO


def test_accuracy_points_engine_is_built_for_the_runs_budget():
    from dllm_bench.accuracy.backend import point_system
    from dllm_bench.accuracy.points import Point
    from engine.models import load_model

    model = load_model(inputs.checkpoint_dir("tiny"))
    point = Point("engine:sparse:head:mean:r0.5", "engine", "sparse", "sparse", "head", 0.5, "mean")
    eng = point_system(point, model, max_num_batched_tokens=256, max_num_logits=64, memory_budget=32 * 2**20)
    assert eng.config.memory_budget == 32 * 2**20 and eng.pool.capacity is not None


def test_lm_eval_backend_defaults_to_bf16_and_auto_on_cuda(cuda, monkeypatch):
    from dllm_bench.accuracy import backend
    from dllm_bench.systems import inprocess

    seen = {}

    def fake_load(spec, dtype, device):
        seen.update(dtype=dtype, device=device)
        return SimpleNamespace(config=SimpleNamespace(eos_token_id=None))
    monkeypatch.setattr(inprocess, "load_model", fake_load)
    b = backend.engine_backend({"model": "tiny-math", "retention": "0.5"})
    assert seen == {"dtype": "bfloat16", "device": "cuda"} and b.system_kw["memory_budget"] == AUTO
    b = backend.engine_backend({"model": "tiny-math", "memory_budget": "none", "dtype": "float32"})
    assert seen["dtype"] == "float32" and b.system_kw["memory_budget"] is None


def test_generate_on_cuda_loads_bf16(cuda, cli, monkeypatch):  # noqa: F811
    from dllm_bench.systems import inprocess as generate  # where generate's systems are built

    seen = {}

    def fake_load(spec, dtype, device):
        seen.update(dtype=dtype, device=device)
        raise UserError("stop before a model is put on the fake GPU")
    monkeypatch.setattr(generate, "load_model", fake_load)
    assert "stop before" in cli("generate", "--prompt-ids", "1,2,3")
    assert seen == {"dtype": "bfloat16", "device": "cuda"}
    cli("generate", "--prompt-ids", "1,2,3", "--device", "cpu")
    assert seen == {"dtype": "float32", "device": "cpu"}


# ---------------------------------------------------------------- the engine's own CUDA default
def test_a_second_engine_in_one_process_gets_the_same_pool_budget(cuda):
    """The first engine's freed pool sits in the caching allocator: without empty_cache() the
    second engine of an accuracy run saw 10 GiB less free memory."""
    from engine.config import EngineConfig
    from engine.profiler import default_budget

    model = SimpleNamespace(device=torch.device("cuda"), parameters=lambda: [torch.zeros(1024)])
    first = default_budget(model, EngineConfig(device="cuda"))
    cuda.cached = 10 * GIB
    assert default_budget(model, EngineConfig(device="cuda")) == first


def test_the_run_budget_and_the_engines_own_default_are_one_formula(cuda, monkeypatch):
    """`auto` is measured before the weights load, the engine's default after they did: both are
    0.9 x the memory free before loading (engine.profiler.budget_from_free counts the loaded
    weights back), so an engine built without a budget gets the run's budget. Integer bytes:
    equality is the claim."""
    from engine.config import EngineConfig
    from engine.profiler import default_budget

    run = dd.resolve_budget("auto", "cuda").bytes
    weights = torch.zeros(2**20)                                   # 4 MiB of float32 "weights"
    loaded = FREE - weights.numel() * weights.element_size()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (loaded, TOTAL))
    model = SimpleNamespace(device=torch.device("cuda"), parameters=lambda: [weights])
    assert default_budget(model, EngineConfig(device="cuda")) == run == AUTO


# ---------------------------------------------------------------- measuring
def test_max_fit_search_takes_a_cuda_oom_as_does_not_fit(cuda):
    from baselines.profile import profile_max_batch

    model = SimpleNamespace(parameters=lambda: [torch.zeros(256)])
    measured = []

    def measure(b: int) -> int:
        measured.append(b)
        if b > 6:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return 100 * b

    before = cuda.empty_calls
    assert profile_max_batch(model, 1024 + 10**6, 8, 8, measure=measure, max_batch=64) == (6, 600)
    assert cuda.empty_calls > before and max(measured) > 6
    with pytest.raises(ValueError, match="ran out of device memory"):
        profile_max_batch(model, 1024 + 10**6, 8, 8, measure=lambda b: measure(b + 10))


def test_profile_cache_key_names_the_gpu(cuda, tmp_path):
    from dllm_bench.systems.build import cached_profile

    calls = []

    def compute():
        calls.append(1)
        return {"kv_pool_tokens": len(calls)}
    payload = {"model": {"config_sha256": "x"}, "engine": {"device": "cuda"}}
    assert cached_profile("engine", payload, compute, tmp_path, device="cuda") == ({"kv_pool_tokens": 1}, False)
    assert cached_profile("engine", payload, compute, tmp_path, device="cuda") == ({"kv_pool_tokens": 1}, True)
    cuda.name = "NVIDIA A100-SXM4-80GB"
    assert cached_profile("engine", payload, compute, tmp_path, device="cuda") == ({"kv_pool_tokens": 2}, False)
    stored = [json.loads(p.read_text())["key"]["gpu"] for p in sorted(tmp_path.glob("engine-*.json"))]
    assert sorted(g["name"] for g in stored) == ["NVIDIA A100-SXM4-80GB", H100]


def test_the_workers_peak_counts_the_engines_kv_pool(tmp_path):
    """The engine's pool exists before the meter starts: it was missing from the engine's peak
    while every baseline's caches (allocated in the run) were in theirs."""
    from dllm_bench.serve import worker
    from dllm_bench.serve.options import ServeOptions, resolve_run
    from dllm_bench.serve.process import worker_spec
    from dllm_bench.serve.workload import workload_shape
    from engine.models import load_model
    from engine.profiler import weights_bytes

    run = resolve_run(ServeOptions(**{**RUN_DEFAULTS, "systems": "engine", "rps": "inf", "num_prompts": 2}))
    spec = worker_spec(run, run.systems[0], next(iter(run.workloads.values())), workload_shape(run))
    assert worker.run(spec, tmp_path / "out.json") == 0
    stats = json.loads((tmp_path / "out.json").read_text())["result"]["stats"]
    pool = stats["kv_pool_bytes"]
    weights = weights_bytes(load_model(inputs.checkpoint_dir("tiny")))
    assert pool > 0 and stats["peak_memory_bytes"] > weights + pool
    assert stats["within_budget"] is (stats["peak_memory_bytes"] <= run.memory_budget)


def test_the_torch_floor_has_sdpa_enable_gqa():
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=(\d+)\.(\d+)', text)
    assert floor and (int(floor[1]), int(floor[2])) >= (2, 5)   # engine.attention.sdpa passes enable_gqa


# ---------------------------------------------------------------- the CLI on a CPU
@pytest.mark.parametrize("args, msg", [
    (["serve", "--preset", "tiny", "--memory-budget", "auto"], "needed on CPU"),
    (["ablate", "--preset", "tiny", "--memory-budget", "auto"], "needed on CPU"),
    (["sweep", "--vary", "input-len", "--preset", "tiny", "--memory-budget", "auto"], "needed on CPU"),
    (["profile", "--model", "tiny", "--memory-budget", "auto"], "needed on CPU"),
    (["serve", "--preset", "tiny", "--memory-budget", "none"], "--memory-budget none"),
    (["server", "--model", "tiny", "--memory-budget", "1KiB"], "does not even hold the weights"),
    (["accuracy", "--limit", "2", "--memory-budget", "lots"], "expected a size"),
    (["generate", "--prompt-ids", "1", "--dtype", "float8"], "--dtype must be one of"),
])
def test_budget_and_dtype_options_on_cpu_are_one_line_errors(cli, args, msg):  # noqa: F811
    assert msg in cli(*args)
