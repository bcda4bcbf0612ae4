"""workloads/: arrival processes, dataset length presets, gen_length mapping, file replay.

tests/fixtures/burstgpt_sample_synthetic.csv is SYNTHETIC: 20 made-up rows in the real BurstGPT v1
column layout (Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type), both models,
both log types, one failed request (GPT-4 at t=77, line 7, 0 response tokens). It is not trace data.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads import arrivals as A
from workloads import burstgpt as B
from workloads import datasets as D
from workloads import serving as S

FIXTURE = Path(__file__).parent / "fixtures" / "burstgpt_sample_synthetic.csv"
HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def gaps(x: np.ndarray) -> np.ndarray:
    return np.diff(x)


# ----------------------------------------------------------------------------- arrivals
def test_poisson_rate_and_cv():
    t = A.poisson_arrivals(4.0, num_prompts=20000, seed=0)
    g = gaps(t)
    assert t[0] == 0.0 and len(t) == 20000 and np.all(g >= 0)
    # sd of the mean gap * rps is 1/sqrt(n) ~ 0.007, so 0.03 is > 4 sigma.
    assert abs(g.mean() * 4.0 - 1) < 0.03
    assert abs(g.std() / g.mean() - 1) < 0.05


@pytest.mark.parametrize("k", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_gamma_rate_and_cv(k):
    # n = 50000 so that even at CV 2 (k = 0.25) the mean-gap error sd is ~0.009.
    g = gaps(A.gamma_arrivals(2.0, k, num_prompts=50000, seed=1))
    assert abs(g.mean() * 2.0 - 1) < 0.03
    assert abs((g.std() / g.mean()) / (1 / math.sqrt(k)) - 1) < 0.05


def test_infinite_burstiness_gives_constant_gaps():
    np.testing.assert_allclose(gaps(A.gamma_arrivals(5.0, math.inf, num_prompts=10)), 0.2)


def test_infinite_rate_all_at_zero():
    assert np.array_equal(A.poisson_arrivals(math.inf, num_prompts=7), np.zeros(7))
    assert np.array_equal(A.gamma_arrivals(float("inf"), 0.5, num_prompts=3), np.zeros(3))
    with pytest.raises(ValueError, match="needs num_prompts"):
        A.poisson_arrivals(math.inf, duration=10)


def test_seeds_reproduce_and_differ():
    for fn in (lambda s: A.poisson_arrivals(3, num_prompts=500, seed=s),
               lambda s: A.gamma_arrivals(3, 0.5, num_prompts=500, seed=s)):
        assert np.array_equal(fn(7), fn(7))
        assert not np.array_equal(fn(7), fn(8))


def test_duration_bound_and_prefix_consistency():
    d = A.poisson_arrivals(5.0, duration=2000.0, seed=3)
    assert d.max() < 2000.0 and abs(len(d) / (5.0 * 2000.0) - 1) < 0.05
    n = A.poisson_arrivals(5.0, num_prompts=len(d), seed=3)
    np.testing.assert_allclose(n, d)  # same seed: duration- and count-bounded runs agree
    both = A.gamma_arrivals(5.0, 0.5, num_prompts=10, duration=1e6, seed=3)
    assert len(both) == 10
    assert len(A.gamma_arrivals(5.0, 0.5, num_prompts=10**6, duration=3.0, seed=3)) < 100
    assert len(A.poisson_arrivals(5.0, num_prompts=5.0)) == 5  # 5.0 (e.g. from JSON/CLI) is fine


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rps=st.floats(0.01, 100), k=st.floats(0.05, 20), n=st.integers(1, 300),
       seed=st.integers(0, 2**32))
def test_arrivals_shape_property(rps, k, n, seed):
    t = A.gamma_arrivals(rps, k, num_prompts=n, seed=seed)
    assert len(t) == n and t[0] == 0.0 and np.all(np.diff(t) >= 0) and np.all(np.isfinite(t))


@pytest.mark.parametrize("call,fragment", [
    (lambda: A.poisson_arrivals(0, num_prompts=5), "rps must be > 0"),
    (lambda: A.poisson_arrivals(-2, num_prompts=5), "rps must be > 0"),
    (lambda: A.poisson_arrivals(float("nan"), num_prompts=5), "rps must be > 0"),
    (lambda: A.poisson_arrivals("fast", num_prompts=5), "rps must be a number"),
    (lambda: A.gamma_arrivals(1, 0, num_prompts=5), "burstiness must be > 0"),
    (lambda: A.gamma_arrivals(1, -0.5, num_prompts=5), "burstiness must be > 0"),
    (lambda: A.poisson_arrivals(1), "num_prompts or duration"),
    (lambda: A.poisson_arrivals(1, num_prompts=0), "num_prompts must be an integer >= 1"),
    (lambda: A.poisson_arrivals(1, duration=-1), "duration must be"),
    (lambda: A.poisson_arrivals(1, duration="10"), "duration must be"),
    (lambda: A.poisson_arrivals(1, num_prompts=2.5), "num_prompts must be an integer"),
    (lambda: A.poisson_arrivals(1, num_prompts=3, seed=-1), "seed must be"),
    (lambda: A.generate_arrivals("poisson", 1, burstiness=0.5, num_prompts=3), "only applies to gamma"),
    (lambda: A.generate_arrivals("uniform", 1, num_prompts=3), "unknown arrival process"),
    (lambda: A.generate_arrivals("trace", num_prompts=3), "need timestamps"),
])
def test_arrival_validation(call, fragment):
    with pytest.raises(ValueError, match=fragment):
        call()


def test_trace_replay_and_time_scale():
    ts = [100.0, 101.0, 101.0, 105.0, 130.0]
    np.testing.assert_allclose(A.trace_arrivals(ts), [0, 1, 1, 5, 30])
    np.testing.assert_allclose(A.trace_arrivals(ts, time_scale=10), [0, 0.1, 0.1, 0.5, 3.0])
    np.testing.assert_allclose(A.trace_arrivals(ts, num_prompts=2), [0, 1])
    np.testing.assert_allclose(A.trace_arrivals(ts, time_scale=2, duration=3), [0, 0.5, 0.5, 2.5])
    for bad, frag in [([], "no timestamps"), ([3, 1], "non-decreasing"), ([0, math.inf], "finite")]:
        with pytest.raises(ValueError, match=frag):
            A.trace_arrivals(bad)
    with pytest.raises(ValueError, match="time_scale"):
        A.trace_arrivals(ts, time_scale=0)


# ----------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", ["livebench", "osc", "burstgpt"])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_preset_lengths_within_documented_bounds(name, scale):
    w = S.build_workload(name, num_prompts=3000, rps=1.0, seed=0, length_scale=scale, gen_cap=None)
    p = np.array([r.prompt_len for r in w])
    o = np.array([r.output_len for r in w])
    pre = D.PRESETS[name]
    lo, hi = D.scale_lengths(pre.prompt_range, scale)
    assert p.min() >= lo and p.max() <= hi
    lo, hi = D.scale_lengths(pre.output_range, scale)
    assert o.min() >= lo and o.max() <= hi


def test_preset_means_match_sources():
    rng = np.random.default_rng(0)
    p, o = D.PRESETS["osc"].sample(20000, rng)
    assert 330 < p.mean() < 350 and 36 < o.mean() < 41   # truncated N(350,100): ~340; U[24,53]: 38.5
    p, o = D.PRESETS["livebench"].sample(20000, rng)
    assert abs(p.mean() - 600) < 10 and abs(o.mean() - 250) < 5
    req, resp = D.PRESETS["burstgpt"].sample(20000, rng)
    assert abs(np.median(req) - 400) < 30 and abs(req.mean() - 620) < 40
    assert abs(resp.mean() - 205) < 15
    slope = np.polyfit(req, resp, 1)[0]            # response-vs-request trend of README Fig. 4
    assert 0.13 < slope < 0.21


def test_random_preset_like_vllm():
    assert D.random_bounds(1024, 128, 0.0) == ((1024, 1024), (128, 128))
    assert D.random_bounds(100, 10, 0.5) == ((50, 150), (5, 15))
    w = S.build_workload("random", num_prompts=500, seed=1, random_input_len=100,
                         random_output_len=10, random_range_ratio=0.5, gen_cap=None)
    p = [r.prompt_len for r in w]
    assert min(p) >= 50 and max(p) <= 150 and len(set(p)) > 50
    with pytest.raises(ValueError, match="range_ratio"):
        D.random_bounds(100, 10, 1.0)


def test_length_scale_min_one_token():
    w = S.build_workload("osc", num_prompts=50, seed=0, length_scale=1e-4, block_length=4)
    assert all(r.prompt_len == 1 and r.output_len == 1 and r.gen_length == 4 for r in w)
    with pytest.raises(ValueError, match="length_scale"):
        S.build_workload("osc", num_prompts=5, length_scale=0)


# ----------------------------------------------------------------------------- build_workload
def test_synthetic_prompts_avoid_special_ids_and_are_seeded():
    kw = dict(num_prompts=40, rps=2.0, seed=5, vocab_size=50, special_ids=[0, 1, 49],
              length_scale=0.25, block_length=8, gen_cap=64)
    w = S.build_workload("livebench", **kw)
    ids = np.concatenate([r.prompt_ids for r in w])
    assert ids.min() >= 2 and ids.max() <= 48
    assert all(len(r.prompt_ids) == r.prompt_len for r in w)
    assert w == S.build_workload("livebench", **kw)
    assert w != S.build_workload("livebench", **{**kw, "seed": 6})
    # arrivals use their own stream: same seed -> same arrival times for any dataset
    osc = S.build_workload("osc", **kw)
    assert [r.arrival for r in osc] == [r.arrival for r in w]
    assert all(r.prompt_ids is None for r in S.build_workload("osc", num_prompts=3))


def test_max_prompt_len_gen_cap_and_fixed_gen_length():
    w = S.build_workload("livebench", num_prompts=200, seed=0, vocab_size=100, max_prompt_len=400,
                         block_length=32, gen_cap=256)
    assert max(r.prompt_len for r in w) == 400 and all(len(r.prompt_ids) <= 400 for r in w)
    assert all(r.gen_length % 32 == 0 and 32 <= r.gen_length <= 256 for r in w)
    assert all(r.gen_length >= min(r.output_len, 256) for r in w)
    w = S.build_workload("osc", num_prompts=5, fixed_gen_length=256, block_length=32)
    assert {r.gen_length for r in w} == {256}
    with pytest.raises(ValueError, match="not a multiple"):
        S.build_workload("osc", num_prompts=5, fixed_gen_length=100, block_length=32)


@pytest.mark.parametrize("kw,fragment", [
    (dict(dataset="sharegpt", num_prompts=3), "unknown dataset"),
    (dict(dataset="custom", num_prompts=3), "needs a dataset_path"),
    (dict(dataset="osc", num_prompts=3, arrivals="trace"), "need a dataset_path"),
    (dict(dataset="osc", num_prompts=3, model_filter="GPT-4"), "model_filter"),
    (dict(dataset="osc", num_prompts=3, vocab_size=2, special_ids=[0, 1]), "no ordinary token"),
    (dict(dataset="osc", num_prompts=3, gen_cap=16, block_length=32), "smaller than one block"),
])
def test_build_workload_validation(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        S.build_workload(**kw)


def test_describe():
    w = S.build_workload("osc", num_prompts=1000, rps=2.0, seed=0, length_scale=0.125,
                         block_length=8, gen_cap=64)
    d = S.describe(w)
    assert d["num_requests"] == 1000 and d["datasets"] == {"osc": 1000}
    assert abs(d["offered_rps"] / 2.0 - 1) < 0.1 and d["duration_s"] == w[-1].arrival
    assert 12 <= d["prompt_len_min"] <= d["prompt_len_mean"] <= d["prompt_len_max"] <= 64
    assert d["gen_length_min"] == d["gen_length_max"] == 8  # 24-53 * 0.125 -> 3-7 -> one block
    assert S.describe(S.build_workload("osc", num_prompts=4))["offered_rps"] == math.inf
    assert S.describe([]) == {"num_requests": 0}


# ----------------------------------------------------------------------------- gen_length
@pytest.mark.parametrize("out,block,cap,expected", [
    (64, 32, 256, 64),     # exact multiple
    (65, 32, 256, 96),     # round up
    (1, 32, 256, 32),      # at least one block
    (0, 32, 256, 32),
    (1000, 32, 256, 256),  # cap
    (1000, 32, 100, 96),   # cap rounded down to a block multiple
    (1000, 32, None, 1024),
])
def test_gen_length_cases(out, block, cap, expected):
    assert S.gen_length_for(out, block, cap) == expected


def test_gen_length_errors_and_description():
    with pytest.raises(ValueError, match="smaller than one block"):
        S.gen_length_for(10, 32, 31)
    with pytest.raises(ValueError, match="block_length"):
        S.gen_length_for(10, 0, 64)
    with pytest.raises(ValueError, match="output_len"):
        S.gen_length_for(-1, 32, 64)
    text = S.describe_gen_mapping(32, 100)
    assert "capped at 96" in text and "33->64" in text and "\n" not in text
    assert "fixed" in S.describe_gen_mapping(32, 256, fixed_gen_length=256)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(out=st.integers(0, 5000), block=st.integers(1, 128), cap_blocks=st.integers(1, 64),
       extra=st.integers(0, 127))
def test_gen_length_invariants(out, block, cap_blocks, extra):
    cap = cap_blocks * block + extra % block
    g = S.gen_length_for(out, block, cap)
    assert g % block == 0 and block <= g <= cap
    assert g >= min(out, cap_blocks * block)            # covers the output unless capped
    assert g == block or g - block < out                # and is the smallest such multiple
    assert S.gen_length_for(out, block) >= g            # the cap never increases it


# ----------------------------------------------------------------------------- BurstGPT CSV
def test_burstgpt_fixture_parsing():
    df = B.load_burstgpt_csv(FIXTURE)
    assert len(df) == 19 and (df["response_tokens"] > 0).all()
    assert 7 not in set(df["line"])                      # the failed GPT-4 row
    assert df["timestamp"].is_monotonic_increasing
    assert len(B.load_burstgpt_csv(FIXTURE, model_filter="GPT-4")) == 5
    assert len(B.load_burstgpt_csv(FIXTURE, model_filter="chatgpt")) == 14
    with pytest.raises(ValueError, match="not a BurstGPT model"):
        B.load_burstgpt_csv(FIXTURE, model_filter="Claude")


def test_burstgpt_trace_replay_workload():
    w = S.build_workload("burstgpt", dataset_path=FIXTURE, arrivals="trace", time_scale=10,
                         model_filter="GPT-4", vocab_size=100, block_length=32, gen_cap=256)
    assert [r.arrival for r in w] == pytest.approx([0.0, 11.1, 16.9, 23.7, 34.2])
    assert [r.trace_prompt_len for r in w] == [903, 2011, 655, 147, 1204]
    assert [r.gen_length for r in w] == [256, 256, 256, 224, 256]
    assert w[0].source == "burstgpt:burstgpt_sample_synthetic.csv:line 4:GPT-4"
    assert len(S.build_workload("burstgpt", dataset_path=FIXTURE, arrivals="trace", num_prompts=3)) == 3
    # Poisson arrivals over the CSV's lengths: rows sampled with the seed, with replacement past 19.
    kw = dict(dataset_path=FIXTURE, num_prompts=50, rps=1.0, seed=2, length_scale=0.5)
    w = S.build_workload("burstgpt", **kw)
    assert len(w) == 50 and w == S.build_workload("burstgpt", **kw)
    assert all(r.prompt_len == max(1, round(r.trace_prompt_len * 0.5)) for r in w)


def test_burstgpt_v3_columns_by_name(tmp_path):
    f = tmp_path / "v3.csv"
    f.write_text("Session ID,Log Type,Response tokens,Timestamp,Request tokens,Model,Elapsed time\n"
                 "s1,Conversation log,20,5.5,100,GPT-4,1.0\ns2,API log,0,6,10,GPT-4,1.0\n")
    df = B.load_burstgpt_csv(f)
    assert df[["timestamp", "request_tokens", "response_tokens"]].values.tolist() == [[5.5, 100, 20]]


@pytest.mark.parametrize("content,fragment", [
    ("", "file is empty"),
    (HEADER, "no data rows"),
    ("Timestamp,Model,Request tokens\n1,GPT-4,5\n", "missing column\\(s\\) Response tokens"),
    ("time,model\n1,2\n", "missing column\\(s\\) Timestamp, Request tokens, Response tokens"),
    (HEADER + "1,GPT-4,10,5,15,API log\n2,GPT-4,ten,5,15,API log\n",
     "column 'Request tokens' has a non-numeric value 'ten' at line 3"),
    (HEADER + "1,GPT-4,10,,10,API log\n", "column 'Response tokens' has a non-numeric value ''"),
    (HEADER + "1,GPT-4,-10,5,15,API log\n", "negative value"),
    (HEADER + "1,GPT-4,10,0,10,API log\n", "every row is a failed request"),
])
def test_burstgpt_malformed_csv(tmp_path, content, fragment):
    f = tmp_path / "bad.csv"
    f.write_text(content)
    with pytest.raises(ValueError, match=fragment) as e:
        B.load_burstgpt_csv(f)
    assert "\n" not in str(e.value) and str(f) in str(e.value)


def test_burstgpt_filter_leaves_nothing_and_missing_file(tmp_path):
    f = tmp_path / "chatgpt_only.csv"
    f.write_text(HEADER + "1,ChatGPT,10,5,15,API log\n")
    with pytest.raises(ValueError, match="no successful GPT-4 rows \\(models present: ChatGPT\\)"):
        B.load_burstgpt_csv(f, model_filter="GPT-4")
    with pytest.raises(ValueError, match="file not found"):
        B.load_burstgpt_csv(tmp_path / "nope.csv")


# ----------------------------------------------------------------------------- JSONL
def tok(text: str) -> list[int]:
    return [ord(c) % 97 + 3 for c in text]


def test_jsonl_good(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt_len": 40, "output_len": 10, "timestamp": 2.0}\n\n'
                 '{"prompt": "hello world", "output_len": 3.0, "timestamp": 1.0, "id": "x"}\n')
    recs = D.load_jsonl(f, tokenize=tok)
    assert [(r["prompt_len"], r["output_len"], r["line"]) for r in recs] == [(40, 10, 1), (11, 3, 3)]
    assert recs[0]["prompt_ids"] is None and recs[1]["prompt_ids"] == tok("hello world")
    w = S.build_workload("custom", dataset_path=f, arrivals="trace", tokenize=tok, vocab_size=50,
                         length_scale=0.5, max_prompt_len=8, block_length=4)
    # sorted by timestamp; the real prompt is not scaled, only cut to its last 8 tokens
    assert [r.arrival for r in w] == [0.0, 1.0]
    assert w[0].prompt_ids == tok("hello world")[-8:] and w[0].output_len == 2 and w[0].gen_length == 4
    assert w[1].prompt_len == 8 and w[1].output_len == 5 and len(w[1].prompt_ids) == 8


@pytest.mark.parametrize("content,fragment", [
    ('{"prompt_len": 4, "output_len": 2}\n{"prompt_len": 4, "output_len": 2\n', ":2: invalid JSON"),
    ('[1, 2]\n', ":1: expected a JSON object"),
    ('{"prompt_len": 4}\n', ":1: missing 'output_len'"),
    ('\n{"prompt_len": 4, "output_len": 0}\n', ":2: 'output_len' must be an integer >= 1"),
    ('{"prompt_len": 4, "output_len": "7"}\n', "'output_len' must be an integer"),
    ('{"prompt_len": 4, "output_len": true}\n', "'output_len' must be an integer"),
    ('{"prompt_len": 2.5, "output_len": 3}\n', "'prompt_len' must be an integer"),
    ('{"output_len": 3}\n', ":1: needs 'prompt' \\(text\\) or 'prompt_len'"),
    ('{"prompt": "hi", "output_len": 3}\n', ":1: has 'prompt' text but no tokenizer"),
    ('{"prompt_len": 3, "output_len": 3, "timestamp": "now"}\n', "'timestamp' must be a finite"),
    ("\n\n", "no records"),
])
def test_jsonl_bad(tmp_path, content, fragment):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(ValueError, match=fragment):
        D.load_jsonl(f)


def test_jsonl_trace_needs_timestamps(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt_len": 4, "output_len": 2, "timestamp": 0}\n{"prompt_len": 4, "output_len": 2}\n')
    with pytest.raises(ValueError, match="line 2 has none"):
        S.build_workload("custom", dataset_path=f, arrivals="trace")
    with pytest.raises(ValueError, match="only applies to BurstGPT CSV"):
        S.build_workload("custom", dataset_path=f, num_prompts=2, model_filter="GPT-4")
