"""`dllm-bench serve`: system specs, sizes, options, and short end-to-end runs on the `tiny`
preset through the real CLI (one fresh worker process per system)."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from dllm_bench.errors import UserError
from dllm_bench.serve.options import (
    ServeOptions,
    parse_datasets,
    parse_optional_int,
    parse_rps_list,
    resolve_run,
)
from dllm_bench.serve.presets import PRESETS, preset_for
from dllm_bench.serve.run import serve
from dllm_bench.systems.build import cached_profile
from dllm_bench.systems.spec import (
    ENGINE_KNOBS,
    SystemVariant,
    baseline_knobs,
    engine_knobs,
    parse_system,
    parse_systems,
    split_specs,
)
from dllm_bench.units import format_size, parse_size
from tests.helpers import one_error_line

REPO = Path(__file__).resolve().parent.parent
RUN_FILES = ("config.json", "summary.json", "requests.jsonl", "metrics.csv")


# ---------------------------------------------------------------- system specs
def test_split_specs_outer_and_knob_commas():
    assert split_specs("engine,engine:cache=dual,fast-dllm,fast-dllm:batch=1") == [
        "engine", "engine:cache=dual", "fast-dllm", "fast-dllm:batch=1"]
    assert split_specs("engine:cache=dual,retention=0.3,fast-dllm , llada:batch=2") == [
        "engine:cache=dual,retention=0.3", "fast-dllm", "llada:batch=2"]


def test_parse_systems_variants_and_labels():
    vs = parse_systems("engine,engine:cache=dual,fast-dllm,fast-dllm:batch=1")
    assert [v.label for v in vs] == ["engine", "engine:cache=dual", "fast-dllm", "fast-dllm:batch=1"]
    assert [v.is_baseline for v in vs] == [False, False, True, True]
    assert vs[1].knob_dict == {"cache": "dual"} and vs[3].batch == 1 and vs[2].batch is None
    v = parse_system("engine:max-num-logits=none,retention=0.25,max_num_batched_tokens=512")
    assert v.knob_dict == {"max_num_logits": None, "retention": 0.25, "max_num_batched_tokens": 512}
    assert v.label == "engine:max_num_logits=none,retention=0.25,max_num_batched_tokens=512"
    assert SystemVariant.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    dc = parse_system("dllm-cache:prompt_interval=100,gen_interval=7")
    assert dc.knob_dict == {"prompt_interval": 100, "gen_interval": 7}
    assert parse_system("fast-dllm:threshold=0.9").knob_dict == {"threshold": 0.9}
    assert parse_system("fast-dllm:threshold=none").knob_dict == {"threshold": None}


def test_default_systems_are_the_papers_four():
    assert [v.label for v in parse_systems(None)] == ["engine", "fast-dllm", "dllm-cache", "sparse-dllm"]


@pytest.mark.parametrize("text, msg", [
    ("engine,vllm", "unknown system 'vllm'"),
    ("engine:bogus=1", "no knob 'bogus'"),
    ("engine:cache=triple", "cache"),
    ("engine:retention=2", "retention"),
    ("engine:max_num_seqs=zero", "integer"),
    ("engine:pool_window=4", "pool_window"),
    ("fast-dllm:batch=0", "batch must be >= 1"),
    ("fast-dllm:fast_dllm_cache=triple", "fast_dllm_cache"),
    ("sparse-dllm:keep_ratio=1.5", "keep_ratio"),
    ("llada:retention=0.5", "no knob 'retention'"),
    ("engine,engine", "twice"),
    ("cache=dual,engine", "no system before it"),
    ("engine:cache", "key=value"),
    ("engine:cache=dual,cache=none", "given twice"),
])
def test_bad_specs_are_user_errors(text, msg):
    with pytest.raises(UserError, match=msg):
        parse_systems(text)


def test_run_defaults_then_variant_knobs():
    eng = parse_system("engine:retention=0.3")
    assert engine_knobs(eng, {"retention": 0.5, "max_num_logits": 256, "unrelated": 1}) == {
        "cache": "auto", "retention": 0.3, "max_num_logits": 256}      # cache: the engine system's default
    assert set(engine_knobs(eng, {})) <= set(ENGINE_KNOBS)
    dc = parse_system("dllm-cache:gen_interval=5,batch=2")
    knobs = baseline_knobs(dc, {"dllm-cache": {"prompt_interval": 100, "gen_interval": 7}})
    assert knobs["prompt_interval"] == 100 and knobs["gen_interval"] == 5 and "batch" not in knobs


def test_profile_cache_hits_and_survives_a_corrupt_entry(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"kv_pool_tokens": 123}
    payload = {"model": {"config_sha256": "x"}, "knobs": {"cache": "sparse"}}
    assert cached_profile("engine", payload, compute, tmp_path) == ({"kv_pool_tokens": 123}, False)
    assert cached_profile("engine", payload, compute, tmp_path) == ({"kv_pool_tokens": 123}, True)
    assert cached_profile("engine", {**payload, "knobs": {"cache": "dual"}}, compute, tmp_path)[1] is False
    assert len(calls) == 2
    for f in tmp_path.iterdir():
        f.write_text("{not json")
    assert cached_profile("engine", payload, compute, tmp_path) == ({"kv_pool_tokens": 123}, False)
    assert cached_profile("engine", payload, compute, tmp_path, use_cache=False)[1] is False


# ---------------------------------------------------------------- sizes and options
@pytest.mark.parametrize("text, n", [
    ("4GiB", 4 * 2**30), ("512MiB", 512 * 2**20), ("2.5GB", 2_500_000_000), ("1e9", 10**9),
    ("300000000", 300_000_000), ("64 kib", 65536), ("1.5gib", 3 * 2**29), ("2M", 2_000_000), (1024, 1024),
])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "abc", "-1GiB", "0", "4XB", "GiB", "1..5GB", "nan", True])
def test_parse_size_rejects(text):
    with pytest.raises(UserError):
        parse_size(text, "--memory-budget")


def test_format_size():
    assert format_size(3 * 2**30) == "3.00 GiB" and format_size(512) == "512 B" and format_size(None) == "unbounded"


def test_rps_datasets_and_optional_ints():
    assert parse_rps_list("0.5") == [0.5]
    assert parse_rps_list("0.1,0.25, 0.5,1.0") == [0.1, 0.25, 0.5, 1.0]
    assert parse_rps_list("inf") == [math.inf]
    for bad in ("0", "-1", "abc", "nan", "", "0.5,0.5"):
        with pytest.raises(UserError):
            parse_rps_list(bad)
    assert parse_datasets("livebench,osc,burstgpt") == ["livebench", "osc", "burstgpt"]
    with pytest.raises(UserError):
        parse_datasets("sharegpt")
    assert parse_optional_int("none", "x") is None and parse_optional_int("256", "x") == 256
    with pytest.raises(UserError):
        parse_optional_int("0", "--max-num-logits")


def test_serve_presets():
    default = PRESETS["cpu-default"]
    assert default.model == "similar-1024" and default.rps == "0.5" and default.length_scale == 1.0
    assert "similar-1024" in default.describe() and "steps = gen_length" in default.describe()
    assert PRESETS["serve-126k"].model == "serve-126k"              # the logit-memory stress preset
    assert preset_for(None, "tiny").name == "tiny"          # --model tiny gets tiny workloads
    assert preset_for(None, None).name == "cpu-default"
    p = preset_for("tiny", "/some/ckpt")
    assert p.name == "tiny" and p.model == "/some/ckpt"
    with pytest.raises(UserError):
        preset_for("nope", None)


# ---------------------------------------------------------------- end to end through the CLI
def _cli(*args, timeout=240, gauge=False):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DLLM_BENCH_SPEED_GAUGE="1" if gauge else "")
    return subprocess.run([sys.executable, "-m", "dllm_bench.cli", "serve", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=timeout)


TINY = ("--model", "tiny", "--systems", "engine,llada", "--num-prompts", "3", "--num-warmups", "0")


def test_serve_tiny_end_to_end_writes_every_file_and_resumes(tmp_path):
    r = _cli(*TINY, "--rps", "inf", "--result-dir", str(tmp_path), "--run-id", "e2e", "--json", gauge=True)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)                               # stdout is exactly one JSON document
    run_dir = Path(doc["run_dir"])
    assert run_dir == tmp_path / "e2e"
    for f in RUN_FILES:
        assert (run_dir / f).is_file() and (run_dir / f).stat().st_size > 0, f
    assert not list(run_dir.rglob("*.tmp"))
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["kind"] == "serve" and cfg["config"]["preset"]["name"] == "tiny"
    assert [s["label"] for s in cfg["config"]["systems"]] == ["engine", "llada"]
    points = {p["system"]: p for p in doc["points"]}
    assert set(points) == {"engine", "llada"}
    for p in points.values():
        assert p["completed"] == 3 and p["rps"] == "inf" and p["dataset"] == "livebench"
        assert p["torch_threads"] == 1
    assert points["llada"]["scenario_kind"] == "max-fit" and points["llada"]["max_batch_size"] >= 1
    assert points["engine"]["kv_pool_tokens"] > 0
    for p in points.values():     # the budget was held, measured untimed after a CPU replay
        assert p["within_budget"] is True and 0 < p["peak_memory_bytes"] <= p["memory_budget_bytes"]
        assert p["peak_measured_in"] == "probe"
        assert p["mean_batch_size"] >= 1
        # Asked for (a validation's measured side), the speed gauge is read before and after the
        # replay: its mean is a metrics column.
        gauge = p["speed_gauge_readings_s"]
        assert len(gauge) == 2 and min(gauge) > 0 and math.isclose(p["speed_gauge_s"], sum(gauge) / 2)
    assert "speed_gauge_s" in pd.read_csv(run_dir / "metrics.csv").columns
    assert doc["speed_gauge_drift"] >= 1.0                    # the four readings' slowest / fastest
    (comp,) = doc["comparisons"]
    assert comp["best_baseline"].startswith("llada [B=")
    rows = {row["system"]: row for row in comp["rows"]}
    # three requests a point: metrics, but no ratio drawn from them (tests/test_serve_projection.py)
    assert rows["engine"]["too_few_requests"] is True and rows["engine"]["output_throughput_x"] is None
    assert "too few requests for ratios: 3 finished per point" in " ".join(r.stderr.split())
    reqs = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) == 6 and {q["status"] for q in reqs} == {"finished"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["points"]) == 2
    assert "Serving Benchmark Result" in r.stderr and "preset tiny" in r.stderr
    # The engine's attention backend and why: said once by the run, never by its workers.
    assert r.stderr.count("attention: padded SDPA (") == 1
    assert not any("attention:" in f.read_text() for f in (run_dir / "logs").iterdir())
    # Same options again with --resume: every point is finished, nothing is re-run.
    r2 = _cli(*TINY, "--rps", "inf", "--result-dir", str(tmp_path), "--run-id", "e2e", "--resume")
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stderr.count("finished earlier") == 2
    # --resume with a different workload is refused, not mixed in (checked before any work).
    run = resolve_run(ServeOptions(**{**RUN_DEFAULTS, "seed": 1, "rps": "inf"}))
    with pytest.raises(UserError, match="seed"):
        serve(run, result_dir=tmp_path, run_id="e2e", resume=True, as_json=False)
    with pytest.raises(UserError, match="no run 'nope'"):
        serve(run, result_dir=tmp_path, run_id="nope", resume=True, as_json=False)


def test_serve_requests_longer_than_the_token_budget_complete_by_default(tmp_path):
    """The tiny workload's canvases (47 to 61 tokens) under a 12-token budget, with no other
    flag: each Refresh runs in chunks, and the measured peak stays within the memory budget."""
    budget = 12
    r = _cli("--model", "tiny", "--systems", "engine", "--num-prompts", "3", "--num-warmups", "0",
             "--max-num-batched-tokens", str(budget), "--rps", "inf", "--result-dir", str(tmp_path), "--run-id", "long",
             "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    (point,) = json.loads(r.stdout)["points"]
    assert point["completed"] == 3 and point["within_budget"] is True
    reqs = [json.loads(line) for line in (tmp_path / "long" / "requests.jsonl").read_text().splitlines()]
    assert {q["status"] for q in reqs} == {"finished"}
    assert max(q["prompt_len"] + q["output_len"] for q in reqs) >= 4 * budget
    assert {q["nfe"] for q in reqs} == {16}


def test_the_attention_line_is_said_once_a_run_whatever_the_workers():
    """Every engine point builds its engine in its own worker: the run prints the line once."""
    from types import SimpleNamespace

    from dllm_bench.serve.process import progress_handler

    printed = []
    progress = SimpleNamespace(console=SimpleNamespace(print=lambda text, **kw: printed.append(text)),
                               update=lambda task, **kw: None)
    said: set[str] = set()
    line = "attention: torch varlen_attn (torch 2.11.0's FlashAttention varlen kernels)"
    for task in range(3):                                    # three engine points, a worker each
        on_event = progress_handler(progress, task, said)
        on_event({"event": "built", "info": {"attention": line, "kv_pool_tokens": 64}})
        on_event({"event": "built", "info": {"max_batch_size": 4}})       # a baseline says nothing
    assert printed == [line]


def _as_from_a_terminal() -> None:
    """In the child before exec: SIGINT delivered and handled by default, as under a shell. A
    test process can carry an ignored or blocked SIGINT (both survive exec), and then the CLI
    never sees the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


@pytest.mark.slow
def test_serve_ctrl_c_keeps_finished_points(tmp_path):
    """SIGINT during the second system: exit 130, the first point is kept (resume skips it)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DLLM_BENCH_SPEED_GAUGE="")
    args = [sys.executable, "-m", "dllm_bench.cli", "serve", "--model", "tiny", "--systems", "engine,llada:batch=1",
            "--num-prompts", "4", "--rps", "0.25", "--num-warmups", "0", "--result-dir", str(tmp_path),
            "--run-id", "cc"]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_terminal)
    point = tmp_path / "cc" / "points" / "livebench__engine__rps0.25" / "summary.json"
    deadline = time.monotonic() + 120
    while not point.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert point.exists(), proc.stderr.read() if proc.poll() is not None else "engine point never finished"
    time.sleep(2.0)                                          # the llada worker is starting / serving
    assert proc.poll() is None, "the run finished before the signal: make the second point slower"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, signal.getsignal(signal.SIGINT),
                                    signal.pthread_sigmask(signal.SIG_BLOCK, []), err[-3000:])
    assert "Traceback" not in err
    run_dir = tmp_path / "cc"
    for f in RUN_FILES:
        assert (run_dir / f).is_file(), f
    assert not list(run_dir.rglob("*.tmp"))
    assert json.loads(point.read_text())["interrupted"] is False
    assert "speed_gauge_s" not in json.loads(point.read_text())     # a plain serve point reads no gauge


@pytest.mark.parametrize("args, msg", [
    (("--systems", "engine,vllm"), "unknown system"),
    (("--rps", "0"), "--rps must be > 0"),
    (("--dataset", "burstgpt", "--dataset-path", "/nonexistent/trace.csv"), "no such file"),
])
def test_bad_input_exit_2_one_line_no_run_dir(tmp_path, args, msg, cli_in_process):
    r = cli_in_process("serve", "--model", "tiny", "--systems", "engine", "--num-prompts", "2",
                       "--result-dir", str(tmp_path), *args)
    one_error_line(r, msg)
    assert r.stdout == ""
    assert not any(tmp_path.iterdir())                         # no run directory left behind


RUN_DEFAULTS = dict(
    rps=None, systems="engine,llada", dataset=None, dataset_path=None, num_prompts=3, duration=None,
    burstiness=1.0, arrivals=None, time_scale=1.0, burstgpt_model=None, memory_budget=None, model="tiny",
    preset=None, max_num_batched_tokens=None, max_num_logits=None, max_num_seqs=None, retention=None,
    length_scale=None, gen_cap=None, block_length=None, max_prompt_len=None, threads=None, dtype=None,
    device=None, seed=0, max_duration=None, num_warmups=0, no_profile_cache=False)


@pytest.mark.parametrize("over, msg", [
    ({"rps": "-1"}, "--rps must be > 0"),
    ({"memory_budget": "4XB"}, "--memory-budget"),
    ({"memory_budget": "100KiB"}, "does not even hold the weights"),
    ({"burstiness": 0.5, "arrivals": "poisson"}, "gamma"),
    ({"arrivals": "trace"}, "--dataset-path"),
    ({"gen_cap": 4}, "smaller than one block"),
    ({"dataset": "sharegpt"}, "unknown dataset"),
    ({"max_num_logits": "0"}, "--max-num-logits"),
    ({"num_prompts": None, "duration": 5.0, "rps": "inf"}, "--num-prompts"),
    ({"device": "tpu"}, "--device"),
    ({"dataset": "custom"}, "--dataset-path"),
])
def test_resolve_run_rejects_bad_options(over, msg):
    with pytest.raises(UserError, match=msg):
        resolve_run(ServeOptions(**{**RUN_DEFAULTS, **over}))


def test_resolve_run_builds_one_workload_per_dataset_and_rate(tmp_path):
    run = resolve_run(ServeOptions(**{**RUN_DEFAULTS, "rps": "0.5,1", "dataset": "livebench,osc", "burstiness": 0.5}))
    assert run.arrivals == "gamma" and run.preset.name == "tiny" and run.memory_budget == 8 * 2**20
    assert sorted(run.workloads) == [("livebench", 0.5), ("livebench", 1.0), ("osc", 0.5), ("osc", 1.0)]
    a, b = run.workloads[("livebench", 0.5)], run.workloads[("osc", 0.5)]
    assert [r.arrival for r in a] == [r.arrival for r in b]          # same seed: same arrivals
    assert all(r.gen_length % run.preset.block_length == 0 for r in a)
    spec = run.workloads[("livebench", 1.0)]
    assert [r.prompt_len for r in spec] == [r.prompt_len for r in a]  # lengths independent of rate
    assert run.engine_defaults["max_num_logits"] == 64
    assert run.baseline_defaults["sparse-dllm"]["keep_ratio"] == run.preset.retention


def test_step_stats_summary_reduces_the_per_step_lists_for_worker_and_simulator():
    from dllm_bench.serve.loadgen import step_stats_summary

    raw = {"steps": 3, "batch_sizes": [1, 4, 2], "step_composition": [[1, 0, 8], [2, 2, 20], [0, 2, 4]],
           "profile": {"x": 1}, "forwards": 3}
    out = step_stats_summary(raw)
    assert out == {"steps": 3, "forwards": 3, "mean_batch_size": 7 / 3, "max_batch_size_seen": 4,
                   "refresh_request_steps": 3, "reuse_request_steps": 4}
    assert "batch_sizes" in raw                          # the caller's dict is left as it was
    assert step_stats_summary({"batch_sizes": []})["mean_batch_size"] is None


def test_model_info_counts_parameters_as_the_preset_does():
    from dllm_bench.checkpoints.load import model_dir
    from dllm_bench.checkpoints.presets import get_preset
    from dllm_bench.serve.workload import model_info

    p = get_preset("tiny")
    info = model_info(model_dir("tiny"), "float32")
    assert info["n_params"] == p.n_params and info["weights_bytes"] == 4 * p.n_params
