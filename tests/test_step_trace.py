"""`--trace-steps`: every point of a serving run writes steps.jsonl, one row per forward of the
engine or a baseline, whose counts add up to the point's own stats; rows stream to a file (the
sink holds none) and a point's trace appears with it, never half-written."""
from __future__ import annotations

import pytest

from dllm_bench import results
from dllm_bench.serve import trace
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.serve.run import serve
from engine.engine import StepCounters
from tests.test_serve import RUN_DEFAULTS

SCHEMA = ("step", "t_s", *trace.TRACE_FIELDS)


def test_the_sink_streams_numbered_rows_timed_from_the_replay_start(tmp_path):
    system = type("S", (), {})()
    system.counters = StepCounters()
    part = trace.part_path(tmp_path / "point")
    with trace.tracing(system, part) as t:
        t.start(100.0)
        system.counters.record(2, 10, 4, 4, 1, 1, started=100.5, key_tokens=30, padded=4, graph=True,
                               cache={"dual": 2})
        system.counters.record(1, 3, 1, 1, 0, 1, started=101.25)
        system.counters.record(5, 5, 5, 5, 5, 0)          # recorded without a start: not a traced forward
    assert system.counters.sink is None                   # detached after the replay
    rows = results.read_jsonl(part)
    assert [r["step"] for r in rows] == [0, 1] and [r["t_s"] for r in rows] == [0.5, 1.25]
    assert rows[0] == {**rows[0], "requests": 2, "padded_requests": 4, "refresh": 1, "reuse": 1, "query_rows": 10,
                       "key_tokens": 30, "logit_rows": 4, "graph": True, "cache": {"dual": 2}}
    assert rows[1]["padded_requests"] == 1 and rows[1]["graph"] is False and "cache" not in rows[1]
    assert list(rows[0]) == list(SCHEMA)
    assert all(r["wall_ms"] >= 0 for r in rows)
    trace.publish(part)
    assert not part.exists() and (tmp_path / "point" / trace.STEPS_FILE).is_file()
    trace.discard(part)                                   # nothing left to discard: no error
    trace.forget(tmp_path / "point")                      # a point measured again loses its old trace
    assert not (tmp_path / "point" / trace.STEPS_FILE).exists()
    with trace.tracing(object(), part) as t:               # no step counters (an endpoint): nothing traced
        assert t is None


@pytest.mark.slow
def test_serve_trace_steps_writes_every_points_forwards(tmp_path):
    opts = ServeOptions(**{**RUN_DEFAULTS, "systems": "engine,fast-dllm,sparse-dllm", "rps": "inf",
                           "trace_steps": True})
    run = resolve_run(opts)
    assert serve(run, result_dir=tmp_path, run_id="tr", resume=False, as_json=False) == 0
    run_dir = tmp_path / "tr"
    assert results.load_config(run_dir)["config"]["trace_steps"] is True
    assert not list(run_dir.rglob("*.part"))
    points = results.load_points(run_dir)
    assert len(points) == 3
    for p in points:
        rows = results.read_jsonl(run_dir / "points" / p["_point"] / trace.STEPS_FILE)
        st = p["stats"]
        assert [r["step"] for r in rows] == list(range(st["forwards"]))
        assert all(set(r) <= set(SCHEMA) and set(SCHEMA) - {"cache"} <= set(r) for r in rows)
        sums = {k: sum(r[k] for r in rows) for k in ("query_rows", "logit_rows", "refresh", "reuse", "requests")}
        assert sums == {"query_rows": st["query_tokens"], "logit_rows": st["logits_rows"],
                        "refresh": st["refresh_request_steps"], "reuse": st["reuse_request_steps"],
                        "requests": st["batched_requests"]}, p["system"]
        assert all(r["refresh"] + r["reuse"] == r["requests"] == r["padded_requests"] for r in rows)
        assert all(not r["graph"] and r["wall_ms"] > 0 for r in rows)
        ts = [r["t_s"] for r in rows]
        assert ts == sorted(ts) and 0 <= ts[0] and ts[-1] < p["duration_s"]
        # keys attended: a Refresh its own canvas, a Reuse its cache
        assert all(r["key_tokens"] == r["query_rows"] for r in rows if not r["reuse"])
        assert any(r["reuse"] for r in rows)
        assert all(r["key_tokens"] > r["query_rows"] for r in rows if not r["refresh"])
        if p["system"] == "engine":
            # its default, cache=auto: every member dual or sparse, as admission chose
            assert all(sum(r["cache"].values()) == r["requests"] and set(r["cache"]) <= {"dual", "sparse"}
                       for r in rows)
            continue
        canvas = None   # a static batch's Reuse forward against its last full forward's keys (the padded canvas)
        for r in rows:
            if r["refresh"]:
                canvas = r["key_tokens"]
            elif p["system"] == "fast-dllm":
                assert r["key_tokens"] == canvas               # the dual cache: every position
            else:
                assert r["key_tokens"] < canvas                # Sparse-dLLM: its kept set and the block
