"""What a frontier run shows: the table (Rich on the terminal, Markdown in `report`), the Pareto
plot (accuracy vs output tokens/s; dominated configurations greyed) and the goals' verdicts,
all from the run's rows (dllm_bench.frontier.run.rows)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from rich.markup import escape
from rich.table import Table

from dllm_bench.console import md_table
from engine.decoding import FIXED

# The table's columns, in order (the JSON document and the tests name them from here).
COLUMNS = ("configuration", "decoding", "accuracy %", "per seed %", "tok/s", "x fixed", "TPF",
           "TPF p50/p90", "NFE", "fwd/block", "front")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}"


def _tps(r: Mapping) -> str:
    if r.get("repeats", 1) > 1:
        return f"{r['tps']:.1f} [{r['tps_min']:.1f}–{r['tps_max']:.1f}]"
    return f"{r['tps']:.1f}"


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def frame(rows: Sequence[Mapping]) -> pd.DataFrame:
    """The table as text cells, one row per configuration in run order."""
    fixed = {r["system"]: r["tps"] for r in rows if r["decoding"] == FIXED}
    out = []
    for r in rows:
        seeds = r.get("per_seed") or {}
        base = fixed.get(r["system"])
        out.append({
            "configuration": r["system"], "decoding": r["decoding"],
            "accuracy %": f"{_pct(r['accuracy'])} [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]",
            "per seed %": " / ".join(_pct(a) for a in seeds.values()) if len(seeds) > 1 else "-",
            "tok/s": _tps(r), "x fixed": "-" if not base else f"{r['tps'] / base:.2f}",
            "TPF": _num(r.get("mean_tpf")), "TPF p50/p90": f"{_num(r.get('p50_tpf'))} / {_num(r.get('p90_tpf'))}",
            "NFE": _num(r.get("mean_nfe"), "{:.1f}"), "fwd/block": _num(r.get("mean_steps_per_block"), "{:.1f}"),
            "front": "yes" if r.get("pareto") else "dominated"})
    return pd.DataFrame(out, columns=list(COLUMNS))


def table(rows: Sequence[Mapping], title: str, caption: str = "") -> Table:
    t = Table(title=escape(title), caption=escape(caption) if caption else None, title_justify="left")
    f = frame(rows)
    for c in COLUMNS:
        t.add_column(c, justify="left" if c in ("configuration", "decoding") else "right")
    for r, (_, cells) in zip(rows, f.iterrows(), strict=True):
        t.add_row(*[escape(str(v)) for v in cells.tolist()], style=None if r.get("pareto") else "dim")
    return t


def verdict_lines(verdicts: Mapping[str, Mapping]) -> list[str]:
    return [f"goal — {v['goal']}: {v['text']}" for v in verdicts.values()]


def plot(rows: Sequence[Mapping], path: Path, title: str) -> Path:
    """Accuracy (%, Wilson interval) vs output tok/s (median, min–max over repeats; log scale):
    front configurations in their system's colour, each labelled with its policy and the front
    joined by a step line; dominated ones grey in their system's marker (named in the table)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from dllm_bench.plots import MARKERS, save_png

    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    colours = plt.get_cmap("tab10")
    for i, s in enumerate(systems):
        for front in (True, False):
            pts = [r for r in rows if r["system"] == s and bool(r.get("pareto")) == front]
            if not pts:
                continue
            x = [r["tps"] for r in pts]
            y = [r["accuracy"] * 100 for r in pts]
            xerr = [[r["tps"] - r.get("tps_min", r["tps"]) for r in pts], [r.get("tps_max", r["tps"]) - r["tps"] for r in pts]]
            yerr = [[(r["accuracy"] - r["ci_low"]) * 100 for r in pts], [(r["ci_high"] - r["accuracy"]) * 100 for r in pts]]
            ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=MARKERS[i % len(MARKERS)], ms=7 if front else 5,
                        color=colours(i % 10) if front else "0.72", ecolor="0.8", elinewidth=0.8, capsize=2,
                        zorder=3 if front else 2)
            for r in pts if front else ():      # the table names the dominated ones
                ax.annotate(r["decoding"], (r["tps"], r["accuracy"] * 100), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color="0.15")
    front = sorted((r for r in rows if r.get("pareto")), key=lambda r: r["tps"])
    if len(front) > 1:
        ax.step([r["tps"] for r in front], [r["accuracy"] * 100 for r in front], where="post", color="0.35",
                linewidth=0.9, linestyle="--", zorder=1)
    handles = [Line2D([], [], marker=MARKERS[i % len(MARKERS)], color=colours(i % 10), linestyle="", label=s)
               for i, s in enumerate(systems)]
    handles.append(Line2D([], [], marker="o", color="0.72", linestyle="", label="dominated (grey)"))
    if len(front) > 1:
        handles.append(Line2D([], [], color="0.35", linestyle="--", label="Pareto front"))
    ax.set_xscale("log")
    ax.set_xlabel("Output throughput (tok/s, log scale)")
    ax.set_ylabel("Accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(handles=handles, fontsize=8, loc="lower left")
    fig.tight_layout()
    return save_png(fig, path)


def markdown(doc: Mapping) -> str:
    """A run's table and verdicts as Markdown (the `report` section and docs/FRONTIER.md)."""
    rows = doc["rows"]
    out = [f"{doc['task']} ({doc['split']}), {', '.join(doc['models'])}: {doc['n']} questions per model, "
           f"concurrency {doc['concurrency']}, {doc['repeats']} repeat(s); tok/s = median [min–max] over repeats, "
           "accuracy pooled over the models with its Wilson 95 % interval.\n\n", md_table(frame(rows)), "\n"]
    out += [f"- {line}\n" for line in verdict_lines(doc["verdicts"])]
    return "".join(out)
