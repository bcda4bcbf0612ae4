"""Measurement side of `dllm-bench serve`: metrics, ratio table, results dirs, plots, driver.
Engine-independent: the driver runs against a fake system with the serving interface."""
from __future__ import annotations

import io
import json
import math
import time
from types import SimpleNamespace

import pandas as pd
import pytest
from rich.console import Console

from dllm_bench import plots, results
from dllm_bench.metrics import serving as metrics
from dllm_bench.serve import loadgen as driver
from dllm_bench.serve import summary as summary_print
from tests.results_helpers import load_metrics

# ---------------------------------------------------------------- metrics (hand-computed)
# Four requests, times in seconds:  arrival admitted first  finished prompt out
REQS = [("r0", 0.0, 0.5, 1.0, 2.0, 10, 32),
        ("r1", 1.0, 1.0, 2.0, 4.0, 20, 32),
        ("r2", 2.0, 3.0, 4.5, 7.0, 30, 64),
        ("r3", 3.0, 5.0, 7.0, 13.0, 40, 64)]


def _records():
    return [dict(request_id=r, arrival_time=a, admitted_time=ad, first_token_time=f,
                 finished_time=fi, prompt_len=p, output_len=o, nfe=o, logits_rows=o * 2)
            for r, a, ad, f, fi, p, o in REQS]


def test_metrics_hand_computed():
    m = metrics.compute_metrics(_records(), 13.0, rejected=[{"request_id": "r4"}],
                                stats={"forwards": 48, "logits_rows": 1000, "peak_kv_bytes": 4096,
                                       "max_logits_rows_in_step": 64})
    assert (m["completed"], m["rejected"], m["failed"], m["duration_s"]) == (4, 1, 1, 13.0)
    assert m["total_input_tokens"] == 100 and m["total_output_tokens"] == 192
    assert m["request_throughput"] == pytest.approx(4 / 13)
    assert m["output_throughput"] == pytest.approx(192 / 13)
    assert m["total_token_throughput"] == pytest.approx(292 / 13)
    # E2EL = 2, 3, 5, 10 s. Population std (ddof=0, vLLM's np.std): sqrt(38e6 / 4).
    # Percentiles use linear interpolation: p90 at rank 0.9*3 = 2.7 -> 5000 + 0.7*5000.
    assert m["mean_e2el_ms"] == pytest.approx(5000)
    assert m["median_e2el_ms"] == pytest.approx(4000) == m["p50_e2el_ms"]
    assert m["std_e2el_ms"] == pytest.approx(math.sqrt(9.5e6)) == m["latency_std_ms"]
    assert m["p90_e2el_ms"] == pytest.approx(8500)
    assert m["p99_e2el_ms"] == pytest.approx(9850)
    assert m["latency_span_ms"] == pytest.approx(8000)
    # TTFT = 1, 1, 2.5, 4 s
    assert m["mean_ttft_ms"] == pytest.approx(2125)
    assert m["median_ttft_ms"] == pytest.approx(1750)
    assert m["std_ttft_ms"] == pytest.approx(math.sqrt(1546875))
    assert m["p99_ttft_ms"] == pytest.approx(2500 + 0.97 * 1500)
    # queue = 0.5, 0, 1, 2 s
    assert m["mean_queue_ms"] == pytest.approx(875)
    assert m["median_queue_ms"] == pytest.approx(750)
    assert m["p99_queue_ms"] == pytest.approx(1970)
    # TPOT = (e2el - ttft) / (out - 1)
    assert m["mean_tpot_ms"] == pytest.approx(1000 * (1 / 31 + 2 / 31 + 2.5 / 63 + 6 / 63) / 4)
    # dLLM counters: system stats win over per-request sums
    assert m["forwards"] == 48 and m["tokens_per_forward"] == pytest.approx(4.0)
    assert m["logits_rows"] == 1000 and m["max_logits_rows_in_step"] == 64
    assert m["peak_kv_bytes"] == 4096 and m["peak_memory_bytes"] is None
    assert m["mean_nfe"] == pytest.approx(48)
    json.dumps(m)  # flat and JSON-serializable


def test_metrics_empty_and_objects():
    m = metrics.compute_metrics([], 0.0, rejected=2)
    assert m["completed"] == 0 and m["rejected"] == 2 and m["mean_e2el_ms"] is None
    assert m["request_throughput"] is None and m["latency_span_ms"] is None
    # RequestOutput-like objects with id lists and no first_token_time
    out = SimpleNamespace(request_id="a", prompt_ids=[1, 2, 3], token_ids=[5] * 8, nfe=4,
                          arrival_time=10.0, admitted_time=10.0, first_token_time=None,
                          finished_time=10.5, logits_rows=None, kv_tokens=11, kv_bytes=None)
    m = metrics.compute_metrics([out], 1.0)
    assert m["total_input_tokens"] == 3 and m["total_output_tokens"] == 8
    assert m["mean_e2el_ms"] == pytest.approx(500) and m["mean_ttft_ms"] is None


def test_ratio_table_best_baseline():
    s = {"A": dict(request_throughput=1.0, output_throughput=100, mean_e2el_ms=1000,
                   latency_std_ms=100, latency_span_ms=500),
         "B": dict(request_throughput=2.0, output_throughput=200, mean_e2el_ms=800,
                   latency_std_ms=200, latency_span_ms=1000),
         "E": dict(request_throughput=3.0, output_throughput=300, mean_e2el_ms=400,
                   latency_std_ms=50, latency_span_ms=250)}
    rt = metrics.ratio_table(s, ["A", "B"])
    assert rt.attrs["best_baseline"] == "B" and (rt["best_baseline"] == "B").all()
    assert rt.loc["E", "output_throughput_x"] == pytest.approx(1.5)
    assert rt.loc["E", "mean_e2el_ms_x"] == pytest.approx(2.0)  # latency: best / system
    assert rt.loc["E", "latency_std_ms_x"] == pytest.approx(4.0)
    assert rt.loc["E", "latency_span_ms_x"] == pytest.approx(4.0)
    assert rt.loc["A", "request_throughput_x"] == pytest.approx(0.5)
    assert rt.loc["B", "output_throughput_x"] == pytest.approx(1.0)
    assert rt.loc["E", "p99_e2el_ms_x"] is None  # missing metric -> no ratio, no crash
    buf = io.StringIO()
    summary_print.print_comparison(s, ["A", "B"], console=Console(file=buf, width=200))
    assert "best baseline" in buf.getvalue() and "4.00" in buf.getvalue()


def test_summary_block_format():
    m = metrics.compute_metrics(_records(), 13.0, stats={"forwards": 48})
    text = summary_print.format_summary({"system": "engine", **m})
    lines = text.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[-1] == "=" * 50
    assert "{:<40} {:<10}".format("Successful requests:", 4) in lines
    assert "{:<40} {:<10.2f}".format("Mean E2EL (ms):", 5000) in lines
    assert "{:<40} {:<10.2f}".format("Tokens per forward:", 4.0) in lines
    assert any(line.startswith("-") and "Diffusion Decoding" in line for line in lines)
    assert not any("HTTP" in line for line in lines)           # an in-process system has no HTTP rows
    served = summary_print.format_summary({"system": "x@url", **m, "http_overhead_median_ms": 6.0,
                                           "http_overhead_max_ms": 8.0}).splitlines()
    assert "{:<40} {:<10.2f}".format("Median time HTTP added (ms):", 6.0) in served


# ---------------------------------------------------------------- results dirs
def test_atomic_write_no_partial_file(tmp_path):
    target = tmp_path / "summary.json"
    with pytest.raises(RuntimeError):
        with results.atomic_open(target) as f:
            f.write('{"half": ')
            raise RuntimeError("writer died")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    results.atomic_write_json(target, {"ok": 1, "rate": math.inf, "x": float("nan")})
    with pytest.raises(KeyboardInterrupt):
        with results.atomic_open(target) as f:
            f.write("garbage")
            raise KeyboardInterrupt
    assert json.loads(target.read_text()) == {"ok": 1, "rate": "inf", "x": None}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_run_dir_points_resume_latest(tmp_path):
    cfg = {"rps": [0.5, 1.0], "systems": ["engine", "fast-dllm"], "seed": 0}
    run = results.create_run("sweep", cfg, name="tiny sweep!", root=tmp_path)
    assert run.parent == tmp_path and run.name.endswith("-tiny-sweep")
    c = results.load_config(run)
    assert c["kind"] == "sweep" and c["config"] == cfg
    assert {"python", "torch", "cpu_count", "torch_threads", "platform"} <= set(c["environment"])
    with pytest.raises(FileExistsError):
        results.create_run("sweep", cfg, run_id=run.name, root=tmp_path)

    recs = _records()
    m = metrics.compute_metrics(recs, 13.0)
    k1 = results.PointKey("engine", 0.5, "burst")
    k2 = results.PointKey("fast-dllm", 0.5, "burst")
    results.write_point(run, k1, {**m, "interrupted": False}, recs)
    results.write_point(run, k2, {**m, "interrupted": True}, recs[:1])  # partial: must re-run
    assert results.point_dir(run, k1).name == "burst__engine__rps0.5"
    assert results.finished_points(run) == {k1}
    # resume reuses the dir and keeps the original knobs
    again = results.create_run("sweep", {"other": 1}, run_id=run.name, root=tmp_path, resume=True)
    assert again == run and results.load_config(run)["config"] == cfg

    df = load_metrics(run)
    assert list(df.columns[:3]) == ["dataset", "system", "rps"] and len(df) == 2
    assert df.loc[df.system == "engine", "mean_e2el_ms"].item() == pytest.approx(5000)
    lines = results.read_jsonl(run / "requests.jsonl")
    assert len(lines) == 5 and lines[0]["system"] == "engine" and "finished_time" in lines[0]
    assert len(json.loads((run / "summary.json").read_text())["points"]) == 2

    old = results.create_run("serve", {}, run_id="20000101T000000Z-old", root=tmp_path)
    results.create_run("serve", {}, run_id="20000101T000001Z-new", root=tmp_path)
    assert results.latest_run("serve", root=tmp_path).name == "20000101T000001Z-new"
    assert results.latest_run("sweep", root=tmp_path) == run
    assert results.latest_run("ablate", root=tmp_path) is None and old.exists()


# ---------------------------------------------------------------- plots
def _fake_sweep():
    rows = []
    for ds in ("LiveBench", "Burst"):
        for sys_, speed in (("dLLM-Cache", 1.0), ("Fast-dLLM", 1.6), ("engine", 2.5)):
            for rps in (0.1, 0.25, 0.5):
                rt = min(rps, 0.2 * speed)
                rows.append(dict(dataset=ds, system=sys_, rps=rps, request_throughput=rt,
                                 output_throughput=rt * 256, mean_e2el_ms=2e4 * rps / rt + 4e4 / speed,
                                 latency_std_ms=3e4 / speed ** 2, latency_span_ms=9e4 / speed ** 2))
    return pd.DataFrame(rows)


def test_plots_write_pngs(tmp_path):
    df = _fake_sweep()
    paths = plots.plot_all(df, tmp_path / "plots", ["dLLM-Cache", "Fast-dLLM"])
    assert [p.name for p in paths] == ["throughput_vs_rps.png", "latency_vs_rps.png", "jitter.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    g = plots.jitter_gains(df, ["dLLM-Cache", "Fast-dLLM"])
    e = g[(g.system == "engine") & (g.dataset == "Burst")].iloc[0]
    assert e.best_baseline == "Fast-dLLM" and e.std_gain == pytest.approx((2.5 / 1.6) ** 2)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in paths)


# ---------------------------------------------------------------- driver with a fake system
class FakeSystem:
    """Admits everything at the next step, finishes each request after k steps (k may be a
    function of the prompt); raises
    ValueError for prompts longer than max_prompt; can raise KeyboardInterrupt at a step."""

    def __init__(self, k=3, step_sleep=0.002, max_prompt=100, interrupt_at=None):
        self.k, self.step_sleep, self.max_prompt, self.interrupt_at = k, step_sleep, max_prompt, interrupt_at
        self.waiting, self.running, self.add_clock, self.aborted = [], {}, {}, []
        self.steps = self.forwards = 0

    def add_request(self, prompt_ids, params, request_id=None, arrival_time=None):
        if len(prompt_ids) > self.max_prompt:
            raise ValueError("prompt can never fit")
        self.add_clock[request_id] = time.perf_counter()
        left = self.k(prompt_ids) if callable(self.k) else self.k
        self.waiting.append(SimpleNamespace(request_id=request_id, prompt_ids=prompt_ids, left=left,
                                            gen=params["gen_length"], arrival_time=arrival_time,
                                            admitted_time=None, first_token_time=None, nfe=0))
        return request_id

    def has_unfinished(self):
        return bool(self.waiting or self.running)

    def step(self):
        self.steps += 1
        if self.steps == self.interrupt_at:
            raise KeyboardInterrupt
        now = time.perf_counter()
        for r in self.waiting:
            r.admitted_time = now
            self.running[r.request_id] = r
        self.waiting = []
        time.sleep(self.step_sleep)
        self.forwards += 1
        done = []
        for rid, r in list(self.running.items()):
            r.left -= 1
            r.nfe += 1
            if r.first_token_time is None:
                r.first_token_time = time.perf_counter()
            if r.left == 0:
                del self.running[rid]
                done.append(SimpleNamespace(**vars(r), token_ids=[7] * r.gen, finished_time=time.perf_counter(),
                                            logits_rows=r.gen * r.nfe, kv_tokens=0, kv_bytes=0))
        return done

    def abort(self, request_id):
        self.aborted.append(request_id)
        self.running.pop(request_id, None)
        self.waiting = [r for r in self.waiting if r.request_id != request_id]

    def stats(self):
        return {"steps": self.steps, "forwards": self.forwards, "batch_sizes": []}


def _workload(n=8, gap=0.015, long_every=None):
    return [{"prompt_ids": [1] * (200 if long_every and i % long_every == 0 else 5), "gen_length": 4,
             "arrival": i * gap} for i in range(n)]


def _params(item):
    return {"gen_length": item["gen_length"]}


def test_driver_obeys_arrivals_and_records_rejections():
    fake = FakeSystem()
    fake.forwards = 100  # counters from before this point must not leak into it
    seen = []
    res = driver.run_open_loop(fake, _workload(long_every=4), _params, progress=lambda *a: seen.append(a),
                               progress_interval=0.0)
    assert not res["interrupted"] and res["unfinished"] == 0 and res["not_sent"] == 0
    assert [r["request_id"] for r in res["rejected"]] == ["req-0", "req-4"]
    assert len(res["records"]) == 6
    for r in res["records"]:
        i = int(r["request_id"].split("-")[1])
        assert r["arrival_time"] == pytest.approx(i * 0.015, abs=1e-9)  # scheduled, not observed
        assert r["admitted_time"] >= r["arrival_time"]
        assert r["finished_time"] > r["first_token_time"] >= r["admitted_time"]
        assert r["output_len"] == 4 and r["nfe"] == 3
    # handed to the system no earlier than its arrival (absolute clocks, via the fake's log)
    arr_abs = {r["request_id"]: r["arrival_time"] for r in res["records"]}
    t0 = min(fake.add_clock[k] - arr_abs[k] for k in arr_abs)
    assert all(fake.add_clock[k] >= t0 + arr_abs[k] for k in arr_abs)
    assert res["duration"] >= 7 * 0.015
    assert res["stats"]["forwards"] == fake.forwards - 100
    assert seen[-1][:2] == (8, 6) and seen[-1][2] > 0
    m = metrics.summarize(res)
    assert m["completed"] == 6 and m["rejected"] == 2 and m["tokens_per_forward"] > 0


def test_driver_keyboard_interrupt_keeps_finished():
    # all arrive at t=0; request i needs 2+i steps; Ctrl-C lands in step 4
    fake = FakeSystem(k=lambda prompt: len(prompt) - 3, interrupt_at=4)
    wl = [{"prompt_ids": [1] * (5 + i), "gen_length": 4, "arrival": 0.0} for i in range(4)]
    res = driver.run_open_loop(fake, wl, _params)
    assert res["interrupted"] is True and not res["timed_out"]
    assert [r["request_id"] for r in res["records"]] == ["req-0", "req-1"]
    assert res["unfinished"] == 2 and sorted(fake.aborted) == ["req-2", "req-3"]
    m = metrics.summarize(res)
    assert m["interrupted"] is True and m["completed"] == 2 and m["failed"] == 2


def test_driver_max_duration_aborts_remaining():
    fake = FakeSystem(k=1000, step_sleep=0.001)
    res = driver.run_open_loop(fake, _workload(n=5, gap=0.02), _params, max_duration=0.05)
    assert res["timed_out"] and not res["interrupted"] and res["records"] == []
    assert res["unfinished"] + res["not_sent"] == 5 and res["unfinished"] >= 2
    assert sorted(fake.aborted) == sorted(res["unfinished_ids"]) and not fake.has_unfinished()
    assert 0.05 <= res["duration"] < 0.5


def test_driver_with_workload_dataclass_and_engine_output_shape():
    """Items shaped like workloads.serving.ServingRequest (own request_id, `arrival`)."""
    wl = [SimpleNamespace(request_id=f"w{i}", prompt_ids=[1, 2], prompt_len=2, output_len=3,
                          arrival=0.01 * i, gen_length=4) for i in range(3)]
    res = driver.run_open_loop(FakeSystem(k=2), wl, lambda it: {"gen_length": it.gen_length})
    assert sorted(r["request_id"] for r in res["records"]) == ["w0", "w1", "w2"]
    wl[1].prompt_ids = None  # lengths-only workload: a caller error, raised before any request
    with pytest.raises(ValueError, match="prompt_ids"):
        driver.run_open_loop(FakeSystem(), wl, _params)
