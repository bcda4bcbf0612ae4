"""vLLM `bench serve` flags through the real CLI on the `tiny` preset: --max-concurrency (checked
from requests.jsonl), --goodput (recounted from the per-request times), the percentile
selection, vLLM's result keys; and `serve --endpoint` against a server with an API key."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from dllm_bench.metrics.serving import peak_concurrency
from dllm_bench.serve.endpoint import auth_headers, endpoint_api_key
from tests.server_proc import MODEL, Server
from tests.test_serve_endpoint import cli

KEY = "sk-test-serve-endpoint"


def _point(run_dir):
    (d,) = (run_dir / "points").iterdir()            # one system, one rate
    rows = [json.loads(x) for x in (d / "requests.jsonl").read_text().splitlines()]
    return json.loads((d / "summary.json").read_text()), [q for q in rows if q["status"] == "finished"]


def _check_cap(summary, recs, cap: int, n: int) -> None:
    """At most `cap` in flight by the records' own times, every request started no earlier than
    its arrival, some had to wait, and latencies count from the start (vLLM's)."""
    assert len(recs) == n and summary["completed"] == n
    assert peak_concurrency((q["start_time"], q["finished_time"]) for q in recs) <= cap
    assert all(q["start_time"] >= q["arrival_time"] for q in recs)
    assert sum(q["start_time"] > q["arrival_time"] for q in recs) >= n - cap   # all arrive at t=0
    assert summary["max_concurrency"] == cap and summary["max_concurrent_requests"] <= cap
    e2el = sorted((q["finished_time"] - q["start_time"]) * 1e3 for q in recs)
    assert summary["mean_e2el_ms"] == pytest.approx(sum(e2el) / n)


def test_max_concurrency_goodput_and_percentiles_in_process(tmp_path):
    slo = {"ttft": 15.0, "e2el": 60000.0}
    r = cli("serve", "--model", MODEL, "--systems", "engine", "--rps", "inf", "--num-prompts", "6",
            "--max-concurrency", "2", "--goodput", f"ttft:{slo['ttft']:g}", f"e2el:{slo['e2el']:g}",
            "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,90", "--result-dir", str(tmp_path),
            "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / json.loads(r.stdout)["run_id"]
    s, recs = _point(run_dir)
    _check_cap(s, recs, 2, 6)
    # goodput recounted from the per-request times: TTFT and E2EL from the start, each within its SLO
    good = sum((q["first_token_time"] - q["start_time"]) * 1e3 <= slo["ttft"]
               and (q["finished_time"] - q["start_time"]) * 1e3 <= slo["e2el"] for q in recs)
    assert s["good_requests"] == good and s["goodput_slo_ms"] == slo
    assert s["request_goodput"] == pytest.approx(good / s["duration"])
    assert "{:<40} {:<10.2f}".format("Request goodput (req/s):", s["request_goodput"]) in r.stderr
    # the selected percentiles of the selected metrics, printed as vLLM prints them
    for key in ("p50_ttft_ms", "p90_ttft_ms", "p50_e2el_ms", "p90_e2el_ms", "p99_e2el_ms", "p99_tpot_ms"):
        assert s[key] is not None, key
    assert "p50_tpot_ms" not in s and "p90_tpot_ms" not in s
    assert "P90 TTFT (ms):" in r.stderr and "TPOT (ms):" not in r.stderr and "P99 E2EL (ms):" not in r.stderr
    # vLLM's --save-result keys where the meaning is the same
    assert s["request_rate"] == "inf" and s["burstiness"] == 1.0 and s["model_id"] == MODEL
    assert s["duration"] == s["duration_s"] and s["completed"] == 6 and len(s["date"]) == 15
    cfg = json.loads((run_dir / "config.json").read_text())["config"]["fingerprint"]
    assert cfg["max_concurrency"] == 2 and cfg["metric_options"]["goodput"] == slo


@pytest.fixture(scope="module")
def keyed_server():
    s = Server("--no-sampling", knobs=(), env={"DLLM_BENCH_API_KEY": KEY})
    yield s
    s.stop()


def test_a_server_with_a_key(keyed_server):
    url = keyed_server.url
    ok = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    r = ok.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=8)
    assert r.usage.completion_tokens == 8
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0, timeout=120).models.list()
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    bare = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": [5], "max_tokens": 8}, timeout=60)
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert httpx.get(url + "/metrics", timeout=30).status_code == 200


def test_serve_endpoint_sends_the_key_and_caps_concurrency(keyed_server, tmp_path, monkeypatch):
    url = keyed_server.url + "/v1"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    r = cli("serve", "--endpoint", url, "--rps", "inf", "--num-prompts", "2", "--result-dir", str(tmp_path),
            cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "API key" in r.stderr and "--api-key" in r.stderr
    assert not any(tmp_path.iterdir())
    monkeypatch.setenv("OPENAI_API_KEY", KEY)                    # the key OpenAI's clients read
    r = cli("serve", "--endpoint", url, "--rps", "inf", "--num-prompts", "5", "--max-concurrency", "2",
            "--result-dir", str(tmp_path), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / json.loads(r.stdout)["run_id"]
    s, recs = _point(run_dir)
    _check_cap(s, recs, 2, 5)
    # ITL over HTTP: one gap per streamed block after the first (tiny: gen_length 8 or 16, blocks of 8)
    assert all(len(q["itl"]) == q["output_len"] // 8 - 1 for q in recs)
    assert not any(KEY in f.read_text(errors="replace") for f in run_dir.rglob("*") if f.is_file())


def test_the_endpoint_key_is_the_option_else_openais_variable(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert endpoint_api_key("given") == "given" and endpoint_api_key(None) == "from-env"
    monkeypatch.delenv("OPENAI_API_KEY")
    assert endpoint_api_key(None) is None
    assert auth_headers(None) == {} and auth_headers("k") == {"Authorization": "Bearer k"}


def test_simulate_takes_the_same_flags(tmp_path):
    r = cli("simulate", "--hardware", "rtx4090", "--preset", "paper", "--systems", "engine", "--rps", "inf",
            "--num-prompts", "12", "--max-concurrency", "3", "--goodput", "e2el:8600", "--result-dir", str(tmp_path),
            "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s, recs = _point(tmp_path / json.loads(r.stdout)["run_id"])
    _check_cap(s, recs, 3, 12)
    good = sum((q["finished_time"] - q["start_time"]) * 1e3 <= 8600 for q in recs)
    assert s["good_requests"] == good and s["request_goodput"] == pytest.approx(good / s["duration"])


@pytest.mark.parametrize("args, word", [
    (["--max-concurrency", "0"], "--max-concurrency must be >= 1"),
    (["--goodput", "ttft:500", "tbt:5"], "unknown metric 'tbt'"),
    (["e2el:500"], "unexpected argument 'e2el:500'"),
    (["--metric-percentiles", "50,200"], "not a percentile"),
    (["--api-key", "k"], "--api-key is what serve sends to --endpoint")])
def test_bad_flags_are_one_error_line_before_any_run(args, word, tmp_path, monkeypatch, capsys):
    import sys

    from dllm_bench.cli import main

    monkeypatch.setattr(sys, "argv", ["dllm-bench", "serve", "--model", MODEL, "--result-dir", str(tmp_path), *args])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and word in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())
