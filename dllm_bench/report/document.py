"""`dllm-bench report`: one Markdown report from the latest runs of serve, accuracy, ablate and
sweep (input-len and output-len), next to the dLLM-Serve paper's numbers, and the latest
simulated run per hardware profile in sections of their own (never mixed with measured rows).

Every number attributed to the paper is quoted from its text (dllm_bench.report.claims, with
the verdict rule); our numbers come from the run directories, one section per run kind
(dllm_bench.report.sections). This module finds the runs and assembles the document: the
runs list, the summary of claims, then the sections. The PNGs of each run are copied next to the
report (<report stem>_files/) and linked relatively.
"""
from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.console import md_table
from dllm_bench.errors import UserError
from dllm_bench.report.claims import TOLERANCE, Claims
from dllm_bench.report.frontier import frontier_section
from dllm_bench.report.sections import ablate_section, accuracy_section, sweep_section
from dllm_bench.report.serving import serve_section
from dllm_bench.report.simulated import simulated_section

KINDS = ("serve", "accuracy", "ablate", "sweep")


# ---------------------------------------------------------------- finding runs
def find_runs(root: str | Path | None = None) -> dict[str, Path | None]:
    """Latest run of each kind; sweeps: the latest per --vary (keys sweep:input-len, sweep:output-len);
    accuracy: test-split runs only (dev runs are where choices are made), the latest of all under
    "accuracy" and the latest of each other task under "accuracy:<task>"; simulated runs (kind
    simulate, `simulated: true`): the latest per hardware profile under "simulate:<hardware>",
    only when there is one (a simulation is never a missing measurement); the latest frontier run
    under "frontier", also only when there is one."""

    base = results.results_root(root)
    out: dict[str, Path | None] = {k: results.latest_run(k, base) for k in ("serve", "ablate")}
    sweeps: dict[str, tuple] = {}
    acc: dict[str, tuple] = {}
    sims: dict[str, tuple] = {}
    for cfg in base.glob("*/config.json") if base.is_dir() else ():
        try:
            c = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        knobs = c.get("config") or {}
        if c.get("kind") == "accuracy" and knobs.get("split", "test") != "dev":
            cand = (c.get("created_utc", ""), cfg.parent.name, cfg.parent)
            t = knobs.get("task", "?")
            if t not in acc or cand > acc[t]:
                acc[t] = cand
        if c.get("kind") == "simulate" and knobs.get("simulated", True):
            hw = (knobs.get("hardware") or {}).get("name", "?")
            cand = (c.get("created_utc", ""), cfg.parent.name, cfg.parent)
            if hw not in sims or cand > sims[hw]:
                sims[hw] = cand
        if c.get("kind") == "sweep":
            vary = (c.get("config") or {}).get("vary", "")
            cand = (c.get("created_utc", ""), cfg.parent.name, cfg.parent)
            if vary and (vary not in sweeps or cand > sweeps[vary]):
                sweeps[vary] = cand
    for v in ("input-len", "output-len"):
        out[f"sweep:{v}"] = sweeps[v][2] if v in sweeps else None
    latest = max(acc.values()) if acc else None
    out["accuracy"] = latest[2] if latest else None
    for t, cand in sorted(acc.items()):
        if cand != latest:
            out[f"accuracy:{t}"] = cand[2]
    for hw, cand in sorted(sims.items()):
        out[f"simulate:{hw}"] = cand[2]
    frontier = results.latest_run("frontier", base)
    if frontier is not None:    # listed only when there is one: a newer kind of run, not a missing one
        out["frontier"] = frontier
    return out


SECTIONS = (("serve", serve_section), ("accuracy", accuracy_section), ("ablate", ablate_section),
            ("sweep:input-len", sweep_section), ("sweep:output-len", sweep_section))
HOW = {"serve": "dllm-bench serve --rps 0.1,0.25,0.5,1.0 --dataset livebench,osc,burstgpt",
       "accuracy": "dllm-bench accuracy", "ablate": "dllm-bench ablate",
       "sweep:input-len": "dllm-bench sweep --vary input-len", "sweep:output-len": "dllm-bench sweep --vary output-len"}


def render(out_path: str | Path, root: str | Path | None = None, runs: Mapping[str, Path | None] | None = None) -> dict:
    """Write the report; returns {"report", "runs", "missing", "claims", "errors"}."""

    out_path = Path(out_path)
    rel_base = out_path.parent
    files_dir = rel_base / f"{out_path.stem}_files"
    if files_dir.exists():
        shutil.rmtree(files_dir)
    runs = dict(runs) if runs is not None else find_runs(root)
    missing = [k for k, v in runs.items() if v is None]
    claims = Claims()
    errors: dict[str, str] = {}
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    head = ["# dllm-bench report: dLLM-Serve reproduction\n\n",
            f"Generated {now} from `{results.results_root(root)}`.\n\n",
            "Numbers attributed to the paper are quoted from its text (LLaDA-8B-Instruct, bfloat16, on an "
            "RTX 4090 and an L40S); ours come from the runs below, usually a small LLaDA-shaped model on a CPU, "
            "so agreement in *direction* matters more than in magnitude. Each claim has a **mark** on the "
            "direction of the effect: **reproduced** = our ratio is on the paper's side of 1.0, **not reproduced** "
            "= on the other side, **within noise** = the interval our repeats allow (min–max over `--repeats`; "
            "for accuracy, the Wilson intervals) straddles 1.0; a figure from a single run says **(one run)**. "
            "And a **verdict** on the magnitude: **matches** = our value "
            f"within the paper's value or range ±{int(TOLERANCE * 100)}%; **same direction** = same side of 1.0 "
            "but outside that band; **does not match** otherwise; trend claims compare the sign of the trend. "
            "Marks and verdicts are computed from the data each time the report is rendered. Simulated runs "
            "(`dllm-bench simulate`) have sections of their own, labelled with their hardware profile.\n\n",
            "## Runs\n\n"]
    for k, v in runs.items():
        if v is None:
            head.append(f"- {k}: **missing** (no run found; `{HOW.get(k, k)}` makes one)\n")
        else:
            try:
                c = results.load_config(v)
                head.append(f"- {k}: `{v.name}` (created {c.get('created_utc', '?')}, `{v}`)\n")
            except UserError:  # a damaged config.json: its section says so below
                head.append(f"- {k}: `{v}`\n")
    body = []
    extra = tuple((k, accuracy_section) for k in runs if k.startswith("accuracy:"))
    sims = tuple((k, simulated_section) for k in runs if k.startswith("simulate:"))
    front = (("frontier", frontier_section),) if "frontier" in runs else ()
    for key, fn in SECTIONS[:2] + extra + SECTIONS[2:] + front + sims:
        d = runs.get(key)
        if d is None:
            continue
        try:
            body.append(fn(Path(d), claims, files_dir, rel_base))
        except Exception as e:  # noqa: BLE001 - one unreadable run must not lose the others
            errors[key] = f"{type(e).__name__}: {e}"
            body.append(f"## {key}\n\n_could not render run `{Path(d).name}`: {errors[key]}_\n")
    summary = ["\n## Summary of claims\n\n"]
    if claims.rows:

        summary.append(md_table(pd.DataFrame(claims.rows)[["section", "claim", "paper", "ours", "mark", "verdict"]]))
    else:
        summary.append("_(no claims could be checked: no runs)_\n")
    text = "".join(head) + "".join(summary) + "\n" + "\n".join(body)
    results.atomic_write_bytes(out_path, text.encode("utf-8"))
    return {"report": str(out_path), "runs": {k: (str(v) if v else None) for k, v in runs.items()},
            "missing": missing, "claims": claims.rows, "errors": errors,
            "figures": sorted(str(p) for p in files_dir.glob("*.png")) if files_dir.is_dir() else []}


__all__: Sequence[str] = ("render", "find_runs")
