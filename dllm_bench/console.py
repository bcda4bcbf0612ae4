"""What a command shows on stderr: the Rich console (stdout is kept for --json), the one
progress-bar layout, DataFrames as terminal tables, and the number formatting shared with the
report's Markdown tables (a number reads the same on the terminal and in the report).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
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
            out[c] = out[c].map(lambda v, fmt=fmt: "-" if num(v) is None else fmt.format(float(v)))
    return out


def md_table(df, floats: Mapping[str, str] | None = None) -> str:
    """pandas DataFrame -> GitHub Markdown table (tabulate when installed, else by hand)."""
    if df is None or len(df) == 0:
        return "_(no rows)_\n"
    f = fmt_table(df, floats).astype(str)
    try:
        return f.to_markdown(index=False) + "\n"
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
                  "refresh_steps_per_out_tok": "refresh/out tok", "reuse_steps_per_out_tok": "reuse/out tok"}


def print_df(con, df, title: str, floats: Mapping[str, str] | None = None, drop: Sequence[str] = ("system",)) -> None:
    """A DataFrame as a Rich table on the console (long system labels dropped: they are
    printed once at the start of the run)."""
    t = Table(title=title, title_justify="left")
    f = fmt_table(df.drop(columns=[c for c in drop if c in df.columns]), floats)
    f = f.rename(columns=TERMINAL_NAMES)
    for c in f.columns:
        t.add_column(str(c), justify="left" if f[c].dtype == object and c in ("dataset", "rung", "system",
                                                                                "cache policy") else "right")
    for _, row in f.iterrows():
        t.add_row(*[str(v) for v in row.tolist()])
    con.print(t)
