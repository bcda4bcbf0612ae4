"""What a command shows on stderr: the Rich console (stdout is kept for --json), the one
progress-bar layout, DataFrames as terminal tables, and the number formatting shared with the
report's Markdown tables (a number reads the same on the terminal and in the report).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def num(v: Any) -> float | None:
    """A table cell as a float, None when missing or NaN (pandas turns missing values into NaN)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def fmt_table(df, floats: Mapping[str, str] | None = None) -> Any:
    """A copy with numbers formatted for a terminal/Markdown table (None -> '-')."""
    floats = dict(floats or {})
    out = df.copy()
    for c in out.columns:
        fmt = floats.get(c)
        if fmt is None:
            out[c] = out[c].map(lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
        else:
            # Text cells (a spread already folded in, dllm_bench.console.with_spreads) stay as they are.
            out[c] = out[c].map(lambda v, fmt=fmt: v if isinstance(v, str) else
                                "-" if num(v) is None else fmt.format(float(v)))
    return out


def with_spreads(df, spreads: Sequence[tuple[str, str, str, str]], drop_when_single: Sequence[str] = ()):
    """A table for display: each (median, min, max, format) triple folded into the median
    column as `median [min–max]` text where a row was repeated (column `repeats` > 1); the
    min/max columns dropped, and `drop_when_single` too when no row was repeated."""
    out = df.copy()
    repeated = "repeats" in out.columns and (out["repeats"].map(num).fillna(1) > 1).any()
    for col, lo, hi, fmt in spreads:
        if col not in out.columns:
            continue
        if repeated:
            def text(r, col=col, lo=lo, hi=hi, fmt=fmt):
                v, a, b = num(r[col]), num(r.get(lo)), num(r.get(hi))
                if v is None:
                    return "-"
                if a is None or b is None or (num(r.get("repeats")) or 1) <= 1:
                    return fmt.format(v)
                return f"{fmt.format(v)} [{fmt.format(a)}–{fmt.format(b)}]"
            out[col] = out.apply(text, axis=1)
        out = out.drop(columns=[c for c in (lo, hi) if c in out.columns])
    if not repeated:
        out = out.drop(columns=[c for c in drop_when_single if c in out.columns])
    return out


def md_table(df, floats: Mapping[str, str] | None = None, as_text: bool = False) -> str:
    """pandas DataFrame -> GitHub Markdown table (tabulate when installed, else by hand).
    `as_text`: cells already formatted are printed as they are (tabulate would reformat a
    number-like "2.50" as 2.5)."""
    if df is None or len(df) == 0:
        return "_(no rows)_\n"
    f = fmt_table(df, floats).astype(str)
    try:
        return f.to_markdown(index=False, disable_numparse=as_text) + "\n"
    except ImportError:
        cols = [str(c) for c in f.columns]
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in f.values.tolist()]
        return "\n".join(lines) + "\n"


def console(stderr: bool = True, width: int = 180) -> Console:
    """The stderr console (stdout is kept for --json), or stdout's for a command whose output is
    the table; `width` columns when not a terminal so logged or piped tables do not wrap."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=width)


def progress(*fields: str, con: Console | None = None, status: bool = False, transient: bool = True,
             enabled: bool = True) -> Progress:
    """The one progress-bar layout: bold description, [dim status field], bar, done/total, then
    `fields` (Rich format strings over the task, e.g. "{task.fields[tps]:.1f} tok/s"), elapsed."""
    cols = [TextColumn("[bold]{task.description}")]
    if status:
        cols.append(TextColumn("[dim]{task.fields[status]}"))
    cols += [BarColumn(), MofNCompleteColumn(), *(TextColumn(f) for f in fields), TimeElapsedColumn()]
    return Progress(*cols, console=con or console(), transient=transient, disable=not enabled)


TERMINAL_NAMES = {"throughput_tok_s": "tok/s", "x_vs_baseline": "x baseline", "delta_x_vs_prev": "Δx prev",
                  "pct_vs_prev": "Δ% prev", "kv_pool_tokens": "KV pool tok", "max_batch_size": "B",
                  "x_vs_full_engine": "x full engine", "query_tokens_per_out_tok": "query tok/out tok",
                  "refresh_steps_per_out_tok": "refresh/out tok", "reuse_steps_per_out_tok": "reuse/out tok",
                  "step_vs_prev": "step vs prev", "mean_batch_size": "mean batch"}


def print_df(con, df, title: str, floats: Mapping[str, str] | None = None, drop: Sequence[str] = ("system",)) -> None:
    """A DataFrame as a Rich table on the console (long system labels dropped: they are
    printed once at the start of the run)."""
    t = Table(title=escape(title), title_justify="left")
    f = fmt_table(df.drop(columns=[c for c in drop if c in df.columns]), floats)
    f = f.rename(columns=TERMINAL_NAMES)
    for c in f.columns:
        t.add_column(str(c), justify="left" if f[c].dtype == object and c in ("dataset", "rung", "system",
                                                                                "cache policy") else "right")
    for _, row in f.iterrows():
        t.add_row(*[escape(str(v)) for v in row.tolist()])
    con.print(t)
