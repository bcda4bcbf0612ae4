"""The dLLM-Serve paper's serving figures from a metrics table (one row per dataset/system/rps,
i.e. results.metrics_frame / metrics.csv):

  Fig. 3  output throughput (tok/s) vs arrival rate, one line per system, one panel per dataset
  Fig. 4  mean end-to-end latency (s) vs arrival rate, same layout
  Fig. 5  jitter gains at one rps: best-baseline sigma / system sigma and span / span (bars,
          baseline = 1.0 dashed red line, higher = less jitter)

Agg backend (no display on a CPU box / in CI); PNGs are written atomically via results.
"""
from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless, deterministic output
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dllm_bench.metrics.serving import ratio_table  # noqa: E402
from dllm_bench.results import atomic_write_bytes  # noqa: E402

MARKERS = "osD^v<>PX*"


def save_png(fig, path: str | os.PathLike) -> Path:
    """Render `fig` as PNG in memory, close it, and write the file atomically (never half-written)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def _datasets(df: pd.DataFrame) -> list[str]:
    if "dataset" not in df.columns:
        return [""]
    return list(dict.fromkeys(df["dataset"].fillna("").astype(str)))


def _subset(df: pd.DataFrame, dataset: str) -> pd.DataFrame:
    if "dataset" not in df.columns:
        return df
    return df[df["dataset"].fillna("").astype(str) == dataset]


def _finite_rps(df: pd.DataFrame) -> pd.DataFrame:
    # rps=inf (all at t=0) has no place on a numeric x axis.
    return df[df["rps"].map(lambda r: math.isfinite(float(r)))]


def plot_vs_rps(df: pd.DataFrame, path: str | os.PathLike, metric: str, ylabel: str, title: str,
                *, scale: float = 1.0, systems: Sequence[str] | None = None) -> Path:
    """Line plot of `metric`*scale vs rps, one line per system, one panel per dataset."""
    datasets = _datasets(df)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.6 * len(datasets), 3.8), squeeze=False)
    order = list(systems or dict.fromkeys(df["system"]))
    for ax, ds in zip(axes[0], datasets, strict=True):
        sub = _finite_rps(_subset(df, ds))
        for i, name in enumerate(order):
            s = sub[sub["system"] == name].sort_values("rps")
            y = pd.to_numeric(s[metric], errors="coerce") * scale
            if y.notna().any():
                ax.plot(s["rps"].astype(float), y, marker=MARKERS[i % len(MARKERS)], label=name)
        ax.set_xlabel("Request arrival rate (req/s)")
        ax.set_ylabel(ylabel)
        ax.set_title(ds or title, fontsize=11)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5),
                   bbox_to_anchor=(0.5, -0.02), frameon=False)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return save_png(fig, path)


def plot_throughput(df: pd.DataFrame, path: str | os.PathLike, **kw) -> Path:
    """Paper Fig. 3: realized output throughput vs arrival rate."""
    return plot_vs_rps(df, path, "output_throughput", "Output throughput (tok/s)",
                       "Throughput vs arrival rate", **kw)


def plot_latency(df: pd.DataFrame, path: str | os.PathLike, **kw) -> Path:
    """Paper Fig. 4: mean end-to-end latency (seconds, as in the paper) vs arrival rate."""
    return plot_vs_rps(df, path, "mean_e2el_ms", "Mean end-to-end latency (s)",
                       "Latency vs arrival rate", scale=1e-3, **kw)


def jitter_gains(df: pd.DataFrame, baseline_names: Iterable[str], rps: float | None = None) -> pd.DataFrame:
    """Rows (dataset, system, std_gain, span_gain) at `rps` (default: the highest finite rps in
    df, the paper's "high load" point). Gain = best baseline's value / system's value (best baseline =
    highest request throughput among baselines at that point, per dataset)."""
    baseline_names = list(baseline_names)
    if rps is None:
        fin = _finite_rps(df)
        rps = float(fin["rps"].max()) if not fin.empty else math.inf
    rows = []
    for ds in _datasets(df):
        sub = _subset(df, ds)
        sub = sub[sub["rps"].astype(float) == float(rps)]
        summaries = {r["system"]: r.to_dict() for _, r in sub.iterrows()}
        rt = ratio_table(summaries, baseline_names)
        for name, r in rt.iterrows():
            rows.append({"dataset": ds, "system": name, "best_baseline": r["best_baseline"],
                         "std_gain": r["latency_std_ms_x"], "span_gain": r["latency_span_ms_x"]})
    out = pd.DataFrame(rows, columns=["dataset", "system", "best_baseline", "std_gain", "span_gain"])
    out.attrs["rps"] = rps
    return out


def plot_jitter(df: pd.DataFrame, path: str | os.PathLike, baseline_names: Iterable[str],
                rps: float | None = None, *, include_baselines: bool = False) -> Path:
    """Paper Fig. 5: per dataset, bars of sigma gain and span gain for each (non-baseline)
    system, normalized to the best baseline (red dashed line at 1.0)."""
    baseline_names = list(baseline_names)
    g = jitter_gains(df, baseline_names, rps)
    if not include_baselines:
        g = g[~g["system"].isin(baseline_names)]
    datasets = list(dict.fromkeys(g["dataset"])) or [""]
    systems = list(dict.fromkeys(g["system"]))
    bars = [(s, col, lab) for s in systems for col, lab in (("std_gain", "σ"), ("span_gain", "max−min"))]
    width = 0.8 / max(len(bars), 1)
    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(datasets) + 0.5 * len(bars)), 4.2))
    cmap = plt.get_cmap("tab20")
    for j, (s, col, lab) in enumerate(bars):
        ys = []
        for ds in datasets:
            v = g[(g["dataset"] == ds) & (g["system"] == s)][col]
            ys.append(float(v.iloc[0]) if len(v) and pd.notna(v.iloc[0]) else float("nan"))
        xs = [i + (j - (len(bars) - 1) / 2) * width for i in range(len(datasets))]
        rects = ax.bar(xs, ys, width, label=f"{s} — latency {lab}", color=cmap(j % 20))
        # Vertical value labels once bars get narrow, so neighbours do not overprint.
        ax.bar_label(rects, fmt="%.2f×", fontsize=7, padding=2, rotation=90 if len(bars) > 4 else 0)
    ax.axhline(1.0, color="red", linestyle="--", linewidth=1.2, label="best baseline = 1.0")
    ax.set_xticks(range(len(datasets)), [d or "workload" for d in datasets])
    ax.set_ylabel("Gain vs best baseline (×)")
    rps_v = g.attrs.get("rps", rps)
    ax.set_title(f"Latency jitter at {rps_v:g} req/s, normalized to best baseline\n"
                 "(gain = best baseline's σ or span / system's; higher = less jitter)", fontsize=10)
    ax.set_ylim(0, max([1.3] + [v * 1.3 for v in g[["std_gain", "span_gain"]].stack().dropna()]))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    fig.tight_layout()
    return save_png(fig, path)


def plot_all(df: pd.DataFrame, out_dir: str | os.PathLike, baseline_names: Iterable[str],
             jitter_rps: float | None = None) -> list[Path]:
    """All three figures into out_dir (usually <run-dir>/plots); jitter only if a baseline ran."""
    out = Path(out_dir)
    paths = [plot_throughput(df, out / "throughput_vs_rps.png"),
             plot_latency(df, out / "latency_vs_rps.png")]
    baseline_names = [b for b in baseline_names if b in set(df["system"])]
    if baseline_names:
        paths.append(plot_jitter(df, out / "jitter.png", baseline_names, jitter_rps))
    return paths
