"""What `dllm-bench accuracy` makes of its points: the analysis (smallest retention reaching 95%
of dense, per selection; on the mean over models when a run has several), the Fig. 6-style plot
(mean ± spread across models), and the run directory's files (per-point summary + samples,
metrics.csv, summary.json with the per-seed spread), written atomically after every point."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from dllm_bench.accuracy import seeds
from dllm_bench.accuracy.points import Point, PointResult
from dllm_bench.results import atomic_write_csv, atomic_write_json, atomic_write_jsonl, read_json
from dllm_bench.systems.spec import ENGINE, SPARSE_BASELINE

SERIES = ("head", "uniform", "head-max", "uniform-max")


# ------------------------------------------------------------------------------------ analysis
def min_retention_reaching(results: Sequence[PointResult], dense_acc: float, series: str,
                           system: str = "engine", frac: float = 0.95) -> float | None:
    """Smallest swept r of `series` (head, uniform, head-max, ...) whose accuracy is >= frac x
    dense (None if none reaches it)."""
    pts = sorted((r for r in results if r.point.role != "dense" and r.point.system == system
                  and r.point.series == series and r.point.retention < 1.0), key=lambda r: r.point.retention)
    for r in pts:
        if r.accuracy >= frac * dense_acc:
            return r.point.retention
    return None


def analyse(results: Sequence[PointResult]) -> dict:
    dense = next(r for r in results if r.point.role == "dense")
    out: dict = {"dense_accuracy": dense.accuracy, "n": dense.n, "target_95": 0.95 * dense.accuracy}
    for sel in SERIES:
        at = {f"{r.point.retention:g}": r.accuracy for r in results
              if r.point.system == ENGINE and r.point.role == "sparse" and r.point.series == sel
              and r.point.retention < 1.0}
        if at:
            out[sel] = {"accuracy_by_retention": at,
                        "min_retention_95pct_dense": min_retention_reaching(results, dense.accuracy, sel)}
    sd = {f"{r.point.retention:g}": r.accuracy for r in results if r.point.system == SPARSE_BASELINE}
    if sd:
        out[SPARSE_BASELINE] = {"accuracy_by_retention": sd,
                                "min_retention_95pct_dense": min_retention_reaching(results, dense.accuracy, "uniform",
                                                                                    SPARSE_BASELINE)}
    return out


def plot_fig6(results: Sequence[PointResult], path: Path, title: str) -> Path:
    """Accuracy vs retention, one line per selection, dense as a horizontal line. One model: the
    band is the 95% Wilson interval; several (seeds): the line is their mean, the error bars
    their min-max spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dllm_bench.plots import save_png

    spread = seeds.spreads(results)
    several = any(len(s.models) > 1 for s in spread.values())
    results = seeds.pooled(results)
    dense = next(r for r in results if r.point.role == "dense")
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    styles = {"head": ("tab:blue", "o", "head-centric (dLLM-Serve)"),
              "uniform": ("tab:orange", "s", "uniform (Sparse-dLLM selection)"),
              "head-max": ("tab:purple", "D", "head-centric, max-query score"),
              "uniform-max": ("tab:brown", "v", "uniform, max-query score"),
              SPARSE_BASELINE: ("tab:green", "^", "Sparse-dLLM baseline system")}
    xs_all = []
    for key, (color, marker, label) in styles.items():
        pts = sorted((r for r in results if r.point.retention < 1.0 and (
            (key == SPARSE_BASELINE and r.point.system == SPARSE_BASELINE) or
            (key != SPARSE_BASELINE and r.point.system == ENGINE and r.point.role == "sparse"
             and r.point.series == key))), key=lambda r: r.point.retention)
        if not pts:
            continue
        xs = [100 * r.point.retention for r in pts]
        xs_all += xs
        ys = [100 * r.accuracy for r in pts]
        if several:
            err = [[y - 100 * spread[r.point.name].low for y, r in zip(ys, pts, strict=True)],
                   [100 * spread[r.point.name].high - y for y, r in zip(ys, pts, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, marker=marker, color=color, capsize=3,
                        label=f"{label}, mean of {len(spread[pts[0].point.name].models)} seeds (min-max)")
        else:
            ax.plot(xs, ys, marker=marker, color=color, label=label)
            ax.fill_between(xs, [100 * r.ci_low for r in pts], [100 * r.ci_high for r in pts], color=color, alpha=0.12)
    ax.axhline(100 * dense.accuracy, color="black", linestyle="--", linewidth=1.2,
               label=f"dense (r = 1, exact mode): {100 * dense.accuracy:.1f}%")
    ax.axhline(95 * dense.accuracy, color="gray", linestyle=":", linewidth=1.0, label="95% of dense")
    if xs_all:
        ax.set_xticks(sorted(set(xs_all)))
    ax.set_xlabel("KV retention ratio r (%)")
    ax.set_ylabel(f"accuracy (%), {dense.metric}")
    ax.set_ylim(0, max(100 * max(r.ci_high for r in results) + 5, 10))
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    save_png(fig, path)
    return path


# ------------------------------------------------------------------------------------ run
def point_dirname(point: Point) -> str:
    return point.name.replace("/", "-")


def write_point(run_dir: Path, res: PointResult, dense_acc: float | None) -> None:
    """points/<point>/ (one model) or points/<model>/<point>/ (several)."""
    pdir = run_dir / "points"
    if res.model:
        pdir = pdir / Path(res.model).name
    pdir = pdir / point_dirname(res.point)
    atomic_write_jsonl(pdir / "samples.jsonl", res.samples)
    atomic_write_json(pdir / "summary.json", {**res.row(dense_acc), "point_spec": asdict(res.point),
                                              "stats": res.stats})


def write_run_tables(run_dir: Path, results: Sequence[PointResult], extra: dict) -> None:
    dense_of = {r.model: r.accuracy for r in results if r.point.role == "dense"}
    rows = [r.row(dense_of.get(r.model)) for r in results]
    atomic_write_csv(run_dir / "metrics.csv", pd.DataFrame(rows))
    doc = {"run_id": run_dir.name, **extra, "points": rows}
    if len({r.model for r in results}) > 1:
        mean = seeds.pooled(results)
        spread = seeds.spreads(results)
        dacc = next((r.accuracy for r in mean if r.point.role == "dense"), None)
        doc["seeds"] = [{**r.row(dacc), "model": r.model, **spread[r.point.name].row()} for r in mean]
    if dense_of:
        doc["analysis"] = analyse(seeds.pooled(results))
    atomic_write_json(run_dir / "summary.json", doc)


def load_results(run_dir: Path) -> list[PointResult]:
    """PointResults (without samples) of a finished run, in run order, from its summary.json:
    e.g. to re-draw the figure, `plot_fig6(load_results(d), d / "fig6.png", "...")`."""
    doc = read_json(Path(run_dir) / "summary.json")
    out = []
    for row in doc["points"]:
        p = Point(row["point"], row["system"], row["role"], row.get("cache"), row.get("selection"),
                  float(row["retention"]), row.get("score_query") or "mean")
        other = {k[: -len("_accuracy")]: {"correct": row[k[: -len("_accuracy")] + "_correct"], "accuracy": row[k]}
                 for k in row if k.endswith("_accuracy") and k[: -len("_accuracy")] + "_correct" in row}
        out.append(PointResult(p, row["n"], row["correct"], row["accuracy"], row["ci_low"], row["ci_high"],
                               row["metric"], other, row.get("elapsed_s", 0.0), row.get("nfe_mean", 0.0), {},
                               model=row.get("model", "")))
    return out


# ------------------------------------------------------------------------------------ terminal
def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def print_table(results: Sequence[PointResult], summary: dict, task: str, model: str, run_dir: Path,
                plot: Path | None, protocol: Sequence[str] = ()) -> None:
    """The run's table: one row per point; with several models the accuracy is their mean, the CI
    the Wilson interval of the pooled counts, then the spread across seeds and each seed. Then
    the smallest retention reaching 95 % of dense per series, and `protocol`: the scoring rules
    and the dev split's choice."""
    import shutil

    from rich.console import Console
    from rich.table import Table

    con = Console(width=shutil.get_terminal_size((120, 24)).columns)   # 120 when not a terminal
    spread = seeds.spreads(results)
    several = any(len(s.models) > 1 for s in spread.values())
    pooled = seeds.pooled(results)
    dense = pooled[0]
    other = next(iter(dense.other), None)
    n_each = results[0].n
    who = f"{len(spread[dense.point.name].models)} models, " if several else ""
    t = Table(title=f"accuracy · {task} ({summary.get('split', 'test')}) · {model} · {who}n = {n_each} per point"
                    f"{' and model' if several else ''} · {dense.metric} · Wilson 95% CI")
    cols = [("point", "left"), ("system", "left"), ("r", "right"), ("correct", "right"), ("acc %", "right"),
            ("95% CI", "right")]
    cols += [("seed sd", "right"), ("seed min-max", "right"), ("per seed %", "left")] if several else []
    cols += [("flex %", "right")] if other else []
    cols += [("/dense", "right"), ("s", "right")]
    for c, j in cols:
        t.add_column(c, justify=j, no_wrap=True)
    for r in pooled:
        p, sp = r.point, spread[r.point.name]
        sysname = p.system if p.system != ENGINE else f"engine:{p.cache}"
        cells = [p.name, sysname, f"{p.retention:g}", f"{r.correct}/{r.n}", pct(r.accuracy),
                 f"{pct(r.ci_low)}-{pct(r.ci_high)}"]
        if several:
            cells += [pct(sp.sd), f"{pct(sp.low)}-{pct(sp.high)}", " ".join(pct(a) for a in sp.accuracies)]
        if other:
            cells.append(pct(r.other[other]["accuracy"]))
        cells += [f"{r.accuracy / dense.accuracy:.2f}" if dense.accuracy else "-", f"{r.elapsed_s:.0f}"]
        t.add_row(*cells, style="bold" if p.role == "dense" else None)
    con.print(t)
    analysis = summary.get("analysis", {})
    for sel in ("head", "uniform", "head-max", "uniform-max", SPARSE_BASELINE):
        a = analysis.get(sel)
        if a:
            m = a["min_retention_95pct_dense"]
            con.print(f"{sel}: smallest r reaching 95% of dense ({pct(analysis['target_95'])}%): "
                      f"{m if m is not None else 'none of the swept r'}")
    for line in protocol:
        con.print(line, markup=False, highlight=False)
    con.print(f"[dim]run: {run_dir}" + (f" · figure: {plot}" if plot else "") + "[/dim]")
