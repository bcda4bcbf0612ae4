"""`dllm-bench calibrate --merge A,B,C`: the median of several calibrations of one machine as one
profile (dllm_bench.simulate.merge): medians of the efficiencies, host terms through the median
host time at each calibrated batch size, and a clear line for profiles that do not describe the
same machine and model."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from dllm_bench.errors import UserError
from dllm_bench.simulate import hardware
from dllm_bench.simulate.cost_model import Efficiency, HostCost
from dllm_bench.simulate.merge import merge

FIT = {"model": "tiny", "preset": "tiny", "dtype": "float32", "device": "cpu", "threads": 2, "sizes": [1, 2]}


def _profile(name: str, u_c: float, table: tuple, host: dict, gauge: float, peak: float = 1e11, **fit) -> hardware.Hardware:
    return hardware.Hardware(name=name, kind="cpu", peak_flops=peak, bandwidth=2e10, memory_bytes=1e10,
                             efficiency=Efficiency(u_c=u_c, u_m=0.5, u_attn=0.5, c_op=1e-5, c_attn=2e-5, u_c_by_m=table),
                             host={f"dllm-bench/{k}": HostCost(*v) for k, v in host.items()}, impl="dllm-bench",
                             fit={**FIT, "speed_gauge_s": {"operators": gauge}, **fit})


def test_merge_takes_medians_where_the_calibrations_measured():
    # The engine's host time at 1 and 2 sequences: (10, 20) ms, (30, 32) ms and (40, 78) ms. The
    # medians per size, 30 and 32 ms, give 28 ms/step + 2 ms/sequence. The medians of c_step and
    # c_seq taken apart (2 and 10 ms) would give 12 ms for one sequence, below two of the three
    # calibrations.
    a = _profile("a", 0.8, ((1, 0.1), (64, 0.6)), {"engine": (0.0, 0.010), "sparse-dllm": (0.004, 0.001)}, 1.0)
    b = _profile("b", 0.9, ((1, 0.3), (64, 0.7)), {"engine": (0.028, 0.002), "sparse-dllm": (0.006, 0.001)}, 3.0,
                 peak=3e11)
    c = _profile("c", 0.7, ((1, 0.2), (64, 0.9)), {"engine": (0.002, 0.038), "sparse-dllm": (0.002, 0.004)}, 2.0,
                 peak=2e11)
    m = merge([a, b, c], "m")
    assert (m.name, m.kind, m.impl) == ("m", "cpu", "dllm-bench")
    assert m.peak_flops == 2e11 and m.efficiency.u_c == 0.8 and m.efficiency.u_m == 0.5
    assert m.efficiency.u_c_by_m == ((1, 0.2), (64, 0.7))
    eng = m.host["dllm-bench/engine"]
    assert math.isclose(eng.c_step, 0.028) and math.isclose(eng.c_seq, 0.002)
    # Sparse-dLLM: (5, 6), (7, 8), (6, 10) ms -> medians 6 and 8 ms.
    sp = m.host["dllm-bench/sparse-dllm"]
    assert math.isclose(sp.c_step + sp.c_seq, 0.006) and math.isclose(sp.c_step + 2 * sp.c_seq, 0.008)
    assert m.fit["merged_from"] == ["a", "b", "c"] and m.fit["speed_gauge_s"] == {"profile": 2.0}
    assert m.fit["preset"] == "tiny" and m.fit["sizes"] == [1, 2]
    # The order of the calibrations does not matter.
    assert merge([c, a, b], "m").host == m.host


def test_merge_of_row_and_wake_terms_keeps_the_median_host_time_at_each_size():
    # Host time at (1, 2) sequences, each size's steps averaging 100 and 200 query rows:
    # a: 10 + 5/seq + 0.05/row -> 20, 30 ms; b: 0 + 20/seq + 0 -> 20, 40 ms; c: 2 + 1/seq + 0.1/row
    # -> 13, 24 ms. Medians 20 and 30 ms; the merged row term is the median, 0.05 ms/row.
    rows = {"engine": {"mean_rows_by_seqs": {"1": 100.0, "2": 200.0}}}
    ms = 1e-3
    a = _profile("a", 0.8, ((1, 0.1),), {"engine": (10 * ms, 5 * ms, 0.0, 0.05 * ms, 1 * ms, 0.05, 0.07 * ms)}, 1.0)
    b = _profile("b", 0.8, ((1, 0.1),), {"engine": (0.0, 20 * ms, 0.0, 0.0, 3 * ms, 0.2, 0.09 * ms)}, 1.0)
    c = _profile("c", 0.8, ((1, 0.1),), {"engine": (2 * ms, 1 * ms, 0.0, 0.1 * ms, 2 * ms, 0.1, 0.08 * ms)}, 1.0)
    for hw in (a, b, c):
        hw.fit["host"] = rows
    # The sleep lateness: its median at the durations all measured (c measured none).
    a.sleep_overshoot, b.sleep_overshoot = ((0.01, 1e-4), (0.1, 3e-4)), ((0.001, 5e-5), (0.01, 2e-4), (0.1, 2e-4))
    m = merge([a, b, c], "m")
    eng = m.host["dllm-bench/engine"]
    assert math.isclose(eng.c_row, 0.05 * ms)
    assert math.isclose(eng.wake_s, 2 * ms) and math.isclose(eng.wake_tau_s, 0.1)      # their own medians
    assert math.isclose(eng.c_add, 0.08 * ms)
    assert [dt for dt, _ in m.sleep_overshoot] == [0.01, 0.1]
    assert [late for _, late in m.sleep_overshoot] == pytest.approx([1.5e-4, 2.5e-4])
    assert math.isclose(eng.time(1, 0, 100), 20 * ms) and math.isclose(eng.time(2, 0, 200), 30 * ms)


@pytest.mark.parametrize("other, msg", [
    (dict(model="similar-1024"), "differ in model"),
    (dict(threads=1), "differ in threads"),
    (dict(host={"fast-dllm": (0.0, 0.0)}), "different systems"),
    (dict(table=((1, 0.1),)), "different row counts"),
])
def test_profiles_of_another_model_or_shape_are_refused(other, msg):
    base = dict(name="a", u_c=0.8, table=((1, 0.1), (64, 0.6)), host={"engine": (0.0, 0.01)}, gauge=1.0)
    a = _profile(**base)
    kw = {**base, "name": "b", **{k: v for k, v in other.items() if k in ("host", "table")}}
    b = _profile(**kw, **{k: v for k, v in other.items() if k not in ("host", "table")})
    with pytest.raises(UserError, match=msg):
        merge([a, b], "m")
    with pytest.raises(UserError, match="at least two"):
        merge([a], "m")
    with pytest.raises(UserError, match="not a calibration"):
        merge([a, hardware.load("h100")], "m")


def test_calibrate_merge_writes_the_profile_and_refuses_bad_input_in_one_line(tmp_path):
    host = {"engine": (0.001, 0.002)}
    for i, u in enumerate((0.6, 0.8, 0.7)):
        hardware.save(_profile(f"p{i}", u, ((1, u),), host, 1.0 + i), tmp_path / f"p{i}.json")
    files = ",".join(str(tmp_path / f"p{i}.json") for i in range(3))
    out = tmp_path / "merged.json"
    r = _cli("calibrate", "--merge", files, "--name", "merged", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    hw = hardware.load(str(out))
    assert hw.efficiency.u_c == 0.7 and hw.fit["merged_from"] == ["p0", "p1", "p2"]
    assert "host engine: 1.00 ms/step + 2.000 ms/sequence + 0.0 us/query row (median of 3 calibrations" in " ".join(r.stderr.split())
    bad = [(["--merge", str(tmp_path / "p0.json")], "at least two"),
           (["--merge", f"{tmp_path / 'p0.json'},{tmp_path / 'nope.json'}"], "--merge: no such file"),
           (["--merge", files, "--preset", "tiny"], "takes no --preset"),
           (["--merge", files, "--out", str(tmp_path / "p1.json")], "is one of the profiles merged"),
           (["--merge", files, "--out", str(tmp_path)], "is a directory")]
    for args, msg in bad:
        before = sorted(p.name for p in tmp_path.iterdir())
        r = _cli("calibrate", *args, "--name", "x")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr, r.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert json.loads((tmp_path / "p1.json").read_text())["name"] == "p1"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dllm_bench.cli", *args], capture_output=True, text=True, timeout=120)
