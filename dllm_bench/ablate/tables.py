"""`dllm-bench ablate`'s results as tables and figures (paper Fig. 8): the ladder table (x vs the
baseline rung, delta vs the rung before), the cache-policy table (x vs the full engine, FLOP
proxies per output token), their grouped-bar PNGs, and both tables of a finished run directory
(what `report` renders). The ladder itself: dllm_bench.ablate.ladder.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.ablate.ladder import THROUGHPUT, Rung
from dllm_bench.console import num, with_spreads
from dllm_bench.repeats import Spread, aggregate_points, compare
from dllm_bench.systems.spec import parse_system


def _index(points: Iterable[Mapping]) -> dict[tuple[str, str], Mapping]:
    return {(p.get("dataset", ""), p["system"]): p for p in points}


def ladder_table(points: Iterable[Mapping], rungs: Sequence[Rung | Mapping], datasets: Sequence[str]):
    """One row per (dataset, rung): throughput (the median over repeats, with its min–max), x vs
    the baseline rung (with the interval the repeats allow), delta vs the rung before and whether
    the step beats noise, and the baseline's static batch B next to the mean batch it realised.
    `points` are aggregated summaries (dllm_bench.repeats.aggregate_points)."""
    idx = _index(points)
    rows = []
    for ds in datasets:
        base = prev = prev_x = None
        for i, r in enumerate(rungs):
            r = r if isinstance(r, Mapping) else r.to_dict()
            label = _rung_label(r)
            p = idx.get((ds, label))
            tp = num(p.get(THROUGHPUT)) if p else None
            if i == 0:
                base = p
            xs, _ = compare(p, base, THROUGHPUT) if p and base and p is not base else (Spread.of([]), "n/a")
            if p is not None and p is base and tp:  # the reference itself: exactly 1, no interval
                xs = Spread(1.0, float("nan"), float("nan"), 1)
            x = xs.median if xs.n else None
            step = compare(p, prev, THROUGHPUT)[1] if p and prev else None
            px = num(prev_x) if prev else None
            row = {"dataset": ds, "rung": r["title"], "system": label,
                   "throughput_tok_s": tp, "throughput_min": num(p.get(f"{THROUGHPUT}_min")) if p else None,
                   "throughput_max": num(p.get(f"{THROUGHPUT}_max")) if p else None,
                   "x_vs_baseline": x, "x_min": num(xs.lo) if xs.n else None, "x_max": num(xs.hi) if xs.n else None,
                   "delta_x_vs_prev": (x - px) if x is not None and px is not None else None,
                   "pct_vs_prev": (100 * (x / px - 1)) if x is not None and px else None,
                   "step_vs_prev": step, "repeats": p.get("repeats", 1) if p else None,
                   "kv_pool_tokens": p.get("kv_pool_tokens") if p else None,
                   "max_batch_size": p.get("max_batch_size") if p and p.get("is_baseline") else None,
                   "mean_batch_size": p.get("mean_batch_size") if p else None,
                   "completed": p.get("completed") if p else None}
            rows.append(row)
            prev, prev_x = p, x
    return pd.DataFrame(rows)


def cache_table(points: Iterable[Mapping], rows_: Sequence[Rung | Mapping], baseline: Rung | Mapping,
                datasets: Sequence[str]):
    """One row per (dataset, cache policy) that was measured: throughput, x vs the baseline and
    vs the full engine (sparse head), and the work per output token (FLOP proxies)."""
    idx = _index(points)
    base_label = _rung_label(baseline)
    out = []
    for ds in datasets:
        base = idx.get((ds, base_label))
        btp = num(base.get(THROUGHPUT)) if base else None
        rs = [r if isinstance(r, Mapping) else r.to_dict() for r in rows_]
        if not any(idx.get((ds, _rung_label(r))) for r in rs if r["key"] != "cache-sparse-head"):
            continue  # only the full engine (a ladder rung) ran here: no cache-policy rows
        full = next((idx.get((ds, _rung_label(r))) for r in rs if r["key"] == "cache-sparse-head"), None)
        ftp = num(full.get(THROUGHPUT)) if full else None
        for r in rs:
            p = idx.get((ds, _rung_label(r)))
            if p is None:
                continue
            tp = num(p.get(THROUGHPUT))
            st = p.get("stats") or {}
            out_tok = p.get("total_output_tokens") or 0
            qt = p.get("query_tokens", st.get("query_tokens"))

            def per_tok(v, n=out_tok):
                v = num(v)
                return v / n if v is not None and n else None
            out.append({"dataset": ds, "cache policy": r["title"], "system": _rung_label(r),
                        "throughput_tok_s": tp,
                        "x_vs_baseline": tp / btp if tp is not None and btp else None,
                        "x_vs_full_engine": tp / ftp if tp is not None and ftp else None,
                        "query_tokens_per_out_tok": per_tok(qt),
                        "refresh_steps_per_out_tok": per_tok(st.get("refresh_request_steps")),
                        "reuse_steps_per_out_tok": per_tok(st.get("reuse_request_steps")),
                        "kv_pool_tokens": p.get("kv_pool_tokens")})
    return pd.DataFrame(out)


def _rung_label(r: Rung | Mapping) -> str:
    """The system label of a rung (stored in an ablate run's config.json; else parsed)."""
    d = r if isinstance(r, Mapping) else r.to_dict()
    return d.get("label") or parse_system(d["spec"]).label


LADDER_FMT = {"throughput_tok_s": "{:.2f}", "x_vs_baseline": "{:.2f}x", "delta_x_vs_prev": "{:+.2f}x",
              "pct_vs_prev": "{:+.1f}%", "kv_pool_tokens": "{:.0f}", "max_batch_size": "{:.0f}",
              "mean_batch_size": "{:.1f}", "completed": "{:.0f}"}
# Printed as `median [min–max]` when repeated: (median column, min column, max column, format).
LADDER_SPREADS = (("throughput_tok_s", "throughput_min", "throughput_max", "{:.2f}"),
                  ("x_vs_baseline", "x_min", "x_max", "{:.2f}x"))


def ladder_display(lt):
    """The ladder table as printed: spreads folded into their columns (`median [min–max]`) when
    the rungs were repeated, the step verdict only then (with one run it says nothing)."""
    return with_spreads(lt, LADDER_SPREADS, drop_when_single=("step_vs_prev", "repeats"))
CACHE_FMT = {"throughput_tok_s": "{:.2f}", "x_vs_baseline": "{:.2f}x", "x_vs_full_engine": "{:.2f}x",
             "query_tokens_per_out_tok": "{:.1f}", "refresh_steps_per_out_tok": "{:.3f}",
             "reuse_steps_per_out_tok": "{:.3f}", "kv_pool_tokens": "{:.0f}"}


# ---------------------------------------------------------------- figures
def plot_ablation(ladder_df, path: Path, title: str = "Ablation: relative throughput (vs Sparse-dLLM)") -> Path:
    """Paper Fig. 8: per dataset, one bar per rung (throughput / baseline's), value labels."""
    return _grouped_bars(ladder_df, "rung", "x_vs_baseline", path, title, "Relative throughput (x Sparse-dLLM)")


def plot_cache_policies(cache_df, path: Path,
                        title: str = "Full engine under each cache policy (same scheduler and budget)") -> Path:
    return _grouped_bars(cache_df, "cache policy", "x_vs_baseline", path, title, "Relative throughput (x Sparse-dLLM)")


def _grouped_bars(df, series_col: str, value_col: str, path: Path, title: str, ylabel: str) -> Path:
    # matplotlib costs ~1 s to import: paid only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dllm_bench.plots import save_png

    datasets = list(dict.fromkeys(df["dataset"])) or [""]
    series = list(dict.fromkeys(df[series_col]))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(6.5, 2.2 * len(datasets) + 0.3 * len(series)), 4.2))
    cmap = plt.get_cmap("tab10")
    top = 1.0
    for j, s in enumerate(series):
        ys = []
        for ds in datasets:
            v = df[(df["dataset"] == ds) & (df[series_col] == s)][value_col]
            y = num(v.iloc[0]) if len(v) else None
            ys.append(float("nan") if y is None else y)
            top = max(top, y or 0)
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(datasets))]
        rects = ax.bar(xs, ys, width, label=s, color=cmap(j % 10))
        ax.bar_label(rects, fmt="%.2f×", fontsize=7, padding=2, rotation=90 if len(series) > 4 else 0)
    ax.axhline(1.0, color="red", linestyle="--", linewidth=1.0)
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top * 1.3)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    fig.tight_layout()
    return save_png(fig, path)


# ---------------------------------------------------------------- a finished run, as tables
def run_tables(run_dir: Path) -> dict:
    """Ladder and cache tables of an ablate run dir (what `report` renders), over the
    aggregate of each point's repeats."""
    cfg = results.load_config(run_dir)["config"]
    pts = aggregate_points(results.load_points(run_dir))
    datasets = cfg.get("datasets") or list(dict.fromkeys(p.get("dataset", "") for p in pts))
    rungs = cfg.get("ladder") or []
    crows = cfg.get("cache_rows") or []
    lt = ladder_table(pts, rungs, datasets) if rungs else None
    ct = cache_table(pts, crows, rungs[0], datasets) if crows and rungs else None
    return {"config": cfg, "points": pts, "ladder": lt, "cache": ct, "datasets": datasets}
