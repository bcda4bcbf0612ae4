"""summary.md: the goals side by side (measured, target, verdict), the steps with their estimated
and actual seconds, then each regime's serving table with the derived figures, the step
profile, the memory report, doctor's rows and where every file is. Rewritten after each step,
so a run stopped halfway still says what it measured."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from dllm_bench.benchgpu import derive as dv
from dllm_bench.benchgpu.goals import evaluate
from dllm_bench.benchgpu.record import Bench
from dllm_bench.console import md_table
from dllm_bench.results import atomic_open

FLOATS = {"tok/s": "{:.1f}", "x best": "{:.2f}", "mean batch": "{:.1f}", "mean E2EL s": "{:.2f}",
          "P99 E2EL s": "{:.2f}", "TTFT s": "{:.2f}", "rows/token": "{:.1f}", "rows/forward": "{:,.0f}",
          "rows/s": "{:,.0f}", "median step ms": "{:.1f}", "graph steps": "{:.0%}", "ms/step": "{:.2f}",
          "graphs x eager": "{:.2f}", "peak fraction": "{:.2f}", "estimate s": "{:.0f}", "actual s": "{:.1f}",
          "forwards": "{:,.0f}", "query rows": "{:,.0f}"}
DEFINITIONS = ("tok/s: generated tokens per second of the replay; x best: over the best baseline's tok/s at the same "
               "budget and rate; rows/token: query rows (tokens through the layers) per generated token, the work a "
               "token costs; rows/forward: query rows per forward, the size of a step; rows/s: query rows per second "
               "of the replay; median step ms and graph steps (the share of forwards replayed as a CUDA graph) from the "
               "point's steps.jsonl. Ratios above 1 favour the engine.")


def _s(ms: Any) -> float | None:
    return ms / 1000 if isinstance(ms, (int, float)) else None


def _table(rows: Sequence[Mapping], columns: Mapping[str, str]) -> str:
    """rows -> a Markdown table of `columns` (header -> row key)."""
    df = pd.DataFrame([{h: r.get(k) for h, k in columns.items()} for r in rows], columns=list(columns))
    return md_table(df, {h: f for h, f in FLOATS.items() if h in columns})


def _serve_section(title: str, points: Sequence[Mapping]) -> str:
    rows = []
    for r in dv.serve_rows(points):
        label = r["system"] + (" (baseline)" if r.get("is_baseline") else "")
        unfinished = (r.get("num_prompts") or 0) - (r.get("completed") or 0)
        rows.append({**r, "label": label + (f" [{unfinished} unfinished]" if unfinished > 0 else ""),
                     "B": r.get("max_batch_size") or "-", "e2el": _s(r.get("mean_e2el_ms")),
                     "p99": _s(r.get("p99_e2el_ms")), "ttft": _s(r.get("mean_ttft_ms"))})
    cols = {"system": "label", "B": "B", "mean batch": "mean_batch_size", "tok/s": "output_throughput",
            "x best": "x_best", "mean E2EL s": "e2el", "P99 E2EL s": "p99", "TTFT s": "ttft", "forwards": "forwards",
            "query rows": "query_tokens", "rows/token": "rows_per_token", "rows/forward": "rows_per_forward",
            "rows/s": "rows_per_s", "median step ms": "median_step_ms", "graph steps": "graph_share"}
    best = next((r["best_baseline"] for r in rows if r.get("best_baseline")), None)
    return f"### {title}\n\n" + _table(rows, cols) + (f"\nbest baseline: {best}\n" if best else "")


def _serving(bench: Bench) -> str:
    out = []
    full = bench.records.get("serve-full")
    if full is not None and full.data.get("points"):
        d = full.data
        out.append(_serve_section(f"{bench.scale.full_budget_label}, saturation: {d['prompts']} requests at once",
                                  d["points"]))
        if bench.aliases:
            out.append("".join(f"{a} is the engine's default here: the `{b}` row stands for it.\n"
                               for a, b in bench.aliases.items()))
    small = bench.records.get("serve-22g")
    if small is not None and small.data.get("points"):
        d = small.data
        for rps, pts in sorted(dv.by_rate(d["points"]).items(), key=lambda kv: kv[0] != "inf"):
            how = "saturation: all at once" if rps == "inf" else f"{rps} req/s"
            out.append(_serve_section(f"{bench.scale.small_budget_label}, {how} ({d['prompts']} requests)", pts))
    if not out:
        return ""
    return "## Serving (`serve --decoding fixed`)\n\n" + DEFINITIONS + "\n\n" + "\n".join(out)


def _profile(bench: Bench) -> str:
    entries = [e for step in ("profile", "profile-baselines") if (rec := bench.records.get(step)) is not None
               for e in rec.data.get("entries", [])]
    if not entries:
        return ""
    speed = {g["batch"]: g["speedup"] for g in dv.graphs_vs_eager(entries)}
    rows = [{**e, "graphs": {True: "on", False: "off", None: "-"}[e.get("cuda_graphs")],
             "x": speed.get(e["batch"]) if e.get("cuda_graphs") else None,
             "batch_cell": f"{e['batch']} ({e['batch_from']})" if e.get("batch_from", "scale") != "scale" else e["batch"],
             "state": e.get("status", "") + (f": {e['reason']}" if e.get("reason") else "")} for e in entries]
    cols = {"system": "system", "CUDA graphs": "graphs", "batch": "batch_cell", "ms/step": "step_ms",
            "graphs x eager": "x", "graph steps": "graph_share", "largest shares": "top",
            "peak fraction": "gemm_peak_fraction", "status": "state", "file": "file"}
    return ("## Step profile (`profile-step`)\n\nThe engine in Reuse-only steps (the steps CUDA graphs replay), each "
            "baseline as it serves. ms/step: timed without the profiler; graphs x eager: the eager step's time over the "
            "graph step's at the same batch (> 1: graphs faster); largest shares: the categories of the profiled step; "
            "peak fraction: the step's FLOP/s over the measured GEMM peak.\n\n" + _table(rows, cols))


def _memory(bench: Bench) -> str:
    rec = bench.records.get("memory")
    entries = rec.data.get("entries", []) if rec is not None else []
    if not entries:
        return ""
    rows = [{**e, "budget": e.get("budget") or "whole GPU (default)",
             "state": e["status"] + (f": {e['reason']}" if e.get("reason") else "")} for e in entries]
    return "## Memory (`dllm-bench memory`)\n\n" + _table(rows, {"budget": "budget", "status": "state", "file": "file"})


def _doctor(bench: Bench) -> str:
    checks = bench.data("doctor").get("checks", [])
    if not checks:
        return ""
    return "## Doctor\n\n" + _table(checks, {"check": "name", "status": "status", "detail": "detail"})


def _files(bench: Bench) -> str:
    lines = [f"- {r.name}: " + ", ".join(f"`{o}`" for o in r.outputs) for r in bench.records.values() if r.outputs]
    for name in ("serve-full", "serve-22g"):
        for p in bench.data(name).get("points", []):
            if p.get("trace"):
                lines.append(f"- trace {name} {p['system']} @ {p['rps']}: `{p['trace']}`")
    return "## Files\n\n" + "\n".join(lines) + "\n" if lines else ""


def render(bench: Bench) -> str:
    steps = [{"step": r.name, "status": r.status, "estimate s": r.estimate_s, "actual s": r.seconds,
              "detail": r.detail} for r in bench.records.values()]
    head = [f"# bench-gpu: {bench.model} on {bench.scale.device} ({bench.scale.name} scale)", "",
            f"written {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; {bench.elapsed_s():.0f} s so far of "
            f"an estimated {sum(r.estimate_s for r in bench.records.values()):.0f} s"
            + (f" (budget {bench.time_budget_s:.0f} s)" if bench.time_budget_s else "") + ".", ""]
    head += [f"{n}  " for n in bench.notes] + [""]
    goals = "## Goals\n\n" + _table(evaluate(bench), {"goal": "goal", "measured": "measured", "target": "target",
                                                       "verdict": "verdict"})
    step_table = "## Steps\n\n" + md_table(pd.DataFrame(steps), {k: FLOATS[k] for k in ("estimate s", "actual s")})
    parts = [goals, step_table, _serving(bench), _profile(bench), _memory(bench), _doctor(bench), _files(bench)]
    return "\n".join(head) + "\n" + "\n".join(p for p in parts if p)


def write(bench: Bench) -> None:
    with atomic_open(bench.out / "summary.md") as f:
        f.write(render(bench))
