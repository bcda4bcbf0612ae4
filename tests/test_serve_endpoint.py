"""`dllm-bench serve --endpoint`: the HTTP load generator against our own server on the `tiny`
preset, next to the same engine in-process, in one run through the real CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dllm_bench.serve.endpoint import Endpoint, EndpointError, normalize_url, request_body, run_endpoint
from tests.server_proc import BLOCK, MODEL, REPO, Server

RUN_FILES = ("config.json", "summary.json", "requests.jsonl", "metrics.csv")


@pytest.fixture(scope="module")
def server():
    s = Server("--no-sampling", knobs=())     # the engine `serve --model tiny` builds in-process
    yield s
    s.stop()


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dllm_bench.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=600)


def test_endpoint_and_in_process_points_write_the_same_files_and_token_counts(server, tmp_path):
    r = cli("serve", "--model", MODEL, "--systems", "engine", "--endpoint", server.url + "/v1",
            "--rps", "inf", "--num-prompts", "5", "--result-dir", str(tmp_path), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    points = {p["system"]: p for p in doc["points"]}
    served = f"{MODEL}@{server.url}/v1"              # the endpoint row is named by what it served
    assert set(points) == {"engine", served}
    s = points[served]
    assert (s["system_name"], s["scenario_kind"], s["is_baseline"]) == ("endpoint", "endpoint", False)
    assert s["memory_budget"] is None and points["engine"]["memory_budget"] is not None
    assert s["knobs"]["url"] == server.url + "/v1" and s["knobs"]["model"] == MODEL
    run_dir = tmp_path / doc["run_id"]
    dirs = {("engine" if d.name.split("__")[1] == "engine" else "endpoint"): d
            for d in (run_dir / "points").iterdir()}
    files = {k: sorted(f.name for f in d.iterdir()) for k, d in dirs.items()}
    assert files["engine"] == files["endpoint"] and set(RUN_FILES) - {"config.json", "metrics.csv"} <= set(files["engine"])
    assert (run_dir / "config.json").is_file() and (run_dir / "metrics.csv").is_file()

    def requests(name):
        rows = [json.loads(x) for x in (dirs[name] / "requests.jsonl").read_text().splitlines()]
        return {q["request_id"]: q for q in rows if q["status"] == "finished"}
    eng, ep = requests("engine"), requests("endpoint")
    assert len(eng) == 5 and set(eng) == set(ep)
    for rid, q in eng.items():
        assert (ep[rid]["prompt_len"], ep[rid]["output_len"]) == (q["prompt_len"], q["output_len"])
        assert ep[rid]["nfe"] == q["nfe"]                 # the dllm extension carries the engine's NFE
        assert ep[rid]["first_token_time"] <= ep[rid]["finished_time"]
    assert s["completed"] == 5 and s["failed"] == 0 and s["mean_ttft_ms"] > 0
    assert s["total_output_tokens"] == points["engine"]["total_output_tokens"]
    assert s["forwards"] > 0                              # scraped from the server's /metrics
    # what HTTP added, within the run: client E2EL contains the server's own job-to-finish time
    assert 0 <= s["http_overhead_median_ms"] <= s["http_overhead_max_ms"]
    assert s["http_overhead_median_ms"] < s["median_e2el_ms"]
    assert points["engine"].get("http_overhead_median_ms") is None


def test_replay_non_streamed_chat_and_rejections(server):
    ep = Endpoint(server.url + "/v1", MODEL, api="chat", stream=False)
    wl = [{"request_id": "ok", "prompt_ids": [5, 6, 7], "gen_length": BLOCK, "arrival": 0.0},
          {"request_id": "bad", "prompt_ids": [5], "gen_length": 10_000, "arrival": 0.0}]
    res = run_endpoint(ep, wl, block_length=BLOCK, decode=lambda ids: " ".join(map(str, ids)))
    assert [r["request_id"] for r in res["records"]] == ["ok"]
    rec = res["records"][0]
    assert rec["output_len"] == BLOCK and rec["first_token_time"] is None   # not streamed: no TTFT
    assert [r["request_id"] for r in res["rejected"]] == ["bad"]
    assert "HTTP 400" in res["rejected"][0]["error"] and "max_model_len" in res["rejected"][0]["error"]
    assert res["unfinished"] == 0 and res["not_sent"] == 0


def test_request_bodies_and_urls():
    item = {"prompt_ids": [1, 2], "gen_length": 32}
    plain = request_body(Endpoint("http://h/v1", "m", dllm_extras=False), item, block_length=8, decode=None)
    assert plain == {"model": "m", "max_tokens": 32, "temperature": 0.0, "stream": True, "prompt": [1, 2],
                     "stream_options": {"include_usage": True}}
    ours = request_body(Endpoint("http://h/v1", "m", stream=False), item, block_length=8, decode=None)
    assert ours["steps"] == 32 and ours["block_length"] == 8 and ours["return_token_ids"] is True
    assert normalize_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/v1"
    assert normalize_url("http://h:1/v1") == "http://h:1/v1"
    with pytest.raises(EndpointError):
        normalize_url("127.0.0.1:8000")


def test_unreachable_endpoint_is_one_line_exit_2_and_no_run_dir(tmp_path):
    r = cli("serve", "--model", MODEL, "--endpoint", "http://127.0.0.1:9/v1", "--num-prompts", "2",
            "--result-dir", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr and not any(tmp_path.iterdir())


def test_an_endpoint_row_is_never_the_engine_in_the_report(tmp_path):
    from dllm_bench import results
    from dllm_bench.report.claims import Claims
    from dllm_bench.report.serving import serve_section

    ep = Endpoint("http://127.0.0.1:8000/v1", "engine-8b")
    assert ep.variant().label == "engine-8b@http://127.0.0.1:8000/v1" and ep.variant().name == "endpoint"
    d = results.create_run("serve", {"preset_line": "fixture"}, run_id="ep", root=tmp_path)
    for label, name, tp in ((ep.label, "endpoint", 90.0), ("fast-dllm", "fast-dllm", 50.0),
                            ("sparse-dllm", "sparse-dllm", 30.0)):
        s = {"output_throughput": tp, "request_throughput": tp / 100, "completed": 4, "mean_e2el_ms": 1e5 / tp,
             "p99_e2el_ms": 2e5 / tp, "latency_std_ms": 1e4 / tp, "latency_span_ms": 3e4 / tp,
             "system_name": name, "is_baseline": name != "endpoint", "interrupted": False}
        results.write_point(d, results.PointKey(label, 1.0, "livebench"), s, [{"request_id": "r0"}])
    claims = Claims()
    text = serve_section(d, claims, tmp_path / "files", tmp_path)
    assert ep.label in text                                  # its row is in the table, under its name
    ours = {c["claim"]: (c["ours"], c["verdict"]) for c in claims.rows}
    # Without the in-process engine there is no engine/baseline ratio to compare with the paper.
    assert "no engine/baseline pair" in ours["Throughput vs the strongest baseline"][0]
    assert "no engine/baseline pair" in ours["Up to 3.12× vs Sparse-dLLM (Table 4, L40S, 1.0 req/s)"][0]
    assert ours["Lower latency jitter (Fig. 5)"][1] == "no data"
