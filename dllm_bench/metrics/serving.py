"""Serving metrics with vLLM `bench serve` names and definitions, plus the dLLM-Serve paper's
jitter figures and dLLM counters. Pure functions over per-request records: no engine import.

A record is a dict or an object with the `RequestOutput` fields (docs/ARCHITECTURE.md). Times
are seconds on one clock (the driver stores them relative to the benchmark start); only
differences are used here, so absolute `perf_counter` values work too. Latencies count from a
request's `start_time` (when it was handed to the system: later than its `arrival_time` only
when `--max-concurrency` made it wait, as vLLM counts them), else from its arrival.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dllm_bench.metrics.options import MetricOptions, percentile_word

# Percentiles every summary holds, whatever --metric-percentiles selects (tables, plots and the
# report read them): p99 of each latency (vLLM's default) and, for e2el, p50/p90 as the paper's
# load curves need more than the tail.
BASE_PERCENTILES = {"ttft": (99,), "tpot": (99,), "itl": (99,), "e2el": (50, 90, 99), "queue": (99,)}
E2EL_PERCENTILES = BASE_PERCENTILES["e2el"]
TPF_PERCENTILES = (50, 90)      # per-request tokens per forward: its distribution under parallel decoding

# stats() keys copied through unchanged (cumulative counters or peaks of the system under test).
STAT_KEYS = ("forwards", "steps", "query_tokens", "logits_rows", "max_logits_rows_in_step",
             "peak_kv_bytes", "kv_pool_bytes", "peak_memory_bytes", "memory_budget_bytes", "within_budget",
             "peak_measured_in", "http_overhead_median_ms", "http_overhead_max_ms",
             "mean_batch_size", "requests_dual", "requests_sparse", "requests_none")
# Only the engine reports these (requests admitted per cache mode): absent, not None, elsewhere.
ENGINE_ONLY_STATS = ("requests_dual", "requests_sparse", "requests_none")

# Columns of the ratio table: "higher is better" metrics are divided by the best baseline,
# "lower is better" ones divide the best baseline, so every ratio > 1 means better (the
# convention of vLLM's compare-json-results.py and the paper's Fig. 5 "gains").
HIGHER_BETTER = ("request_throughput", "output_throughput")
LOWER_BETTER = ("mean_e2el_ms", "p99_e2el_ms", "mean_ttft_ms", "latency_std_ms", "latency_span_ms")


def _get(rec: Any, name: str, default: Any = None) -> Any:
    if isinstance(rec, Mapping):
        return rec.get(name, default)
    return getattr(rec, name, default)


def normalize_record(rec: Any) -> dict:
    """Flat dict with the fields metrics need; lengths derived from id lists when absent."""
    out_len = _get(rec, "output_len")
    if out_len is None:
        out_len = len(_get(rec, "token_ids") or ())
    prompt_len = _get(rec, "prompt_len")
    if prompt_len is None:
        prompt_len = len(_get(rec, "prompt_ids") or ())
    d = {"request_id": _get(rec, "request_id"), "prompt_len": int(prompt_len), "output_len": int(out_len)}
    for k in ("arrival_time", "start_time", "admitted_time", "first_token_time", "finished_time",
              "nfe", "logits_rows", "kv_tokens", "kv_bytes"):
        d[k] = _get(rec, k)
    if d["start_time"] is None:
        d["start_time"] = d["arrival_time"]
    return d


def _stats_ms(values: Sequence[float], prefix: str, *, mean=True, median=True, std=True,
              percentiles: Iterable[float] = (99,)) -> dict:
    """mean/median/std/pXX of `values` (seconds) in ms; None when there is no sample.
    np.percentile with its default linear interpolation, as vLLM does; std is the population
    std (ddof=0), also as vLLM (np.std)."""
    a = np.asarray(values, dtype=float) * 1000.0
    out: dict[str, float | None] = {}
    if mean:
        out[f"mean_{prefix}_ms"] = float(np.mean(a)) if a.size else None
    if median:
        out[f"median_{prefix}_ms"] = float(np.median(a)) if a.size else None
    if std:
        out[f"std_{prefix}_ms"] = float(np.std(a)) if a.size else None
    for p in sorted(set(float(q) for q in percentiles)):
        out[f"p{percentile_word(p)}_{prefix}_ms"] = float(np.percentile(a, p)) if a.size else None
    return out


def peak_concurrency(spans: Iterable[tuple[float, float]]) -> int:
    """The most requests in flight at once over half-open [start, end) spans (a request that
    ends as another starts does not overlap it), as vLLM's max_concurrent_requests."""
    events = sorted((t, d) for s, e in spans for t, d in ((s, 1), (e, -1)))
    peak = cur = 0
    for _, d in events:   # at equal times -1 sorts first
        cur += d
        peak = max(peak, cur)
    return peak


def good_requests(df: pd.DataFrame, slo_ms: Mapping[str, float]) -> int | None:
    """Finished requests meeting every SLO (ms), vLLM's goodput count: TTFT, TPOT (0 for a
    one-token output) and E2EL each at most its SLO. None when a request lacks a metric an SLO
    bounds (e.g. TTFT of whole, unstreamed responses): goodput cannot be told."""
    ttft = df["first_token_time"] - df["start_time"]
    per = {"ttft": ttft, "e2el": df["finished_time"] - df["start_time"],
           "tpot": ((df["finished_time"] - df["first_token_time"]) / (df["output_len"] - 1)).where(
               df["output_len"] > 1, 0.0).where(ttft.notna())}
    ok = pd.Series(True, index=df.index)
    for name, slo in slo_ms.items():
        v = per[name].astype(float)
        if v.isna().any():
            return None
        ok &= v <= slo / 1000.0
    return int(ok.sum())


def compute_metrics(records: Iterable[Any], duration_s: float, *, rejected: int | Sequence = 0,
                    unfinished: int = 0, stats: Mapping | None = None, options: MetricOptions | None = None,
                    max_concurrency: int | None = None) -> dict:
    """Flat dict of serving metrics for one (system, workload, rps) point.

    records: finished requests; rejected: count or list of rejected requests (ValueError at
    add_request); unfinished: requests added but aborted (interrupt / max_duration);
    stats: the system's stats() over this point (counters are copied through); options: the
    percentiles and goodput SLOs asked for (dllm_bench.metrics.options); max_concurrency: the
    cap the point ran under (adds the client-side queue, vLLM's `client_queue_time`).
    """
    options = options or MetricOptions()
    records = list(records)
    itls = [float(x) for r in records for x in (_get(r, "itl") or ())]
    recs = [normalize_record(r) for r in records]
    n_rej = rejected if isinstance(rejected, int) else len(rejected)
    duration_s = float(duration_s)
    df = pd.DataFrame(recs, columns=list(normalize_record({}).keys()))
    # None -> NaN even when a column is all-None (object dtype would break the arithmetic).
    for c in df.columns.drop("request_id"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    in_tok = int(df["prompt_len"].sum())
    out_tok = int(df["output_len"].sum())
    rate = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: None)

    m: dict[str, Any] = {
        "completed": len(recs), "rejected": n_rej, "unfinished": int(unfinished),
        # vLLM's "failed": every request that was sent but produced no output.
        "failed": n_rej + int(unfinished),
        "duration_s": duration_s, "duration": duration_s,    # `duration`: vLLM's key
        "total_input_tokens": in_tok, "total_output_tokens": out_tok,
        "request_throughput": rate(len(recs)),
        "output_throughput": rate(out_tok),
        "total_token_throughput": rate(in_tok + out_tok),
    }

    def pcts(name: str) -> tuple[float, ...]:
        return BASE_PERCENTILES[name] + (options.percentiles if name in options.percentile_metrics else ())

    e2el = (df["finished_time"] - df["start_time"]).dropna().astype(float)
    m.update(_stats_ms(e2el, "e2el", percentiles=pcts("e2el")))
    # TTFT = first committed block - start (dLLMs commit a block at a time); systems that
    # do not report it are left out rather than imputed.
    ttft = (df["first_token_time"] - df["start_time"]).dropna().astype(float)
    m.update(_stats_ms(ttft, "ttft", percentiles=pcts("ttft")))
    # TPOT keeps vLLM's token-normalized definition: (e2el - ttft) / (output_len - 1).
    both = df.dropna(subset=["finished_time", "first_token_time", "start_time"])
    both = both[both["output_len"] > 1]
    tpot = ((both["finished_time"] - both["first_token_time"]) / (both["output_len"] - 1)).astype(float)
    m.update(_stats_ms(tpot, "tpot", percentiles=pcts("tpot")))
    # ITL: the gaps between a request's successive blocks (streamed chunks), over all requests.
    m.update(_stats_ms(itls, "itl", percentiles=pcts("itl")))
    queue = (df["admitted_time"] - df["start_time"]).dropna().astype(float)
    m.update(_stats_ms(queue, "queue", std=False))
    m["percentile_metrics"], m["metric_percentiles"] = list(options.percentile_metrics), list(options.percentiles)
    done = df.dropna(subset=["start_time", "finished_time"])
    m["max_concurrent_requests"] = peak_concurrency(zip(done["start_time"], done["finished_time"], strict=True))
    if max_concurrency is not None:
        m["max_concurrency"] = int(max_concurrency)
        waited = (df["start_time"] - df["arrival_time"]).dropna().astype(float)
        m.update(_stats_ms(waited, "client_queue", percentiles=options.percentiles))
        incl = (df["finished_time"] - df["arrival_time"]).dropna().astype(float)
        m.update(_stats_ms(incl, "e2el_including_client_queue", percentiles=options.percentiles))
    if options.goodput:
        good = good_requests(df.dropna(subset=["finished_time"]), options.slo_ms)
        m["goodput_slo_ms"] = options.slo_ms
        m["good_requests"] = good
        m["request_goodput"] = None if good is None else rate(good)

    # Paper Fig. 5 jitter: sigma and tail span (max - min) of end-to-end latency.
    m["latency_std_ms"] = m["std_e2el_ms"]
    m["latency_span_ms"] = float((e2el.max() - e2el.min()) * 1000.0) if len(e2el) else None

    # dLLM counters. forwards/logits come from the system (exact counters, CI-comparable).
    stats = dict(stats or {})
    for k in STAT_KEYS:
        if k in ENGINE_ONLY_STATS and k not in stats:
            continue
        v = stats.get(k)
        m[k] = int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else v
    if m["logits_rows"] is None and df["logits_rows"].notna().any():
        m["logits_rows"] = int(df["logits_rows"].fillna(0).sum())
    fw = m["forwards"]
    m["tokens_per_forward"] = out_tok / fw if fw else None
    nfe = df["nfe"].dropna()
    m["mean_nfe"] = float(nfe.mean()) if len(nfe) else None
    # Per request: TPF = its output tokens / its forwards (what parallel decoding buys; `fixed` at
    # one token per step gives 1), its mean and spread, and the forwards its blocks took.
    tpf = (df["output_len"] / df["nfe"].where(df["nfe"] > 0)).dropna().astype(float)
    m["mean_tpf"] = float(tpf.mean()) if len(tpf) else None
    for p in TPF_PERCENTILES:
        m[f"p{p}_tpf"] = float(np.percentile(tpf, p)) if len(tpf) else None
    spb = [int(s) for r in records for s in (_get(r, "steps_per_block") or ())]
    m["mean_steps_per_block"] = float(np.mean(spb)) if spb else None
    return m


def summarize(result: Mapping, options: MetricOptions | None = None, max_concurrency: int | None = None) -> dict:
    """compute_metrics over a driver result (see driver.run_open_loop), plus its run flags:
    an interrupted point is a partial measurement (results.finished_points re-runs it)."""
    m = compute_metrics(result["records"], result["duration"], rejected=result["rejected"],
                        unfinished=result.get("unfinished", 0), stats=result.get("stats"),
                        options=options, max_concurrency=max_concurrency)
    m["not_sent"] = int(result.get("not_sent", 0))
    m["interrupted"] = bool(result.get("interrupted", False))
    m["timed_out"] = bool(result.get("timed_out", False))
    return m


def best_baseline(summaries: Mapping[str, Mapping], baseline_names: Iterable[str]) -> str | None:
    """The baseline with the highest request throughput (ties: first in baseline_names)."""
    best, best_v = None, -math.inf
    for name in baseline_names:
        s = summaries.get(name)
        v = s.get("request_throughput") if s else None
        if v is not None and v > best_v:
            best, best_v = name, v
    return best


def _ratio(num, den):
    if num is None or den is None or den == 0 or (isinstance(num, float) and math.isnan(num)):
        return None
    return num / den


def ratio_table(summaries: Mapping[str, Mapping], baseline_names: Iterable[str]) -> pd.DataFrame:
    """One row per system: its metrics and `<metric>_x` ratios vs the best baseline.

    Throughput ratios are system / best; latency and jitter ratios are best / system, so > 1
    is always better (paper Fig. 5 plots exactly these "gains" for sigma and span). The best
    baseline's name is in `df.attrs["best_baseline"]` and the `best_baseline` column.
    """
    baseline_names = list(baseline_names)
    ref_name = best_baseline(summaries, baseline_names)
    ref = summaries.get(ref_name, {}) if ref_name else {}
    rows = []
    for name, s in summaries.items():
        row: dict[str, Any] = {"system": name, "is_baseline": name in baseline_names,
                               "best_baseline": ref_name}
        for k in HIGHER_BETTER + LOWER_BETTER:
            row[k] = s.get(k)
        for k in HIGHER_BETTER:
            row[f"{k}_x"] = _ratio(s.get(k), ref.get(k))
        for k in LOWER_BETTER:
            row[f"{k}_x"] = _ratio(ref.get(k), s.get(k))
        rows.append(row)
    df = pd.DataFrame(rows).set_index("system") if rows else pd.DataFrame()
    df.attrs["best_baseline"] = ref_name
    return df
