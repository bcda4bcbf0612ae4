"""`dllm-bench bench-gpu`: end to end on this CPU at the toy scale (every step run, summary.md
and bench.json written), bad input as one line and exit 2, and the parts a GPU run relies on
checked on data shaped like the first H100 run's: the derived figures, every goal's verdict, the
time estimates and budget, the sub-command arguments for the commands other steps call."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dllm_bench.benchgpu import derive as dv
from dllm_bench.benchgpu import estimate as est
from dllm_bench.benchgpu import goals, plan, summary
from dllm_bench.benchgpu.record import FAILED, NOT_RUN, OK, Bench, StepRecord
from dllm_bench.benchgpu.run import Options, _run_step, check_model, engine_aliases, prepare
from dllm_bench.benchgpu.scale import CPU, FULL_SYSTEMS, GPU
from dllm_bench.benchgpu.steps import profile, serve
from dllm_bench.benchgpu.subcommand import Commands
from dllm_bench.errors import UserError

NO_COMMANDS = Commands({})
GOAL_ROWS = len(goals.GOALS)


def _point(system, tok_s, dur, fwd, rows, ttft_ms, p99_ms, rps="inf", base=False, b=None, n=32, done=32):
    return {"system": system, "rps": rps, "is_baseline": base, "max_batch_size": b, "output_throughput": tok_s,
            "duration_s": dur, "total_output_tokens": round(tok_s * dur), "forwards": fwd, "query_tokens": rows,
            "mean_ttft_ms": ttft_ms, "p99_e2el_ms": p99_ms, "mean_e2el_ms": p99_ms * 0.9, "num_prompts": n,
            "completed": done, "trace_stats": None}


# The first H100 run's saturation points (paper preset, 32 requests, fixed decoding), and a
# 22 GiB regime and step profiles made up to exercise each verdict.
FULL = [_point("engine", 212.46, 38.558, 348, 665_264, 9366, 38_558),
        _point("engine:cache=dual", 300.0, 27.3, 300, 560_000, 5000, 27_300),
        _point("fast-dllm", 278.65, 29.398, 512, 546_736, 9126, 29_398, base=True, b=18),
        _point("sparse-dllm", 233.83, 35.032, 256, 835_584, 4319, 35_032, base=True, b=32)]
SMALL = [_point("engine", 474.0, 8.6, 264, 300_000, 1320, 8640, n=16, done=16),
         _point("fast-dllm", 160.0, 25.5, 2048, 200_000, 12_070, 25_530, base=True, b=2, n=16, done=16),
         _point("sparse-dllm", 268.0, 15.3, 1024, 300_000, 6330, 15_310, base=True, b=4, n=16, done=16),
         _point("engine", 180.0, 22.7, 1936, 300_000, 310, 3370, rps="1", n=16, done=16),
         _point("fast-dllm", 160.0, 25.5, 2304, 200_000, 3320, 10_620, rps="1", base=True, b=2, n=16, done=16),
         _point("sparse-dllm", 165.0, 24.7, 2304, 300_000, 1290, 7040, rps="1", base=True, b=4, n=16, done=16)]
PROFILES = [{"system": "engine", "cuda_graphs": g, "batch": b, "status": OK, "step_ms": ms}
            for g, b, ms in ((True, 1, 12.6), (False, 1, 14.0), (True, 8, 20.0), (False, 8, 21.0),
                             (True, 32, 60.0), (False, 32, 58.0))]


def _bench(tmp_path, scale=GPU, commands=NO_COMMANDS, budget=None) -> Bench:
    full, aliases = engine_aliases(FULL_SYSTEMS)
    return Bench(out=tmp_path, scale=scale, costs=est.costs(scale), commands=commands, model="llada-8b",
                 model_dir=None, full_systems=full, small_prompts=16, aliases=aliases, time_budget_s=budget)


def _record(bench: Bench, name: str, status: str = OK, **data) -> None:
    bench.records[name] = StepRecord(name, 1.0, status=status, seconds=1.0, data=data)


@pytest.fixture
def measured(tmp_path) -> Bench:
    bench = _bench(tmp_path)
    bench.aliases = {"engine:cache=sparse": "engine"}
    _record(bench, "serve-full", points=FULL, prompts=32)
    _record(bench, "serve-22g", points=SMALL, prompts=16)
    _record(bench, "profile", entries=PROFILES)
    return bench


# ------------------------------------------------------------------ derived figures and goals
def test_serve_rows_derive_the_work_and_rate_of_each_point():
    rows = {r["system"]: r for r in dv.serve_rows(FULL)}
    eng = rows["engine"]
    # The figures the first GPU run's notes give for the engine: 81 rows per token, 1,912 per forward, 17,253 rows/s.
    assert round(eng["rows_per_token"]) == 81 and round(eng["rows_per_forward"]) == 1912
    assert round(eng["rows_per_s"], -1) == 17_250 and eng["best_baseline"] == "fast-dllm"
    assert eng["x_best"] == pytest.approx(212.46 / 278.65) and rows["fast-dllm"]["x_best"] == 1.0


def test_goal_verdicts_on_measured_points(measured):
    rows = {r["goal"]: r for r in goals.evaluate(measured)}
    assert len(rows) == GOAL_ROWS
    verdict = {g: r["verdict"] for g, r in rows.items()}
    got = [verdict[g.text] for g in goals.GOALS]
    assert got == [goals.NOT_MET, goals.NOT_MET, goals.MET, goals.NOT_MET,   # 0.76x, 212 tok/s, dual 1.08x, sparse 0.91x
                   goals.MET, goals.MET, goals.MET,                            # 22 GiB: 1.77x; P99 2.09x lower; TTFT 4.2x
                   goals.NOT_MET, goals.MET,                                   # TTFT: 9.4 s vs 4.3 s; 1.3 s vs 6.3 s
                   goals.NOT_MET,                                              # 17,253 rows/s, 1,912 rows per forward
                   goals.NOT_MET, goals.NOT_MET, goals.NOT_MET]                # B=32 0.97x; B=1 1.11x; 12.6 ms
    assert rows[goals.GOALS[0].text]["measured"].startswith("0.76x: 212.5 vs fast-dllm 278.6")
    assert "the engine's default is engine:cache=sparse" in rows[goals.GOALS[3].text]["measured"]
    assert rows[goals.GOALS[5].text]["measured"].startswith("2.09x lower: 3.37 s vs sparse-dllm 7.04 s")
    assert rows[goals.GOALS[6].text]["measured"].startswith("4.16x lower: 0.31 s vs sparse-dllm 1.29 s")
    assert rows[goals.GOALS[10].text]["measured"] == "B=1: 1.11x, B=8: 1.05x, B=32: 0.97x"


def test_goals_say_why_they_are_not_measured(tmp_path):
    bench = _bench(tmp_path)
    _record(bench, "serve-full", status=FAILED, points=[])
    bench.records["serve-full"].detail = "0/4 points; serve exit 1: error: out of memory"
    _record(bench, "profile", status=FAILED, entries=[])
    bench.records["profile"].detail = "`dllm-bench profile-step` is not in this build"
    rows = goals.evaluate(bench)
    assert len(rows) == GOAL_ROWS and all(r["verdict"].startswith("not measured: ") for r in rows)
    assert "serve-full failed: 0/4 points; serve exit 1: error: out of memory" in rows[0]["verdict"]
    assert "serve-22g not selected" in rows[4]["verdict"]
    assert "profile-step` is not in this build" in rows[-1]["verdict"]


def test_a_point_with_unfinished_requests_is_marked(measured):
    pts = [dict(p) for p in FULL]
    pts[0].update(completed=30)
    measured.records["serve-full"].data["points"] = pts
    assert "(2 of 32 requests unfinished)" in goals.evaluate(measured)[0]["measured"]


def test_trace_figures_and_the_big_step_goal(tmp_path, measured):
    trace = tmp_path / "steps.jsonl"
    rows = [{"step": i, "wall_ms": 100.0, "requests": 32, "query_rows": 3000, "graph": False} for i in range(4)]
    rows += [{"step": 4 + i, "wall_ms": 10.0, "requests": 8, "query_rows": 256, "graph": True} for i in range(6)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = dv.trace_stats(trace)
    assert stats["steps"] == 10 and stats["median_ms"] == 10.0 and stats["graph_share"] == 0.6
    assert stats["big_steps"] == 4 and stats["big_rows_per_s"] == pytest.approx(30_000)
    pts = [dict(p) for p in FULL]
    pts[0]["trace_stats"] = stats
    measured.records["serve-full"].data["points"] = pts
    row = next(r for r in goals.evaluate(measured) if "2,000 rows" in r["goal"])
    assert row["verdict"] == goals.MET and row["measured"].startswith("30,000 rows/s over the 4 steps")
    assert dv.trace_stats(tmp_path / "missing.jsonl") is None


def test_profile_documents_are_read_by_their_figures():
    # profile-step --json's fields (docs/PROFILE_STEP.md): the unprofiled step time wins.
    doc = {"steps": 5, "graph_replays": {"profiled": 5, "unprofiled": 4}, "work": {"fraction_of_gemm_peak": 0.41},
           "step": {"wall_ms": 14.0, "unprofiled_wall_ms": 12.5,
                    "categories_ms": {"gemm": 8.0, "attention": 2.0, "host_gap": 1.5, "copy_h2d": 1.0}}}
    f = dv.profile_figures(doc)
    assert f["step_ms"] == 12.5 and f["graph_share"] == 0.8 and f["gemm_peak_fraction"] == 0.41
    assert f["top"] == "gemm 64%, attention 16%, host_gap 12%"
    listed = dv.profile_figures({"step": {"wall_ms": 3}, "categories": [{"name": "gemm", "ms": 3.0}]})
    assert listed["step_ms"] == 3.0 and listed["top"] == "gemm 100%"
    assert dv.profile_figures({}) == {"step_ms": None, "graph_share": None, "top": None, "gemm_peak_fraction": None}


# ------------------------------------------------------------------ plan, estimates, budget
def test_only_and_the_plan_order():
    assert [s.name for s in plan.select(None)] == list(plan.DEFAULT)
    assert plan.DEFAULT == ("checkpoint", "doctor", "serve-full", "serve-22g", "profile")  # what the goals read
    assert [s.name for s in plan.select("memory, doctor")] == ["doctor", "memory"]
    for bad, msg in (("doctor,nope", r"unknown step\(s\) nope"), (" , ", "names no step")):
        with pytest.raises(UserError, match=msg):
            plan.select(bad)


def test_the_gpu_plan_sizes_serve_22g_to_the_budget(tmp_path, monkeypatch):
    import dllm_bench.benchgpu.run as run

    monkeypatch.setattr(run, "for_device", lambda device: GPU)
    monkeypatch.setattr(run, "check_model", lambda model, scale: None)
    bench, steps = prepare(Options(model="llada-8b", out=tmp_path / "a"), NO_COMMANDS)
    total = sum(s.estimate(bench) for s in steps)
    assert bench.small_prompts in GPU.small_prompts and [s.name for s in steps] == list(plan.DEFAULT)
    # The default run fits 10 minutes with the margin, the checkpoint made on the machine included.
    made = next(s for s in steps if s.name == "checkpoint").estimate(bench)
    assert total - made + est.GPU_COSTS.make_s <= 600 - run.MARGIN_S
    roomy, _ = prepare(Options(model="llada-8b", out=tmp_path / "b", time_budget_s=3600), NO_COMMANDS)
    assert roomy.small_prompts == GPU.small_prompts[0]
    assert prepare(Options(model="llada-8b", out=tmp_path / "c", time_budget_s=0), NO_COMMANDS)[0].time_budget_s is None
    c = est.GPU_COSTS
    # A fixed-rate point lasts at least its arrivals; at saturation it is the work alone.
    assert est.replay_s(c, GPU, "small", "engine", 16, "1.0") >= 16
    assert est.replay_s(c, GPU, "full", "fast-dllm", 32, "inf") == pytest.approx(32 * 256 / 280)


def test_a_step_that_no_longer_fits_is_not_run(tmp_path):
    bench = _bench(tmp_path, budget=10.0)
    rec = StepRecord("serve-full", 100.0)
    step = next(s for s in plan.STEPS if s.name == "serve-full")
    _run_step(bench, step, rec)
    assert rec.status == NOT_RUN and "time budget" in rec.detail and "--only serve-full" in rec.detail


def test_a_step_that_raises_is_recorded_and_logged(tmp_path):
    bench = _bench(tmp_path)
    rec = StepRecord("doctor", 1.0)

    def broken(bench, rec):
        raise RuntimeError("boom")
    _run_step(bench, plan.Step("doctor", "x", lambda b: 1.0, broken), rec)
    assert rec.status == FAILED and "RuntimeError: boom" in rec.detail
    assert "boom" in (tmp_path / "logs" / "doctor.error.txt").read_text()


def test_engine_default_cache_variant_is_not_served_twice():
    systems, aliases = engine_aliases(FULL_SYSTEMS)
    assert len(systems) + len(aliases) == len(FULL_SYSTEMS)
    assert all(v == "engine" and k not in systems for k, v in aliases.items())


# ------------------------------------------------------------------ sub-command arguments
def test_profile_entries_and_arguments(tmp_path, measured):
    entries = profile.engine_entries(measured) + profile.baseline_entries(measured)
    assert [(s, g, b) for s, g, b, _ in entries] == [
        ("engine", True, 1), ("engine", False, 1), ("engine", True, 8), ("engine", False, 8),
        ("engine", True, 32), ("engine", False, 32), ("fast-dllm", None, 18), ("sparse-dllm", None, 32)]
    with_flags = Commands({"profile-step": frozenset({"--cuda-graphs", "--no-cuda-graphs", "--device", "--json"})})
    measured.commands = with_flags
    args = profile._args(measured, "engine", False, 8)
    assert args[:2] == ["profile-step", "--model"] and "--no-cuda-graphs" in args and "engine" in args
    assert args[args.index("--device") + 1] == "cuda"
    contract = frozenset({"--model", "--system", "--batch", "--phase", "--preset", "--device", "--json"})
    measured.commands = Commands({"profile-step": contract})
    args = profile._args(measured, "engine", False, 8)
    assert "engine:cuda_graphs=false" in args and args[args.index("--phase") + 1] == "reuse"
    assert args[args.index("--preset") + 1] == "paper"
    assert "--phase" not in profile._args(measured, "fast-dllm", None, 18)
    del measured.records["serve-full"]
    assert profile.baseline_entries(measured)[-1][2:] == (32, "no serve-full max-fit: the saturation request count")


def _fake_cli(monkeypatch, module, docs):
    """Replace a step's sub-command runner: `docs(args)` gives (exit code, stdout) per call."""
    from dllm_bench.benchgpu.subcommand import Outcome

    calls = []

    def run_cli(args, log, timeout_s=None):
        calls.append(list(args))
        rc, out = docs(args)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("error: the profile failed\n" if rc else "")
        return Outcome(tuple(args), rc, 0.1, out, log)
    monkeypatch.setattr(module, "run_cli", run_cli)
    return calls


def test_the_profile_step_keeps_each_document_and_stops_at_the_budget(tmp_path, monkeypatch, measured):
    measured.commands = Commands({"profile-step": frozenset({"--json", "--phase", "--device"})})

    def docs(args):
        system, batch = args[args.index("--system") + 1], int(args[args.index("--batch") + 1])
        if system == "sparse-dllm":
            return 1, ""
        eager = system.endswith("cuda_graphs=false")
        return 0, json.dumps({"steps": 5, "step": {"unprofiled_wall_ms": batch * (2.0 if eager else 1.0)}})
    calls = _fake_cli(monkeypatch, profile, docs)
    rec, base = StepRecord("profile", 1.0), StepRecord("profile-baselines", 1.0)
    profile.run(measured, rec)
    profile.run_baselines(measured, base)
    rows = {r["label"]: r for r in rec.data["entries"] + base.data["entries"]}
    assert len(calls) == 8 and rec.status == OK and rec.detail == "6/6 profiles"
    assert base.status == FAILED and base.detail.startswith("1/2 profiles; sparse-dllm-b32: exit 1")
    assert rows["engine-graphs-b8"]["step_ms"] == 8.0 and rows["engine-eager-b8"]["step_ms"] == 16.0
    assert json.loads((tmp_path / rows["fast-dllm-b18"]["file"]).read_text())["steps"] == 5
    assert [g["speedup"] for g in dv.graphs_vs_eager(rec.data["entries"])] == [2.0, 2.0, 2.0]
    # With the budget spent after the first entries, the rest are recorded as not run.
    measured.time_budget_s = measured.elapsed_s() + est.GPU_COSTS.profile_s * 0.5
    rec = StepRecord("profile", 1.0)
    profile.run(measured, rec)
    assert {r["status"] for r in rec.data["entries"]} == {NOT_RUN} and "time budget" in rec.detail


def test_the_memory_step_runs_each_budget_with_the_flags_the_command_has(tmp_path, monkeypatch):
    from dllm_bench.benchgpu.steps import memory

    bench = _bench(tmp_path)
    bench.commands = Commands({"memory": frozenset({"--memory-budget", "--json"})})
    calls = _fake_cli(monkeypatch, memory, lambda args: (0, json.dumps({"systems": []})))
    rec = StepRecord("memory", 1.0)
    memory.run(bench, rec)
    assert rec.status == OK and [c[c.index("--memory-budget") + 1] if "--memory-budget" in c else None
                                 for c in calls] == ["22GiB", None]
    assert all("--json" in c and "--device" not in c for c in calls)
    assert (tmp_path / "memory" / "small.json").is_file() and (tmp_path / "memory" / "full.json").is_file()


def test_the_checkpoint_step_checks_a_given_directory(tmp_path):
    from dllm_bench.benchgpu.steps import checkpoint
    from dllm_bench.checkpoints.make import make_checkpoint

    d = make_checkpoint("tiny", tmp_path / "ckpt", shards=2)
    bench = _bench(tmp_path / "out", scale=CPU)
    bench.model = str(d)
    rec = StepRecord("checkpoint", 1.0)
    checkpoint.run(bench, rec)
    assert rec.status == OK and bench.model_dir == d and rec.data["shards"] == 2 and "(given)" in rec.detail
    next(d.glob("model-00002-*.safetensors")).unlink()
    bench.model_dir, rec = None, StepRecord("checkpoint", 1.0)
    checkpoint.run(bench, rec)
    assert rec.status == FAILED and bench.model_dir is None and "model-00002" in rec.detail


def test_serve_estimates_and_missing_commands_fail_in_one_line(tmp_path):
    bench = _bench(tmp_path, scale=CPU)
    assert serve.estimate_full(bench) > serve.estimate_small(bench) / 2 > 0
    for name in ("profile", "profile-baselines", "memory"):
        rec = StepRecord(name, 1.0)
        next(s for s in plan.STEPS if s.name == name).run(bench, rec)
        assert rec.status == FAILED and "is not in this build" in rec.detail


def test_summary_renders_every_section(measured):
    text = summary.render(measured)
    for head in ("## Goals", "## Steps", "## Serving", "saturation: 32 requests at once", "## Step profile"):
        assert head in text
    assert "| engine:cache=dual " in text and "1 req/s" in text and "1,912" in text and "B=1: 1.11x" in text


# ------------------------------------------------------------------ the command
def test_bad_input_is_one_error_before_anything_is_written(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep")
    if not os.environ.get("CUDA_VISIBLE_DEVICES") and not __import__("torch").cuda.is_available():
        with pytest.raises(UserError, match="made on a CUDA device"):
            check_model("llada-8b", CPU)
    for opts, msg in ((Options(only="nope", out=tmp_path / "a"), "unknown step"),
                      (Options(out=full), "exists and is not empty"),
                      (Options(model="no-such-preset", out=tmp_path / "a"), "unknown model preset"),
                      (Options(model=str(tmp_path / "nodir"), out=tmp_path / "a"), "no such checkpoint directory"),
                      (Options(model=str(full), out=tmp_path / "a"), "no config.json"),
                      (Options(device="cpu", time_budget_s=-1, out=tmp_path / "a"), "--time-budget")):
        with pytest.raises(UserError, match=msg):
            prepare(opts, NO_COMMANDS)
    assert not (tmp_path / "a").exists() and [p.name for p in full.iterdir()] == ["x"]


def test_bad_input_exit_code_from_the_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "bench-gpu", "--only", "doctor,bogus", "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "unknown step(s) bogus" in r.stderr and not (tmp_path / "o").exists()


def test_the_command_registers_with_its_options():
    from dllm_bench.cli import app

    r = CliRunner().invoke(app, ["bench-gpu", "--help"])
    assert r.exit_code == 0 and "--only" in r.stdout and "--time-budget" in r.stdout


@pytest.mark.slow
def test_bench_gpu_end_to_end_on_the_cpu(tmp_path):
    """Every default step at the toy scale: the checkpoint made, doctor, both serve steps with
    every point, the engine's profile run (or, in a build without profile-step, recorded as such),
    and summary.md / bench.json hold them all."""
    out = tmp_path / "bench"
    env = {**os.environ, "DLLM_BENCH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "bench-gpu", "--model", "tiny", "--out", str(out),
                        "--time-budget", "0"], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    doc = json.loads((out / "bench.json").read_text())
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == list(plan.DEFAULT) and doc["scale"]["name"] == "cpu"
    assert all(s["seconds"] is not None for s in steps.values())
    assert steps["checkpoint"]["status"] == OK and steps["checkpoint"]["data"]["made_now"]
    assert steps["doctor"]["status"] == OK and (out / "doctor.json").is_file()
    for name, n in (("serve-full", len(doc["full_systems"])), ("serve-22g", 6)):
        s = steps[name]
        assert s["status"] == OK, s["detail"]
        assert len(s["data"]["points"]) == n and all(p["completed"] == p["num_prompts"] for p in s["data"]["points"])
        assert (out / "runs" / name / "summary.json").is_file()
        if s["data"]["traced"]:
            assert all(p["trace"] and (out / p["trace"]).is_file() for p in s["data"]["points"])
    for name in ("profile",):
        s = steps[name]
        assert s["status"] == OK or "is not in this build" in s["detail"], s["detail"]
    text = (out / "summary.md").read_text()
    assert "## Goals" in text and "## Steps" in text and "## Doctor" in text and "best baseline" in text
    assert r.returncode == (0 if all(s["status"] == OK for s in steps.values()) else 1)
    serving = [g for g in goals.GOALS[:10]]
    assert all(f"| {g.text}" in text for g in serving)
    assert "not measured: serve" not in text  # every serving goal has its measurement
    assert "[5/5] profile" in r.stderr and "plan:" in r.stderr


def test_results_paths_are_relative(tmp_path):
    bench = _bench(tmp_path)
    assert bench.rel(tmp_path / "runs" / "x") == str(Path("runs") / "x")


def test_a_sub_command_past_its_timeout_is_stopped(tmp_path):
    from dllm_bench.benchgpu.subcommand import run_cli

    out = run_cli(["models", "list"], tmp_path / "logs" / "slow.log", timeout_s=0.3)
    assert out.rc == -1 and not out.ok and out.reason().startswith("timed out after")
    assert (tmp_path / "logs" / "slow.log").read_text().startswith("$ dllm-bench models list")
