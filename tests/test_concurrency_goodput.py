"""vLLM `bench serve` conventions in the loop and the metrics: --max-concurrency (the open loop
under a cap on requests in flight), goodput under SLOs, the percentile selection, ITL, peak
concurrency. Model-free: the fake system of test_metrics_results and hand-computed records."""
from __future__ import annotations

import numpy as np
import pytest

from dllm_bench.errors import UserError
from dllm_bench.metrics import serving as metrics
from dllm_bench.metrics.options import MetricOptions, metric_options, parse_goodput
from dllm_bench.serve import loadgen
from dllm_bench.serve.summary import format_summary
from tests.test_metrics_results import FakeSystem, _params, _records


class Counting(FakeSystem):
    """The fake system, counting the requests it holds (handed over, not finished) at each add."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.held: list[int] = []

    def add_request(self, prompt_ids, params, request_id=None, arrival_time=None):
        rid = super().add_request(prompt_ids, params, request_id, arrival_time)
        self.held.append(len(self.waiting) + len(self.running))
        return rid


def _burst(n=8, gap=0.0, long=()):
    return [{"prompt_ids": [1] * (200 if i in long else 5), "gen_length": 4, "arrival": i * gap} for i in range(n)]


def _spans(records):
    return [(r["start_time"], r["finished_time"]) for r in records]


# ---------------------------------------------------------------- the loop under a cap
def test_a_cap_holds_requests_in_arrival_order_and_starts_each_when_a_slot_frees():
    fake = Counting(k=3)
    res = loadgen.run_open_loop(fake, _burst(8, gap=0.001), _params, max_concurrency=2)
    recs = sorted(res["records"], key=lambda r: r["arrival_time"])
    assert len(recs) == 8 and res["not_sent"] == 0 and res["unfinished"] == 0
    assert max(fake.held) == 2                                     # the system never held more
    assert metrics.peak_concurrency(_spans(recs)) == 2             # nor do the records show more
    for r in recs:
        assert r["arrival_time"] == pytest.approx(int(r["request_id"].split("-")[1]) * 0.001, abs=1e-9)
        assert r["start_time"] >= r["arrival_time"]
        assert r["admitted_time"] >= r["start_time"]               # the system saw it from its start
    starts = [r["start_time"] for r in recs]
    assert starts == sorted(starts)                                # first come, first served
    assert sum(r["start_time"] > r["arrival_time"] + 1e-6 for r in recs) >= 5   # most of them waited
    # each waiting request starts the moment an earlier one finished
    finishes = {r["finished_time"] for r in recs}
    assert all(r["start_time"] in finishes for r in recs[2:])
    m = metrics.summarize(res, max_concurrency=2)
    assert m["max_concurrency"] == 2 and m["max_concurrent_requests"] == 2
    waits = [r["start_time"] - r["arrival_time"] for r in recs]
    assert m["mean_client_queue_ms"] == pytest.approx(1e3 * np.mean(waits))
    assert m["mean_e2el_ms"] == pytest.approx(1e3 * np.mean([f - s for s, f in _spans(recs)]))
    assert m["mean_e2el_including_client_queue_ms"] == pytest.approx(
        1e3 * np.mean([r["finished_time"] - r["arrival_time"] for r in recs]))


def test_without_a_cap_every_request_starts_at_its_arrival():
    fake = Counting(k=3)
    res = loadgen.run_open_loop(fake, _burst(6), _params)
    assert max(fake.held) == 6
    assert all(r["start_time"] == r["arrival_time"] for r in res["records"])
    m = metrics.summarize(res)
    assert m["max_concurrent_requests"] == 6 and "max_concurrency" not in m and "mean_client_queue_ms" not in m


def test_a_rejected_request_gives_its_slot_back():
    fake = Counting(k=2)
    res = loadgen.run_open_loop(fake, _burst(6, long={0, 1, 3}), _params, max_concurrency=1)
    assert sorted(r["request_id"] for r in res["rejected"]) == ["req-0", "req-1", "req-3"]
    assert len(res["records"]) == 3 and max(fake.held) == 1 and res["not_sent"] == 0


def test_requests_still_waiting_for_a_slot_at_the_deadline_are_not_sent():
    fake = Counting(k=1000, step_sleep=0.001)
    res = loadgen.run_open_loop(fake, _burst(5), _params, max_concurrency=2, max_duration=0.05)
    assert res["timed_out"] and res["unfinished"] == 2 and res["not_sent"] == 3
    assert sorted(fake.aborted) == sorted(res["unfinished_ids"])


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="max_concurrency"):
        loadgen.run_open_loop(FakeSystem(), _burst(2), _params, max_concurrency=0)


# ---------------------------------------------------------------- metrics (hand-computed)
# _records(): TTFT 1, 1, 2.5, 4 s; E2EL 2, 3, 5, 10 s; TPOT 1/31, 2/31, 2.5/63, 6/63 s; 13 s run.
@pytest.mark.parametrize("slo, good", [
    ({"ttft": 1500}, 2), ({"e2el": 4000}, 2), ({"ttft": 1500, "e2el": 2500}, 1), ({"tpot": 50}, 2),
    ({"tpot": 40, "ttft": 3000}, 2), ({"e2el": 10000}, 4), ({"ttft": 0}, 0)])
def test_goodput_counts_the_requests_meeting_every_slo(slo, good):
    m = metrics.compute_metrics(_records(), 13.0, options=MetricOptions(goodput=tuple(slo.items())))
    assert m["good_requests"] == good and m["request_goodput"] == pytest.approx(good / 13)
    assert m["goodput_slo_ms"] == slo


def test_goodput_cannot_be_told_without_the_metric_an_slo_bounds():
    recs = _records()
    recs[2]["first_token_time"] = None                       # e.g. a whole, unstreamed response
    opts = MetricOptions(goodput=(("ttft", 5000.0),))
    assert metrics.compute_metrics(recs, 13.0, options=opts)["request_goodput"] is None
    m = metrics.compute_metrics(recs, 13.0, options=MetricOptions(goodput=(("e2el", 5000.0),)))
    assert m["good_requests"] == 3                           # E2EL needs no first token
    assert "request_goodput" not in metrics.compute_metrics(recs, 13.0)


def test_selected_percentiles_are_added_to_the_fixed_ones_and_printed():
    opts = MetricOptions(percentile_metrics=("ttft", "e2el"), percentiles=(25.0, 99.9))
    m = metrics.compute_metrics(_records(), 13.0, options=opts)
    ttft, e2el = np.array([1.0, 1.0, 2.5, 4.0]) * 1e3, np.array([2.0, 3.0, 5.0, 10.0]) * 1e3
    assert m["p25_ttft_ms"] == pytest.approx(np.percentile(ttft, 25)) == pytest.approx(1000)
    assert m["p99.9_e2el_ms"] == pytest.approx(np.percentile(e2el, 99.9))
    assert "p25_tpot_ms" not in m and "p99.9_tpot_ms" not in m
    assert m["p99_tpot_ms"] is not None and m["p90_e2el_ms"] == pytest.approx(8500)   # always there
    lines = format_summary({"system": "engine", **m}).splitlines()
    assert "{:<40} {:<10.2f}".format("P25 TTFT (ms):", 1000) in lines
    assert "{:<40} {:<10.2f}".format("P99.9 E2EL (ms):", np.percentile(e2el, 99.9)) in lines
    assert not any("TPOT" in line or "P99 E2EL" in line for line in lines)


def test_itl_is_the_gaps_between_blocks_over_every_request():
    recs = _records()
    recs[0]["itl"], recs[1]["itl"] = [0.5, 0.5], [1.0]
    m = metrics.compute_metrics(recs, 13.0)
    assert m["mean_itl_ms"] == pytest.approx(2000 / 3) and m["median_itl_ms"] == pytest.approx(500)
    assert m["p99_itl_ms"] == pytest.approx(np.percentile([500, 500, 1000], 99))
    assert loadgen.inter_token_latencies([1.0, 1.5, 3.0]) == [0.5, 1.5]
    assert loadgen.inter_token_latencies([2.0]) == [] and loadgen.inter_token_latencies(None) is None
    assert metrics.compute_metrics(_records(), 13.0)["mean_itl_ms"] is None


def test_peak_concurrency_counts_half_open_spans():
    assert metrics.peak_concurrency([]) == 0
    assert metrics.peak_concurrency([(0, 1), (1, 2), (2, 3)]) == 1          # back to back
    assert metrics.peak_concurrency([(0, 3), (1, 2), (1.5, 4), (3, 5)]) == 3
    # [0, 2), [1, 4), [2, 7), [3, 13): r1, r2 and r3 at t = 3
    assert metrics.compute_metrics(_records(), 13.0)["max_concurrent_requests"] == 3


# ---------------------------------------------------------------- the flags' grammar
def test_the_flags_parse_like_vllms():
    o = metric_options("e2el,TTFT", "99,50,90", ["ttft:500 tpot:50", "e2el:3000"])
    assert o.percentile_metrics == ("ttft", "e2el") and o.percentiles == (50.0, 90.0, 99.0)
    assert o.slo_ms == {"ttft": 500.0, "tpot": 50.0, "e2el": 3000.0}
    assert parse_goodput(["ttft:1.5,e2el:0"]) == (("ttft", 1.5), ("e2el", 0.0))
    assert MetricOptions.from_dict(o.to_dict()) == o and metric_options().is_default
    assert metric_options().percentile_metrics == ("ttft", "tpot", "itl", "e2el")


@pytest.mark.parametrize("kw, word", [
    ({"percentile_metrics": "ttft,queue"}, "unknown metric 'queue'"), ({"percentile_metrics": ","}, "give some"),
    ({"metric_percentiles": "50,101"}, "not a percentile"), ({"metric_percentiles": "nan"}, "not a percentile"),
    ({"metric_percentiles": "p99"}, "expected numbers"), ({"goodput": ["ttft=500"]}, "METRIC:MILLISECONDS"),
    ({"goodput": ["itl:5"]}, "unknown metric 'itl'"), ({"goodput": ["ttft:-1"]}, ">= 0"),
    ({"goodput": ["ttft:inf"]}, "finite"), ({"goodput": ["ttft:1", "ttft:2"]}, "twice"),
    ({"goodput": ["ttft:x"]}, "METRIC:MILLISECONDS")])
def test_bad_flags_are_one_line_user_errors(kw, word):
    with pytest.raises(UserError, match=word.replace("(", r"\(")) as e:
        metric_options(**kw)
    assert "\n" not in str(e.value)
