"""The docs' tables that dllm_bench.report renders besides the report's own: the scheduler
comparison over several simulate runs (report.scheduler), the memory table over several memory
runs (report.memory) and the benchmark scripts' summaries (report.benchmarks), each from fixture
run directories with known figures, through a doc's named-table block (`TABLE GLOB`); and the
scripts' run directory seam (benchmarks/bench_result.py). No model runs."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from benchmarks import bench_result
from dllm_bench import results
from dllm_bench.report import benchmarks as bench
from dllm_bench.report import current
from dllm_bench.report import scheduler as sch
from tests.helpers import run_cli

LOOK = "engine:cache=sparse,scheduler=lookahead"


def _sim_run(root: Path, run_id: str, tokens: int, decoding: str, cells: dict) -> Path:
    """A simulate run of phase against look-ahead: cells[(dataset, rps)] = (phase stalls, steps,
    look-ahead's (mean E2EL, p99 E2EL, tok/s) over phase's (10 s, 20 s, 100 tok/s))."""
    cfg = {"hardware": {"name": "l40s", "kind": "gpu"}, "validation_label": "not validated on real hardware",
           "preset": {"name": "paper", "dtype": "bfloat16"}, "num_prompts": 2000, "datasets": ["livebench", "osc"],
           "rps": [0.5, 0.8], "engine_defaults": {"max_num_batched_tokens": tokens}, "decoding": decoding,
           "systems": [{"label": "engine:cache=sparse"}, {"label": LOOK}]}
    d = results.create_run("simulate", cfg, run_id=run_id, root=root)
    for (ds, rps), (stalls, steps, (mean, p99, tps)) in cells.items():
        for system, sched in (("engine:cache=sparse", "phase"), (LOOK, "lookahead")):
            ref = sched == "phase"
            s = {"system_name": "engine", "decoding": decoding, "output_throughput": 100.0 if ref else tps,
                 "mean_e2el_ms": 1e4 if ref else mean * 1e3, "p99_e2el_ms": 2e4 if ref else p99 * 1e3,
                 "engine_config": {"scheduler": sched, "max_num_batched_tokens": tokens},
                 "stats": {"stalled_steps": stalls if ref else 0, "stalled_requests": 3 * stalls if ref else 0,
                           "deferred_requests": 0 if ref else 2 * stalls, "steps": steps}}
            results.write_point(d, results.PointKey(system, rps, ds), s, [])
    return d


def _doc(root: Path, head: str, pending: bool = False) -> Path:
    doc = root / "docs" / "X.md"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(f"# X\n\n{current.OPEN} {head}{current.PENDING if pending else ''} -->\nhand\n{current.CLOSE}\n")
    return doc


def test_scheduler_table_over_several_runs_through_a_named_block(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "results" / "current"
    _sim_run(runs, "scheduler-a", 16384, "fixed", {("livebench", 0.5): (0, 1000, (10.0, 20.0, 100.0)),
                                                   ("osc", 0.8): (35, 6600, (10.1, 19.9, 100.0))})
    _sim_run(runs, "scheduler-b", 4000, "threshold:0.9", {("livebench", 0.5): (7, 100, (9.9, 21.0, 101.0)),
                                                          ("osc", 0.8): (70, 100, (10.0, 20.0, 100.0))})
    doc = _doc(tmp_path, "scheduler results/current/scheduler-*", pending=True)
    r = run_cli(monkeypatch, capsys, "report", "--docs", str(doc))
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert "hand" not in text and current.PENDING not in text and "scheduler results/current/scheduler-*" in text
    assert text.count("run `scheduler-") == 2 and "**simulated** on l40s" in text and "decoding threshold:0.9" in text
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in text.splitlines()
            if r.startswith("| l40s")}
    # setting: cells, phase's most stalled cell (its share), look-ahead's stalls and planned waits, the changes.
    assert rows["l40s, 16,384, fixed"] == ["2", "35 (0.53 %)", "0", "70", "+0.00 … +1.00 %", "-0.50 … +0.00 %", "+0.00 %"]
    assert rows["l40s, 4,000, threshold:0.9"] == ["2", "70 (70.00 %)", "0", "140", "-1.00 … +0.00 %", "+0.00 … +5.00 %",
                                                  "+0.00 … +1.00 %"]
    # The cell tables (benchmarks/scheduler_table.py) from the same rows: one per setting.
    cells = sch.cell_tables(sch.point_rows(sorted(runs.glob("scheduler-*"))))
    assert len(cells) == 2 and all(len(t) == 2 for t in cells.values())
    assert any("threshold:0.9" in title for title in cells)
    # Two systems on the phase scheduler: no reference, one error line.
    with pytest.raises(ValueError, match="phase scheduler"):
        sch.summary(sch.point_rows([runs / "scheduler-a"]).assign(scheduler="phase"))


def _memory_run(root: Path, run_id: str, model: str, systems: list[dict], derive: bool) -> Path:
    cfg = {"systems": [{"label": s["system"], "knobs": s.pop("knobs", {})} for s in systems],
           "max_length": 2048, "resolution": 128}
    d = results.create_run("memory", cfg, run_id=run_id, root=root)
    doc = {"model": model, "dtype": "float32", "device": "cpu", "budget_bytes": 8 * 2**20, "trained_length": 4096,
           "length": 2048, "systems": systems}
    if derive:
        doc["derive"] = {"model": "llada-8b", "dtype": "bfloat16", "budget_bytes": 24 * 2**30}
    results.atomic_write_json(d / "summary.json", doc)
    return d


def _sys(system: str, longest: int, nxt: int | None, ratio: float, knobs: dict | None = None, **extra) -> dict:
    return {"system": system, "knobs": knobs or {}, "search": {"max_length": longest, "first_failing": nxt},
            "profile": {"length": 2048, "stats": {"steps": 4, "peak_to_average": ratio,
                                                  "dynamic_peak_to_average": ratio + 0.5}}, **extra}


def test_memory_table_joins_runs_by_system_and_drops_a_column_of_caps(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "results" / "current"
    _memory_run(runs, "memory-a", "tiny", [
        _sys("engine", 13312, 13440, 1.1, cache="auto", max_num_batched_tokens=256),
        _sys("fast-dllm", 640, 768, 3.26)], derive=False)
    _memory_run(runs, "memory-b", "similar-1024", [
        _sys("engine:max_num_batched_tokens=1024", 2048, None, 1.03, {"max_num_batched_tokens": 1024}, cache="auto",
             max_num_batched_tokens=1024, derived={"max_length": 143950, "bytes_per_token": 59e3,
                                                   "dynamic_peak_to_average": 1.06, "mode": "none"}),
        _sys("fast-dllm", 2048, None, 1.34, derived={"max_length": 3477, "bytes_per_token": 2.8e6,
                                                     "dynamic_peak_to_average": 2.5})], derive=True)
    doc = _doc(tmp_path, "memory results/current/memory-*")
    assert run_cli(monkeypatch, capsys, "report", "--docs", str(doc)).returncode == 0
    text = doc.read_text()
    head = next(r for r in text.splitlines() if r.startswith("| system"))
    assert "`tiny` at 8 MiB (measured)" in head and "similar-1024` at" not in head.split("derived")[0]
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in text.splitlines()
            if r.startswith("| engine") or r.startswith("| fast")}
    # One engine row from both runs (the budgets are each run's); measured, derived, bytes/token, ratios.
    assert list(rows) == ["engine (cache=auto, the default)", "fast-dllm"]
    assert rows["engine (cache=auto, the default)"] == ["13,312", "143,950 (none)", "59 K", "1.10 · 1.60",
                                                        "1.03 · 1.53", "1.06"]
    assert rows["fast-dllm"] == ["640", "3,477", "2.80 M", "3.26 · 3.76", "1.34 · 1.84", "2.50"]
    assert "(every system reached it)" in text                   # the capped run says so in its line
    assert "13,312 / 640 = 20.8x" in text and "143,950 / 3,477 = 41.4x" in text
    assert "2,048 / 2,048" not in text                           # no measured ratio against a capped search


MECH = {"memory": {"budgeted": {"refresh_peak": 1017 * 2**20, "kv_pool_tokens": 2158661, "fit": 8994},
                   "monolithic": {"refresh_peak": 4030 * 2**20, "kv_pool_tokens": 1382174, "fit": 5759}},
        "reuse_attention": {"dense": 2.41, "sparse": 0.351, "context": 2048, "requests": 8, "retention": 0.1},
        "bookkeeping": {"total": 10.0, "bookkeeping": 0.19, "requests": 32}}
ENGINE = {"throughput": {"reference_s": 10.0, "engines": [{"cache": "none", "seconds": 7.874, "same": "8/8"},
                                                          {"cache": "sparse", "seconds": 2.653, "same": "5/8"}]},
          "mfu": {"float32": {"mfu": 0.768, "mfu_refresh": 0.807, "peak": 226.1e9, "tokens_per_s": 10.0},
                  "bfloat16": {"mfu": 0.35, "peak": 996.3e9, "tokens_per_s": 30.3}},
          "host": {"sparse": {"1": {"other_ms": 0.5}, "64": {"other_ms": 1.5}}},
          "ops": {"sparse": {"ops": {"1": 2280, "8": 4338, "64": 4338}, "syncs": {"1": 1, "8": 1, "64": 1},
                             "graph_breaks": 0},
                  "dual": {"ops": {"1": 2280, "8": 2760, "64": 2732}, "syncs": {"1": 1, "8": 1, "64": 3},
                           "graph_breaks": 0}}}
SERVER = {"runs": [{m: {"requests": 2000, "wall_s": 4.0, "server_cpu_s": c} for m, c in (("whole", w), ("streamed", s))}
                   for w, s in ((2.52, 3.38), (2.40, 3.12), (2.62, 3.46))]}


def _cells(text: str, measure: str) -> list[str]:
    row = next(r for r in text.splitlines() if r.startswith(f"| {measure}"))
    return [c.strip() for c in row.split("|")[2:-1]]


def test_benchmark_tables_carry_their_figures_and_goals():
    cfg = {"tokens": 8192, "model": "mini-126k", "logit_rows": 1024, "budget_gib": 10.0}
    t = bench.mechanisms(cfg, MECH)
    assert _cells(t, "peak activation") == ["1,017 MiB", "4,030 MiB", "**3.96×** lower", "≥ 8×: missed"]
    assert _cells(t, "KV pool")[2:] == ["**1.56×** more", "≥ 2×: missed"]
    assert _cells(t, "Reuse-step")[2:] == ["**6.9×** faster", "≥ 3×: met"]
    assert _cells(t, "scheduler + bookkeeping") == ["1.9 %", "", "", "< 5 %: met"]
    t = bench.engine({"preset": "tiny", "prompts": 8, "mfu_preset": "similar-1024"}, ENGINE)
    assert _cells(t, "throughput") == ["none (exact, 8/8 equal) **1.27×**, sparse **3.77×**", "–"]
    assert _cells(t, "MFU, float32")[1] == "≥ 50 %: met" and "Refresh 80.7 %" in _cells(t, "MFU, float32")[0]
    assert _cells(t, "MFU, bfloat16")[1] == "≥ 40 %: missed"
    assert _cells(t, "bf16 / fp32")[0].startswith("**3.03×**")
    assert _cells(t, "host syncs") == ["**1 / 1 / 1** sparse, **1 / 1 / 3** dual", "≤ 2: missed"]
    assert _cells(t, "operator calls")[1] == "≤ 1.2: met for dual"
    emulated = {"mfu": {"float32": ENGINE["mfu"]["float32"]}}
    t = bench.engine({"mfu_preset": "similar-1024", "bf16_native": []}, emulated)
    assert _cells(t, "MFU, bfloat16")[0].startswith("skipped: emulated") and "bf16 / fp32" not in t
    assert "MFU, bfloat16" not in bench.engine({"mfu_preset": "similar-1024"}, emulated)  # asked for float32 only
    t = bench.engine({}, {"ops": ENGINE["ops"]})                 # skipped sections: no rows
    assert "MFU" not in t and "throughput" not in t and "graph breaks" in t
    t = bench.server({"requests": 2000, "concurrency": 32, "server_core": 0, "client_core": 1}, SERVER)
    assert _cells(t, "server CPU per request, whole") == ["1.26 (1.20–1.31) ms = **794 req/s per core**",
                                                          "≥ 500 req/s: met"]
    assert "3 runs" in t and _cells(t, "requests/s the client saw, streamed")[0] == "500"


def test_a_script_writes_its_run_directory_and_the_docs_render_its_table(tmp_path, monkeypatch, capsys):
    a = argparse.Namespace(result_dir=str(tmp_path / "runs"), run_id="srv", json=False)
    bench_result.check(a)
    run_dir = bench_result.save("bench-server", a, {"requests": 2000, "concurrency": 32, "server_core": 0,
                                                    "client_core": 1}, SERVER)
    out = capsys.readouterr()
    assert "794 req/s per core" in out.out and str(run_dir) in out.err
    assert sorted(f.name for f in run_dir.iterdir()) == ["config.json", "summary.json"]
    assert results.load_config(run_dir)["kind"] == "bench-server"
    monkeypatch.chdir(tmp_path)
    doc = _doc(tmp_path, "results/current/srv", pending=True)
    assert run_cli(monkeypatch, capsys, "report", "--keep", "runs/srv", "--docs", "docs").returncode == 0
    text = doc.read_text()
    assert "`make bench-server` run `srv`" in text and bench.table_of(run_dir).strip() in text
    # An existing run id, or one that is not a plain name: one error line before anything runs.
    for rid in ("srv", "a/b"):
        with pytest.raises(SystemExit) as e:
            bench_result.check(argparse.Namespace(result_dir=str(tmp_path / "runs"), run_id=rid))
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:")


def test_a_named_table_refuses_an_unknown_name_and_runs_of_another_kind(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "results" / "current"
    _memory_run(runs, "memory-a", "tiny", [_sys("engine", 1, 2, 1.0)], derive=False)
    for head, msg in (("nosuch results/current/memory-*", "no table named 'nosuch'"),
                      ("scheduler results/current/memory-*", "reads simulate runs")):
        doc = _doc(tmp_path, head)
        r = run_cli(monkeypatch, capsys, "report", "--docs", str(doc))
        assert r.returncode == 2 and msg in r.stderr and "hand" in doc.read_text(), r.stderr
    assert re.search(r"^\* `dllm-bench memory` run `memory-a`", current.render(runs / "memory-*", "memory"), re.M)
    assert json.loads((runs / "memory-a" / "summary.json").read_text())["model"] == "tiny"
