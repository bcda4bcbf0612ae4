"""`dllm-bench calibrate` on the device it is given: the device check, timings that wait for the
device, every operand of the timed operators on that device, and a calibrated profile that
simulates the code it timed. No GPU here: the device is checked against a patched CUDA, and the
operands' devices are read off a device that runs nothing (`meta`)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.serve.speed_gauge import SpeedGauge, device_sync, median_time
from dllm_bench.simulate import calibrate as cal
from dllm_bench.simulate import hardware
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.implementations import default_impl

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


TIMED = ("matmul", "__matmul__", "scaled_dot_product_attention", "copy_")


class Operands(TorchFunctionMode):
    """The devices of every tensor handed to a matmul or an attention call."""

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


def test_calibrate_on_a_device_this_machine_lacks_is_one_line_exit_2(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "hw.json"
    for dev in ("cuda", "npu"):
        r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "calibrate", "--preset", "tiny", "--device", dev,
                            "--out", str(out)], capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and "--device" in lines[0]
    # the paper preset profiles a GPU: here that is the same clear line, not a CPU profile
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "calibrate", "--preset", "paper", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "CUDA is not available" in r.stderr
    assert not out.exists()


def test_a_profile_naming_an_unknown_implementation_is_refused(tmp_path):
    bad = tmp_path / "hw.json"
    bad.write_text(json.dumps({"name": "x", "kind": "gpu", "peak_flops": 1e14, "bandwidth": 1e12,
                               "memory_bytes": 1e10, "impl": "vllm"}))
    with pytest.raises(UserError, match="'impl' must be one of"):
        hardware.load(str(bad))


def test_default_sizes_follow_the_presets_concurrency_and_device():
    from dllm_bench.commands.calibrate import default_sizes
    from dllm_bench.serve.presets import PRESETS

    assert default_sizes(PRESETS["cpu-default"], "cpu") == (1, 2)           # 2 requests per point
    assert default_sizes(PRESETS["tiny"], "cpu") == (1, 4, 2, 8)
    assert default_sizes(PRESETS["paper"], "cuda") == (1, 4, 16, 64, 2, 8, 32)
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
