"""`dllm-bench simulate --paper NAME`: fit the one scalar, run the replay, print published vs
simulated (stdout: a Markdown table, or --json), one line per simulated cell on stderr."""
from __future__ import annotations

import json
import sys

import pandas as pd

from dllm_bench.console import console, md_table
from dllm_bench.simulate.hardware import load
from dllm_bench.simulate.implementations import implementations_line
from dllm_bench.simulate.paper.checks import holdout, holdout_summary, ordering
from dllm_bench.simulate.paper.published import ENGINE_POINTS, FIT_POINT, point_label
from dllm_bench.simulate.paper.setting import DEFAULT, LOG, Declared, fit_u, impls, scaled
from dllm_bench.simulate.paper.tables import GPU_OF, TABLES

REPLAYS = (*TABLES, "holdout")


def _floats(df: pd.DataFrame) -> dict[str, str]:
    floats = {c: "{:+.0%}" for c in df.columns if c.endswith("_err") or c == "err"}
    floats |= {c: "{:.1f}" for c in df.columns if c.startswith(("tput_", "lat_", "lat05_")) and c not in floats}
    floats |= {c: "{:.2f}" for c in df.columns if c.startswith("ratio_")}
    floats |= {point_label(p): "{:+.0%}" for p in ENGINE_POINTS}
    floats |= {"u": "{:.3f}", "lat_err_s": "{:+.0f}", "lat05_err_s": "{:+.0f}", "batch": "{:.0f}"}
    return floats


def _records(df: pd.DataFrame) -> list[dict]:
    return json.loads(df.to_json(orient="records"))          # NaN -> null, numpy scalars -> JSON numbers


def replay(name: str, as_json: bool, declared: Declared = DEFAULT) -> None:

    con = console()
    LOG["fn"] = lambda msg: con.print(msg, markup=False, highlight=False)
    con.print(f"declared inputs: {declared.describe()}", highlight=False)
    extra: dict[str, pd.DataFrame] = {}
    if name == "holdout":
        con.print("fitting the one scalar (u) on each of dLLM-Serve's published throughputs in turn ...", highlight=False)
        u, df = None, holdout(declared)
        title = "u fitted on each dLLM-Serve point in turn, the other points predicted with it"
        notes = [holdout_summary(df)]
    else:
        con.print(f"fitting the one scalar (u) on dLLM-Serve, {point_label(FIT_POINT)} ...", highlight=False)
        u = fit_u(declared)
        hw = scaled(load(GPU_OF[name]), u)
        con.print(f"u = {u:.3f} (compute and bandwidth efficiency of every system); GPU {hw.name}", highlight=False)
        df = TABLES[name](hw, declared)
        title = (f"simulated on {hw.name} ({hw.validation_label()}), u = {u:.3f} fitted on {point_label(FIT_POINT)} "
                 "dLLM-Serve")
        notes = []
        if name == "table4":
            extra["ordering"] = ordering(df)
    if as_json:
        doc = dict(replay=name, u=u, declared=declared.describe(), impls=impls(), cells=_records(df),
                   **{k: _records(v) for k, v in extra.items()})
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    sys.stdout.write(f"# paper {name}: {title}; {implementations_line(impls())}; declared inputs: "
                     f"{declared.describe()}\n\n")
    sys.stdout.write(md_table(df, _floats(df)))
    for note in notes:
        sys.stdout.write(f"\n{note}\n")
    for k, v in extra.items():
        sys.stdout.write(f"\n## {k} (by throughput; pairs: of the six, ordered as in the paper)\n\n{md_table(v)}")
