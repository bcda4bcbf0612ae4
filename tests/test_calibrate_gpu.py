"""`calibrate --device cuda` times a GPU as a GPU (mode.GPU): operators by CUDA events after
warm-up, no CPU speed gauge (the GPU's clocks through NVML instead, or a line saying none were
read), each batch warmed on its own shapes and timed for a bounded number of steps, sizes ascending
until rows/s saturate, and a host fit that says which terms it could not resolve. No GPU here:
the GPU mode runs on the CPU with CUDA's events faked."""
from __future__ import annotations

import io
import json
import sys
import time
import types
from dataclasses import replace

import pytest
import torch
from rich.console import Console

from dllm_bench.serve import speed_gauge
from dllm_bench.simulate import drift
from dllm_bench.simulate.calibrate import host as host_time
from dllm_bench.simulate.calibrate import mode as timing
from dllm_bench.simulate.calibrate import run as cmd
from dllm_bench.simulate.calibrate.clocks import open_clocks
from dllm_bench.simulate.cost_model import (
    CostModel,
    Efficiency,
    Forward,
    HostCost,
    LayerPass,
    ModelShape,
    Seg,
)
from dllm_bench.simulate.implementations import get_impl


class FakeEvent:
    """torch.cuda.Event on the host's clock: record() stamps, elapsed_time() in ms."""

    made = 0

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        FakeEvent.made += 1
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3


def _fake_cuda_events(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


def test_a_gpu_operator_is_timed_by_events_after_warm_up(monkeypatch):
    _fake_cuda_events(monkeypatch)
    FakeEvent.made = 0
    calls = []
    t = timing.GPU.timer("cuda:0")(lambda: calls.append(1), 5)
    assert t >= 0 and len(calls) == timing.CUDA_WARMUP + 5 and FakeEvent.made == 2 * 5
    assert timing.mode_for("cuda:0") is timing.GPU and timing.mode_for("cpu") is timing.CPU
    assert not timing.GPU.gauge and timing.GPU.events and timing.CPU.gauge and not timing.CPU.events


class FakeNVML(types.ModuleType):
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

    def __init__(self, sm=(1980, 1980, 1700)):
        super().__init__("pynvml")
        self.sm, self.n = list(sm), 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetClockInfo(self, h, kind):
        if kind == self.NVML_CLOCK_MEM:
            return 2619
        self.n += 1
        return self.sm[min(self.n - 1, len(self.sm) - 1)]

    def nvmlDeviceGetTemperature(self, h, kind):
        return 50

    def nvmlDeviceGetPowerUsage(self, h):
        return 300_000


def test_a_gpus_clocks_are_read_through_nvml_or_the_calibration_says_none_were(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)             # not installed
    clocks, why = open_clocks("cuda:0")
    assert clocks is None and "pynvml is not installed" in why
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    clocks, why = open_clocks("cuda:0")
    assert why == "" and len(clocks.readings) == 1
    clocks.read()
    clocks.read()
    s = clocks.summary()
    assert s["readings"] == 3 and s["sm_mhz"] == [1700, 1980, 1980] and s["dropped"]    # 1700 < 0.9 x 1980
    assert "SM 1980 MHz (1700–1980)" in clocks.line()


def _gpu_mode_on_this_cpu(monkeypatch, **mode):
    """calibrate's plan with the GPU mode (smaller step counts), CUDA events faked, and the speed
    gauge made to fail if anything reads it."""
    _fake_cuda_events(monkeypatch)

    def no_gauge(*a, **k):
        raise AssertionError("the CPU speed gauge read on a GPU")

    monkeypatch.setattr(speed_gauge, "SpeedGauge", no_gauge)
    monkeypatch.setattr(drift, "bracketed", no_gauge)
    real = cmd.plan
    monkeypatch.setattr(cmd, "plan", lambda o: replace(real(o), mode=replace(timing.GPU, **mode)))


def test_calibrate_in_gpu_mode_never_reads_the_speed_gauge(tmp_path, monkeypatch):
    _gpu_mode_on_this_cpu(monkeypatch, warm_steps=3, timed_steps=6)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    FakeEvent.made = 0
    stepped = []
    real_steps = host_time._timed_steps

    def counted(*a, **k):
        out = real_steps(*a, **k)
        stepped.append((k.get("max_steps", a[5] if len(a) > 5 else None), len(out)))
        return out

    monkeypatch.setattr(host_time, "_timed_steps", counted)
    out = io.StringIO()
    path = cmd.calibrate(cmd.CalibrateOptions(preset="tiny", device="cpu", systems="engine,sparse-dllm", name="g",
                                              out=tmp_path / "g.json", repeats=1, sizes="1,2"),
                         Console(file=out, width=300))
    text = " ".join(out.getvalue().split())
    assert FakeEvent.made > 0                                       # operators timed by (fake) CUDA events
    assert "changed by" not in text and "speed gauge" not in text
    assert "GPU clocks over" in text and "warmed 3 steps, then 6 timed" in text
    # every batch warmed on its own prompts for 3 steps, then timed for at most 6
    assert stepped and all(n <= cap for cap, n in stepped) and {cap for cap, _ in stepped} == {3, 6}
    fit = json.loads(path.read_text())["fit"]
    assert fit["timing"] == "gpu" and "speed_gauge_s" not in fit and fit["clocks"]["readings"] >= 4
    assert fit["sizes_by_system"] == {"engine": [1, 2], "sparse-dllm": [1, 2]}
    assert all(h["steps"] <= 12 for h in fit["host"].values())


def test_ascending_sizes_stop_where_rows_per_second_saturate(monkeypatch):
    # rows/s 100, 190, 300, 310 at 1, 2, 4, 8 concurrent: 8 is within 5 % of 4, so 16 is never timed
    rate = {1: 100.0, 2: 190.0, 4: 300.0, 8: 310.0, 16: 320.0}
    timed = []

    def fake(v, n, mdl, pl, prompts):
        timed.append(n)
        return [(Forward((LayerPass(1, (Seg(n, n),)),), n_seq=n), n / rate[n])]

    monkeypatch.setattr(cmd, "timed_steps", fake)
    from dllm_bench.systems.spec import parse_system

    pl = types.SimpleNamespace(workload=[types.SimpleNamespace(prompt_ids=[1])] * 16, mode=timing.GPU,
                               sizes={parse_system("engine"): (1, 2, 4, 8, 16)}, default_sizes=True, params=None,
                               device=torch.device("cpu"))
    out = io.StringIO()
    batches, wakes = cmd._time_host(pl, None, None, Console(file=out, width=300))
    assert timed == [1, 2, 4, 8] and not wakes
    assert "saturated, larger batches not timed" in out.getvalue()
    pl.default_sizes = False                        # sizes the user asked for are all timed
    timed.clear()
    cmd._time_host(pl, None, None, Console(file=io.StringIO()))
    assert timed == [1, 2, 4, 8, 16]


def test_a_host_term_fitted_to_its_bound_is_unresolved_not_zero():
    shape = ModelShape(d=64, layers=2, heads=4, kv_heads=4, head_dim=16, ffn=128, vocab=512, wbytes=4)
    dev = CostModel(shape, 1e12, 1e11, Efficiency(), get_impl("engine"), HostCost())
    truth = HostCost(c_seq=2e-3)          # no per-step or per-row cost: the fit puts them at 0
    fws = [Forward((LayerPass(2, (Seg(q, 40),) * n),), rows=8 * n, n_seq=n) for n in (1, 2, 4, 8) for q in (8, 40)]
    steps = [(fw, dev.step(fw).t_device + truth.time(fw.n_seq, 2, fw.query_tokens)) for fw in fws]
    captured = replace(fws[0], capture=True)
    steps.append((captured, dev.step(captured).t_device + truth.time(1, 2, 8) + 0.25))   # a graph capture
    h, fit = host_time.fit_host(steps, dev)
    assert h.c_seq == pytest.approx(2e-3, rel=1e-3) and "c_step" in fit["unresolved"]
    assert fit["captures"] == 1 and h.c_capture == pytest.approx(0.25, rel=1e-3)
    text = cmd.host_terms(h, fit["unresolved"])
    assert "– ms/step (unresolved)" in text and "2.000 ms/sequence" in text and "0.00 ms/step" not in text
