"""`dllm-bench calibrate` on the device it is given: the device check, timings that wait for the
device, every operand of the timed operators on that device, and a calibrated profile that
simulates the code it timed. No GPU here: the device is checked against a patched CUDA, and the
operands' devices are read off a device that runs nothing (`meta`)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.serve.speed_gauge import SpeedGauge
from dllm_bench.simulate import hardware
from dllm_bench.simulate.calibrate import operators as cal
from dllm_bench.simulate.calibrate.plan import CalibrateOptions
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.implementations import default_impl
from dllm_bench.systems import ridge
from dllm_bench.timing import device_sync, median_time
from tests.helpers import one_error_line
from tests.standins.peaks import fake_peaks

SMALL = ModelShape(d=64, layers=2, heads=4, kv_heads=4, head_dim=16, ffn=128, vocab=512, wbytes=4)


def test_device_check(monkeypatch):
    assert inputs.device("cpu") == "cpu"
    for bad in ("tpu", "cuda:x", "CPU", "cuda:"):
        with pytest.raises(UserError, match="must be cpu or cuda"):
            inputs.device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="CUDA is not available"):
        inputs.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert inputs.device("cuda") == "cuda" and inputs.device("cuda:0") == "cuda:0"
    with pytest.raises(UserError, match="1 CUDA device"):
        inputs.device("cuda:1")


def test_timings_wait_for_the_device_before_each_start_and_stop():
    calls = []
    t = median_time(lambda: calls.append("op"), 3, sync=lambda: calls.append("sync"))
    assert t >= 0
    assert calls == ["op"] + ["sync", "op", "sync"] * 3          # the untimed call first, then each timed one
    assert device_sync("cpu") is None and device_sync(torch.device("cpu")) is None
    assert callable(device_sync("cuda:0"))                         # built, not called: no GPU needed


TIMED = ("matmul", "__matmul__", "linear", "scaled_dot_product_attention", "copy_")


class Operands(TorchFunctionMode):
    """The devices of every tensor handed to a matmul, a linear or an attention call."""

    def __init__(self):
        super().__init__()
        self.devices: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in TIMED:
            self.devices += [a.device.type for a in args if isinstance(a, torch.Tensor)]
        return func(*args, **(kwargs or {}))


def test_every_timed_operand_is_on_the_device_profiled():
    with Operands() as mode:
        ops = cal.measure_ops(SMALL, torch.float32, 1, device="meta")
        cal.measure_peaks(torch.float32, 1, "meta")
        SpeedGauge(SMALL.d, SMALL.ffn, torch.float32, 3, device="meta").read()
    kinds = {s.kind for s in ops}
    # two operands per call, and each operator is called once untimed and once timed
    assert kinds == {"gemm", "attn"} and len(mode.devices) >= 4 * len(ops)
    assert set(mode.devices) == {"meta"}


def test_a_calibrated_profile_simulates_the_code_it_timed(tmp_path):
    # Built-in GPU profiles simulate each system's upstream code; one written by calibrate (on a
    # CPU or a GPU) this repository's, which `serve` measures on that device.
    assert default_impl("fast-dllm", "gpu") == "hf-fast-dllm" and default_impl("engine", "gpu") == "engine"
    assert default_impl("fast-dllm", "cpu") == "dllm-bench"
    assert default_impl("fast-dllm", "gpu", "dllm-bench") == "dllm-bench"
    hw = hardware.Hardware(name="g", kind="gpu", peak_flops=1e14, bandwidth=1e12, memory_bytes=24e9, impl="dllm-bench")
    hardware.save(hw, tmp_path / "g.json")
    assert hardware.load(str(tmp_path / "g.json")).impl == "dllm-bench"
    assert hardware.load("l40s").impl == ""


def test_calibrate_on_a_device_this_machine_lacks_is_one_line_exit_2(tmp_path, cli_in_process):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "hw.json"
    for dev in ("cuda", "npu"):
        r = cli_in_process("calibrate", "--preset", "tiny", "--device", dev, "--out", str(out))
        one_error_line(r, "--device")
    # the paper preset profiles a GPU: here that is the same clear line, not a CPU profile
    r = cli_in_process("calibrate", "--preset", "paper", "--out", str(out))
    assert r.returncode == 2 and "CUDA is not available" in r.stderr
    assert not out.exists()


def test_a_profile_naming_an_unknown_implementation_is_refused(tmp_path):
    bad = tmp_path / "hw.json"
    bad.write_text(json.dumps({"name": "x", "kind": "gpu", "peak_flops": 1e14, "bandwidth": 1e12,
                               "memory_bytes": 1e10, "impl": "vllm"}))
    with pytest.raises(UserError, match="'impl' must be one of"):
        hardware.load(str(bad))


def test_default_sizes_follow_the_presets_concurrency_and_device():
    from dllm_bench.serve.presets import PRESETS
    from dllm_bench.simulate.calibrate.plan import default_sizes

    assert default_sizes(PRESETS["cpu-default"], "cpu") == (1, 2)           # 2 requests per point
    assert default_sizes(PRESETS["tiny"], "cpu") == (1, 4, 2, 8)
    assert default_sizes(PRESETS["paper"], "cuda") == (1, 2, 4, 8, 16, 32, 64)   # ascending: stop at saturation
    assert default_sizes(PRESETS["paper"], "cpu") == (1, 4, 2, 8)


def test_simulating_a_system_the_profile_has_no_host_time_for_warns(tmp_path):
    from dllm_bench.simulate.cost_model import Efficiency, HostCost

    hw = hardware.Hardware(name="part", kind="cpu", peak_flops=1e11, bandwidth=2e10, memory_bytes=1e10,
                           efficiency=Efficiency(), host={"dllm-bench/engine": HostCost(c_step=1e-3)},
                           impl="dllm-bench")
    hardware.save(hw, tmp_path / "part.json")
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "simulate", "--preset", "tiny", "--hardware",
                        str(tmp_path / "part.json"), "--systems", "engine,llada", "--rps", "8", "--num-prompts", "3",
                        "--result-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    err = " ".join(r.stderr.split())
    assert "no host time fitted for llada" in err and "no host time fitted for engine" not in err


# ---------------------------------------------------------------- a calibration on a GPU (issue 38)
from dllm_bench.simulate import bounds  # noqa: E402

GiB = 2**30
LLADA_8B = ModelShape(d=4096, layers=32, heads=32, kv_heads=32, head_dim=128, ffn=12288, vocab=126464, wbytes=2)
PAPER_SIZES = (1, 2, 4, 8, 16, 32, 64)
PAPER_LEN = 900 + 256                    # livebench's longest paper prompt plus gen_length 256


def test_every_size_is_bounded_by_the_budget_at_llada_8b_numbers():
    h100 = bounds.device_budget(79 * GiB)                   # free before the weights load
    rtx4090 = bounds.device_budget(23.5 * GiB)
    assert 6 * GiB > bounds.spare_bytes(LLADA_8B, rtx4090) > 4 * GiB        # what ~16 GB of weights leave
    # Fast-dLLM's batch of 64 needs its bf16 logits and two float64 copies of them per canvas row:
    # ~165 GB at batch 64, so the calibration stops at 16 on an H100 and at 1 on a 4090.
    per_request = PAPER_LEN * (LLADA_8B.kv_bytes_per_token + LLADA_8B.vocab * 18)
    assert 64 * per_request > 150e9
    cap = bounds.host_cap("fast-dllm", LLADA_8B, h100, PAPER_LEN, 4000, 2048)
    assert 16 <= cap < 32 and bounds.bounded_sizes(PAPER_SIZES, cap) == (1, 2, 4, 8, 16)
    assert bounds.bounded_sizes(PAPER_SIZES, bounds.host_cap("fast-dllm", LLADA_8B, rtx4090, PAPER_LEN, 4000, 2048)) == (1,)
    for system in ("dllm-cache", "sparse-dllm"):
        assert bounds.host_cap(system, LLADA_8B, h100, PAPER_LEN, 4000, 2048) < 64
    assert bounds.host_cap("llada", LLADA_8B, h100, PAPER_LEN, 4000, 2048) >= 64     # it caches nothing
    # the engine's KV pool (512 KiB a token) holds every paper size on an H100
    assert bounds.host_cap("engine", LLADA_8B, h100, PAPER_LEN, 4000, 2048) >= 64
    assert bounds.host_cap("engine", LLADA_8B, bounds.device_budget(10 * GiB), PAPER_LEN, 4000, 2048) == 0
    # operators: everything fits an H100; on a small spare the LM head's GEMMs (1 GB of weight) go
    full = cal.op_plan(LLADA_8B, "cuda")
    assert cal.op_plan(LLADA_8B, "cuda", spare=bounds.spare_bytes(LLADA_8B, h100)) == full
    small = cal.op_plan(LLADA_8B, "cuda", spare=0.5 * GiB)
    assert small and all(bounds.op_fits(op, LLADA_8B, 0.5 * GiB, cal.COLD_BYTES) for op in small)
    assert not any(op[0] == "gemm" and op[3] == LLADA_8B.vocab for op in small)
    assert ("attn", 4096, 4096, 4096) in full and ("attn", 4096, 4096, 4096) not in small
    assert bounds.attention_bytes(4096, 4096, 32, 32, 128, 2) == pytest.approx(3.36e9, rel=0.01)   # mostly the [32, 4096, 4096] scores
    n, copy = bounds.peak_sizes(*cal.PEAK_SIZES["cuda"], 2, 0.5 * GiB)
    assert 3 * n * n * 2 <= 0.5 * GiB and copy * 8 <= 0.5 * GiB
    assert bounds.peak_sizes(*cal.PEAK_SIZES["cuda"], 2, 60 * GiB) == cal.PEAK_SIZES["cuda"]


def _fake_gpu(monkeypatch, free: float, name: str = "NVIDIA H100 80GB HBM3"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free), int(80 * GiB)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(ridge, "peak_rates", fake_peaks)   # the ridge's peaks, not timed on a fake GPU


def _llada_8b_dir(tmp_path, monkeypatch):
    from dllm_bench.simulate.simulator import shape_only_dir

    monkeypatch.setenv("DLLM_BENCH_CACHE", str(tmp_path / "cache"))
    return str(shape_only_dir("llada-8b"))


def test_calibrate_on_cuda_plans_bf16_and_sizes_that_fit(tmp_path, monkeypatch):
    from dllm_bench.simulate.calibrate import run as cmd

    _fake_gpu(monkeypatch, 79 * GiB)
    pl = cmd.plan(CalibrateOptions(preset="paper", model=_llada_8b_dir(tmp_path, monkeypatch), device="cuda",
                                   systems="engine,fast-dllm"))
    assert pl.preset.dtype == "bfloat16" and pl.device.type == "cuda" and pl.shape == LLADA_8B
    assert pl.budget == bounds.device_budget(79 * GiB)
    by_name = {v.name: s for v, s in pl.sizes.items()}
    # up to the largest batch the budget admits, that batch included: where a baseline serves
    cap = bounds.host_cap("fast-dllm", LLADA_8B, pl.budget, PAPER_LEN, 4000, 2048)
    assert pl.mode.name == "gpu" and pl.mode.events and not pl.mode.gauge
    assert by_name["engine"] == PAPER_SIZES and by_name["fast-dllm"] == (1, 2, 4, 8, 16, cap) and cap > 16
    assert pl.spare == bounds.spare_bytes(LLADA_8B, pl.budget)
    # a CPU preset on a GPU is profiled in bf16 too, unless --dtype says otherwise
    tiny = CalibrateOptions(preset="tiny", device="cuda", systems="engine", sizes=(1,))
    assert cmd.plan(tiny).preset.dtype == "bfloat16"
    assert cmd.plan(replace(tiny, dtype="float32")).preset.dtype == "float32"
    with pytest.raises(UserError, match="--dtype must be one of"):
        cmd.plan(replace(tiny, dtype="int8"))
    # a GPU whose memory holds no Fast-dLLM request: one line naming it, before anything loads
    _fake_gpu(monkeypatch, 19 * GiB, "NVIDIA GeForce RTX 4090")
    with pytest.raises(UserError, match="fast-dllm cannot run one request"):
        cmd.plan(CalibrateOptions(preset="paper", model=_llada_8b_dir(tmp_path, monkeypatch), device="cuda",
                                  systems="llada,fast-dllm"))


def test_calibrate_on_cuda_loads_the_model_in_bf16_after_stating_the_plan(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from dllm_bench.simulate.calibrate import run as cmd

    class Loaded(Exception):
        pass

    def load(path, dtype, device):
        raise Loaded(dtype, device)

    _fake_gpu(monkeypatch, 79 * GiB)
    monkeypatch.setattr(cmd, "load_model", load)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    out = io.StringIO()
    with pytest.raises(Loaded) as e:
        cmd.calibrate(CalibrateOptions(preset="paper", model=_llada_8b_dir(tmp_path, monkeypatch), device="cuda",
                                       systems="engine,fast-dllm", name="h", out=tmp_path / "h.json", repeats=1),
                      Console(file=out, width=400))
    assert e.value.args == (torch.bfloat16, torch.device("cuda"))
    text = out.getvalue()
    assert "NVIDIA H100" in text and "bfloat16 on cuda" in text and "fast-dllm at 1, 2, 4, 8, 16, 1" in text
    assert "each batch warmed 8 steps, then 32 timed" in " ".join(text.split())


def test_attention_is_timed_through_the_engines_own_call(monkeypatch):
    from engine import attention

    calls = []
    real = attention.padded_attention

    def padded(q, k, v, bias):
        calls.append((q.shape, k.shape, v.shape, bias))
        return real(q, k, v, bias)

    monkeypatch.setattr(attention, "padded_attention", padded)
    ops = cal.measure_ops(SMALL, torch.float32, 1, device="meta")
    attn = [s for s in ops if s.kind == "attn"]
    assert attn and len(calls) == 2 * len(attn)                 # untimed + timed, each through the engine
    for (qs, ks, vs, bias), s in zip(calls[::2], attn):
        assert qs == (1, s.a, SMALL.heads, SMALL.head_dim) and ks == vs == (1, s.b, SMALL.kv_heads, SMALL.head_dim)
        assert bias is None                                     # one group, every key real
    # where the engine would use a packed varlen kernel, that is what is timed: packed 3-D rows
    packed = []

    class Kernel:
        def __init__(self, backend):
            self.backend = backend

        def __call__(self, q, k, v, cu_q, cu_k, max_q, max_k):
            packed.append((self.backend, q.shape, k.shape, tuple(cu_q.shape), max_q, max_k))

    monkeypatch.setattr(attention, "choose_backend", lambda name, dev, dtype=None: attention.BackendChoice("varlen", ""))
    monkeypatch.setattr(attention, "PackedKernel", Kernel)
    fn = cal.engine_attention(8, 32, SMALL, torch.float32, "meta")
    fn()
    assert packed == [("varlen", (8, SMALL.heads, SMALL.head_dim), (32, SMALL.kv_heads, SMALL.head_dim), (2,), 8, 32)]


def test_each_timed_size_frees_its_system_before_the_next(monkeypatch):
    import gc
    import weakref

    from dllm_bench.simulate.calibrate import host as host_profile
    from engine.config import EngineConfig
    from engine.sampling import SamplingParams
    from tests.helpers import random_prompts, tiny_model

    built = []
    real = host_profile.plain_engine
    monkeypatch.setattr(host_profile, "plain_engine", lambda m, c: built.append(weakref.ref(e := real(m, c))) or e)
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    model = tiny_model(torch.float32)
    shape = ModelShape.from_config(model.config, 4)
    cfg = EngineConfig(device="cpu", attention_backend="sdpa", sampling=False, kv_pool_tokens=512)
    params = SamplingParams(gen_length=8, steps=8, block_length=4)
    gc.disable()                  # only the calibration's own collection may free the engine
    try:
        for n in (2, 1):
            host_profile.engine_steps(model, cfg, shape, random_prompts(n, 6), params)
            assert built[-1]() is None
    finally:
        gc.enable()
    assert not emptied                                           # a CPU has no allocator cache to return
    host_profile.release(torch.device("cuda:0"))
    assert emptied == [1]
