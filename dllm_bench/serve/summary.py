"""Human output for `dllm-bench serve`: vLLM's printed result block (same 50-char rulers and
`{:<40} {:<10.2f}` rows, so a vLLM user reads it at a glance) with a "Diffusion Decoding"
section, and a side-by-side Rich table of all systems with ratios vs the best baseline.
Everything goes to stderr by default so that `--json` can own stdout.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dllm_bench.console import console as stderr_console
from dllm_bench.metrics.options import DEFAULT_PERCENTILES, PERCENTILE_METRICS, percentile_word
from dllm_bench.metrics.serving import ratio_table
from dllm_bench.repeats import batch_text, cell, compare
from dllm_bench.serve.points import display_label

WIDTH = 50
MIB = 1024 * 1024
# Below this many finished requests a point's P99, σ and span are a handful of samples: its
# latencies and jitter are printed, but no ratio is drawn from them (nor from its throughput).
MIN_REQUESTS_FOR_RATIOS = 10
RATIO_KEYS = ("output_throughput", "mean_e2el_ms", "latency_std_ms", "latency_span_ms")


def finished_requests(summary: Mapping[str, Any]) -> int | None:
    """A point's finished requests (over repeats, the fewest any repeat finished); None when the
    summary does not say."""
    n = summary.get("completed_min", summary.get("completed"))
    return None if n is None else int(n)


def too_few_requests(summary: Mapping[str, Any]) -> bool:
    n = finished_requests(summary)
    return n is not None and n < MIN_REQUESTS_FOR_RATIOS


def too_few_line(summaries: Iterable[Mapping[str, Any]]) -> str | None:
    """The note under a table whose points are too small for ratios, or None."""
    few = sorted({finished_requests(s) for s in summaries if too_few_requests(s)})
    if not few:
        return None
    return (f"too few requests for ratios: {', '.join(map(str, few))} finished per point (< {MIN_REQUESTS_FOR_RATIOS}); "
            "the latency percentiles and jitter above are those few requests' own, and no ratio is drawn from them "
            f"(--num-prompts {MIN_REQUESTS_FOR_RATIOS} or more)")


def comparisons(points: list[dict], baseline_labels: set[str]) -> list[dict]:
    """Per (dataset, rps): the ratio table rows (ratios vs the best baseline). A row whose point,
    or whose reference, finished too few requests keeps its metrics but has no ratios
    (`too_few_requests`)."""
    groups: dict[tuple, dict] = {}
    for s in points:
        groups.setdefault((s.get("dataset", ""), s["rps"]), {})[display_label(s)] = s
    out = []
    for (ds, rps), sums in groups.items():
        bl = [k for k, s in sums.items() if s["system"] in baseline_labels]
        rt = ratio_table(sums, bl)
        rows = [] if rt.empty else [{"system": k, **{c: (None if isinstance(v, float) and math.isnan(v) else v)
                                                     for c, v in r.items()}} for k, r in rt.iterrows()]
        ref = sums.get(rt.attrs.get("best_baseline"))
        for row in rows:  # the ratio's interval over the repeats, and whether it is beyond noise
            if too_few_requests(sums[row["system"]]) or (ref is not None and too_few_requests(ref)):
                row.update({f"{m}_x": None for m in RATIO_KEYS}, too_few_requests=True)
                continue
            if ref is None or sums[row["system"]] is ref:
                continue
            for m, higher in (("output_throughput", True), ("mean_e2el_ms", False)):
                r, v = compare(sums[row["system"]], ref, m, higher)
                row[f"{m}_x_min"], row[f"{m}_x_max"], row[f"{m}_vs_best"] = r.lo, r.hi, v
        out.append({"dataset": ds, "rps": rps, "best_baseline": rt.attrs.get("best_baseline"),
                    "summaries": sums, "baselines": bl, "rows": rows})
    return out


def _ruler(title: str = "", c: str = "-") -> str:
    return "{s:{c}^{n}}".format(s=title, c=c, n=WIDTH)


def _row(label: str, value: Any, unit_scale: float = 1.0) -> str:
    if value is None:
        return "{:<40} {:<10}".format(label, "n/a")
    if isinstance(value, str):
        return f"{label:<40} {value:<10}"
    if isinstance(value, bool) or isinstance(value, int) and unit_scale == 1.0:
        return f"{label:<40} {value:<10}"
    return f"{label:<40} {float(value) * unit_scale:<10.2f}"


Section = tuple[str | None, list[tuple[str, str, float]]]   # (title or None, [(label, key, scale)])

# The first section; goodput and the concurrency rows are there only when they were asked for.
HEAD: list[tuple[str, str, float]] = [
    ("Successful requests:", "completed", 1), ("Rejected requests:", "rejected", 1),
    ("Unfinished requests (aborted):", "unfinished", 1),
    ("Maximum request concurrency:", "max_concurrency", 1),
    ("Request rate configured (RPS):", "rps", 1),
    ("Benchmark duration (s):", "duration_s", 1),
    ("Total input tokens:", "total_input_tokens", 1),
    ("Total generated tokens:", "total_output_tokens", 1),
    ("Request throughput (req/s):", "request_throughput", 1),
    ("Request goodput (req/s):", "request_goodput", 1),
    ("Requests meeting every SLO:", "good_requests", 1),
    ("Output token throughput (tok/s):", "output_throughput", 1),
    ("Peak concurrent requests:", "max_concurrent_requests", 1),
    ("Total token throughput (tok/s):", "total_token_throughput", 1)]

# vLLM's latency sections: metric key, label, title.
LATENCIES = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
             "itl": ("ITL", "Inter-token Latency (between blocks)"), "e2el": ("E2EL", "End-to-end Latency")}
# Under --max-concurrency: the wait for a slot, and the latency a caller saw including it.
CLIENT_QUEUE = {"client_queue": ("Client Queue Time", "Client-side Queueing (wait for a slot)"),
                "e2el_including_client_queue": ("E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency")}


def latency_sections(summary: Mapping[str, Any]) -> list[Section]:
    """Mean, median and the selected percentiles (--metric-percentiles) of each selected metric
    (--percentile-metrics), as vLLM prints them; a summary made before the selection existed
    gets the defaults."""
    chosen = summary.get("percentile_metrics") or PERCENTILE_METRICS
    pcts = [percentile_word(p) for p in summary.get("metric_percentiles") or DEFAULT_PERCENTILES]
    blocks = [(k, *LATENCIES[k]) for k in PERCENTILE_METRICS if k in chosen]
    if summary.get("max_concurrency") is not None:
        blocks += [(k, *v) for k, v in CLIENT_QUEUE.items()]
    return [(title, [(f"Mean {name} (ms):", f"mean_{k}_ms", 1), (f"Median {name} (ms):", f"median_{k}_ms", 1)]
             + [(f"P{w} {name} (ms):", f"p{w}_{k}_ms", 1) for w in pcts]) for k, name, title in blocks]


# (section title or None, [(label, key, scale)]); scale turns bytes into MiB.
SECTIONS: list[Section] = [
    ("Queueing (arrival to admission)", [("Mean queue time (ms):", "mean_queue_ms", 1),
                                         ("Median queue time (ms):", "median_queue_ms", 1),
                                         ("P99 queue time (ms):", "p99_queue_ms", 1)]),
    ("HTTP (an endpoint that reports its own time)", [
        ("Median time HTTP added (ms):", "http_overhead_median_ms", 1),
        ("Max time HTTP added (ms):", "http_overhead_max_ms", 1)]),
    ("Jitter", [("Latency std σ (ms):", "latency_std_ms", 1),
                ("Latency span max-min (ms):", "latency_span_ms", 1)]),
    ("Diffusion Decoding", [("Decoding:", "decoding", 1),
                            ("Forwards:", "forwards", 1),
                            ("Tokens per forward:", "tokens_per_forward", 1),
                            ("Mean forwards per request (NFE):", "mean_nfe", 1),
                            ("Mean TPF per request:", "mean_tpf", 1),
                            ("P50 TPF per request:", "p50_tpf", 1),
                            ("P90 TPF per request:", "p90_tpf", 1),
                            ("Mean forwards per block:", "mean_steps_per_block", 1),
                            ("Mean realised batch size:", "mean_batch_size", 1),
                            ("Requests served with dual cache:", "requests_dual", 1),
                            ("Requests served with sparse KV:", "requests_sparse", 1),
                            ("Requests served without a cache:", "requests_none", 1),
                            ("Logits rows computed:", "logits_rows", 1),
                            ("Max logits rows in a step:", "max_logits_rows_in_step", 1),
                            ("Peak KV (MiB):", "peak_kv_bytes", 1 / MIB),
                            ("Peak memory (MiB):", "peak_memory_bytes", 1 / MIB)]),
]


def format_summary(summary: Mapping[str, Any], title: str | None = None) -> str:
    """The vLLM-style block as plain text; rows whose key is absent are left out, and sections
    with no value at all."""
    lines = [_ruler(" Serving Benchmark Result ", "=")]
    if title or summary.get("system"):
        lines.append("{:<40} {:<10}".format("System:", title or summary.get("system")))
    if summary.get("dataset"):
        lines.append("{:<40} {:<10}".format("Dataset:", summary["dataset"]))
    for section, rows in [(None, HEAD), *latency_sections(summary), *SECTIONS]:
        present = [(lab, k, sc) for lab, k, sc in rows if k in summary]
        if all(summary[k] is None for _, k, _ in present):  # e.g. HTTP rows of an in-process system
            continue
        if section:
            lines.append(_ruler(section))
        lines += [_row(lab, summary[k], sc) for lab, k, sc in present]
    if summary.get("interrupted"):
        lines.append("{:<40} {:<10}".format("INTERRUPTED (partial run):", "yes"))
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def print_summary(summary: Mapping[str, Any], console: Console | None = None,
                  title: str | None = None) -> None:
    # markup/highlight off: the block must come out byte-for-byte like vLLM's.
    (console or stderr_console()).print(format_summary(summary, title), markup=False,
                                         highlight=False, soft_wrap=True)


def _f(v: Any, scale: float = 1.0, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    return f"{float(v) * scale:,.{digits}f}"


def comparison_table(summaries: Mapping[str, Mapping], baseline_names: Iterable[str],
                     title: str = "Serving comparison") -> Table:
    """Rich table, one row per system; `×` columns are vs the best baseline, > 1 = better. A
    repeated point shows `median [min–max]` and whether its ratio is beyond noise; a baseline
    shows its static batch B and the mean batch it realised. A point that finished too few
    requests (or whose reference did) shows its metrics and no ratios."""
    rt = ratio_table(summaries, baseline_names)
    best = rt.attrs.get("best_baseline")
    ref = summaries.get(best) if best else None
    repeated = any(s.get("repeats", 1) > 1 for s in summaries.values())
    caption = f"× = vs best baseline ({best or 'none'}); >1 is better"
    if repeated:
        caption += "; median [min–max] over repeats; 'within noise' = the throughput intervals overlap"
    few_ref = ref is not None and too_few_requests(ref)
    if any(too_few_requests(s) for s in summaries.values()):
        caption += f"; no ratios for points with fewer than {MIN_REQUESTS_FOR_RATIOS} finished requests"
    t = Table(title=title, caption=escape(caption), header_style="bold")
    cols = ["System", "B", "mean batch", "req/s", "tok/s", "Mean E2EL (s)", "P99 E2EL (s)", "σ (s)",
            "max−min (s)", "TTFT (s)", "fwd", "tok/fwd", "tput ×", "lat ×", "σ ×", "span ×"]
    for col in cols + (["vs best"] if repeated else []):
        t.add_column(col, justify="left" if col == "System" else "right")
    for name, s in summaries.items():
        r = rt.loc[name] if name in rt.index else {}
        label = name + (" (best baseline)" if name == best else " (baseline)" if
                        name in set(baseline_names) else "")
        few = too_few_requests(s) or few_ref
        if too_few_requests(s):
            label += f" (too few requests: {finished_requests(s)})"
        tput_x, verdict = _f(r.get("output_throughput_x")), None
        if ref is not None and s is not ref and not few:
            ratio, verdict = compare(s, ref, "output_throughput")
            if ratio.n > 1:
                tput_x = ratio.text()
        # Spreads on the headline columns only (throughput, mean latency); the rest are medians.
        cells = [label, batch_text(s) if s.get("is_baseline") else "–", _f(s.get("mean_batch_size"), digits=1),
                 _f(s.get("request_throughput"), digits=3), cell(s, "output_throughput"),
                 cell(s, "mean_e2el_ms", scale=1e-3), _f(s.get("p99_e2el_ms"), 1e-3),
                 _f(s.get("latency_std_ms"), 1e-3), _f(s.get("latency_span_ms"), 1e-3),
                 _f(s.get("mean_ttft_ms"), 1e-3), _f(s.get("forwards"), digits=0), _f(s.get("tokens_per_forward")),
                 *(["too few"] * 4 if few else
                   [tput_x, *(_f(r.get(k)) for k in ("mean_e2el_ms_x", "latency_std_ms_x", "latency_span_ms_x"))])]
        if repeated:
            cells.append(verdict if verdict and verdict != "n/a" else "–")
        t.add_row(*cells, style="bold" if name not in set(baseline_names) else None)
    return t


def print_comparison(summaries: Mapping[str, Mapping], baseline_names: Iterable[str],
                     console: Console | None = None, title: str = "Serving comparison") -> None:
    (console or stderr_console()).print(comparison_table(summaries, list(baseline_names), title))
