"""What a `dllm-bench memory` run shows and writes: one row per system (its longest canvas, the
memory over one request's steps and its split at the peak), the goals' lines, the plot of memory
over steps, and the run directory's files (summary.json, memory.csv, steps.csv, probes.csv)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.console import print_df
from dllm_bench.plots import plt, save_png
from dllm_bench.systems.spec import DECODING_BASELINE, ENGINE

MiB = 2**20
PARTS = ("weights", "kv", "logits", "ffn", "attention")
COLORS = {"weights": "#9e9e9e", "kv": "#1f77b4", "logits": "#d62728", "ffn": "#ff7f0e", "attention": "#2ca02c"}
FMT = {"peak MiB": "{:,.1f}", "avg MiB": "{:,.1f}", "peak/avg": "{:.2f}", "dyn peak/avg": "{:.2f}",
       "KV MiB": "{:,.1f}", "logits MiB": "{:,.1f}", "FFN MiB": "{:,.1f}", "attn MiB": "{:,.1f}",
       "derived bytes/token": "{:,.0f}"}


def profile_stats(steps: list[dict]) -> dict:
    """Peak, average and peak-to-average of the total (allocated) and of the dynamic part (the
    request's KV and the step's transients) over a request's steps; the split at the peak."""
    if not steps:
        return {}
    total = [s["total"] for s in steps]
    dyn = [s["kv_used"] + s["logits"] + s["ffn"] + s["attention"] for s in steps]
    top = max(steps, key=lambda s: s["total"])
    avg, davg = sum(total) / len(total), sum(dyn) / len(dyn)
    return {"steps": len(steps), "peak_bytes": max(total), "average_bytes": avg, "peak_to_average": max(total) / avg,
            "dynamic_peak_bytes": max(dyn), "dynamic_average_bytes": davg,
            "dynamic_peak_to_average": max(dyn) / davg if davg else None,
            "at_peak": {k: top[k] for k in PARTS} | {"step": top["step"], "phase": top["phase"]}}


def rows(doc: dict) -> pd.DataFrame:
    out = []
    for s in doc["systems"]:
        p, st = s["profile"], s["profile"].get("stats", {})
        at = st.get("at_peak", {})
        row = {"system": s["system"], "max length": s["search"]["max_length"] if s.get("search") else None,
               "next up": s["search"]["first_failing"] if s.get("search") else None,
               "trained": doc["trained_length"], "length": p["length"],
               "fits": "yes" if p["fits"] else f"no: {p['reason'][:40]}",
               "peak MiB": st.get("peak_bytes", 0) / MiB if st else None,
               "avg MiB": st.get("average_bytes", 0) / MiB if st else None,
               "peak/avg": st.get("peak_to_average"), "dyn peak/avg": st.get("dynamic_peak_to_average"),
               "KV MiB": at.get("kv", 0) / MiB if at else None, "logits MiB": at.get("logits", 0) / MiB if at else None,
               "FFN MiB": at.get("ffn", 0) / MiB if at else None, "attn MiB": at.get("attention", 0) / MiB if at else None}
        if s.get("derived"):
            row["derived max length"] = s["derived"]["max_length"]
            row["derived bytes/token"] = s["derived"]["bytes_per_token"]
            row["derived mode"] = s["derived"].get("mode") or ""       # cache=auto: the mode that reaches it
        out.append(row)
    return pd.DataFrame(out)


def goals(doc: dict) -> list[str]:
    """The issue's goals, as measured: the engine's longest canvas against Fast-dLLM's (and the
    token budget), and every system's peak-to-average over the request's steps."""
    lines = canvas_goals(doc)
    for name, s in {s["system"]: s for s in doc["systems"]}.items():
        st = s["profile"].get("stats") or {}
        derived = (s.get("derived") or {}).get("dynamic_peak_to_average")
        if st:
            lines.append(f"{name} peak-to-average over {st['steps']} steps at {s['profile']['length']:,} tokens: "
                         f"{st['peak_to_average']:.2f} allocated, {st['dynamic_peak_to_average'] or 0:.2f} dynamic"
                         + (f", {derived:.2f} dynamic derived" if derived else "")
                         + (" (goal <= 1.5)" if name.split(":")[0] == ENGINE else ""))
    return lines


def canvas_goals(doc: dict, name: Callable[[dict], str] | None = None, budget: bool = True) -> list[str]:
    """Each engine's longest canvas against Fast-dLLM's, measured and derived, and (`budget`)
    against its token budget; `name` labels a system's entry (a docs' memory table prints these
    beneath it, by its row names). Not measured where Fast-dLLM reached the search's cap: its
    longest canvas is unknown there."""
    name = name or (lambda s: s["system"])
    lines = []
    engines = [s for s in doc["systems"] if s["system"].split(":")[0] == ENGINE]
    fast = next((s for s in doc["systems"] if s["system"].split(":")[0] == DECODING_BASELINE), None)
    capped = ((fast or {}).get("search") or {}).get("first_failing") is None
    for e in engines:
        for key, label in (("search", "measured"), ("derived", "derived")):
            a = (e.get(key) or {}).get("max_length")
            b = None if key == "search" and capped else ((fast or {}).get(key) or {}).get("max_length")
            mode = (e.get(key) or {}).get("mode")
            if a and b:
                lines.append(f"{name(e)} longest canvas / {name(fast)}'s ({label}"
                             f"{f', in mode {mode}' if mode else ''}): {a:,} / {b:,} = {a / b:.1f}x (goal >= 16x)")
        tokens = e.get("max_num_batched_tokens")
        a = (e.get("search") or {}).get("max_length")
        if a and tokens and budget:
            lines.append(f"{name(e)} longest canvas {a:,} vs its token budget {tokens:,}: "
                         f"{'beyond' if a > tokens else 'within'} it")
    return lines


def plot_steps(doc: dict, path: Path) -> Path:
    """Memory over one request's steps, one panel per system, stacked by category; the budget."""
    systems = [s for s in doc["systems"] if s["profile"]["steps"]]
    n = max(1, len(systems))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False, sharey=True)
    for ax, s in zip(axes[0], systems):
        steps = s["profile"]["steps"]
        x = [st["step"] for st in steps]
        ax.stackplot(x, *[[st[k] / MiB for st in steps] for k in PARTS], labels=PARTS,
                     colors=[COLORS[k] for k in PARTS], step="mid")
        ax.axhline(doc["budget_bytes"] / MiB, color="black", linestyle="--", linewidth=1, label="budget")
        ax.set_title(f"{s['system']}\n{s['profile']['length']:,} tokens", fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("allocated (MiB)")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"memory over one request's steps · {doc['model']} · budget {doc['budget_bytes'] / MiB:,.0f} MiB",
                 fontsize=10, y=1.06)
    return save_png(fig, path)


def write(run_dir: Path, doc: dict) -> None:
    results.atomic_write_json(run_dir / "summary.json", doc)
    results.atomic_write_csv(run_dir / "memory.csv", rows(doc))
    steps = [dict(system=s["system"], length=s["profile"]["length"], **{k: v for k, v in st.items() if k != "parts"})
             for s in doc["systems"] for st in s["profile"]["steps"]]
    results.atomic_write_csv(run_dir / "steps.csv", pd.DataFrame(steps))
    probes = [dict(system=s["system"], **p) for s in doc["systems"] for p in (s.get("search") or {}).get("probes", [])]
    results.atomic_write_csv(run_dir / "probes.csv", pd.DataFrame(probes))
    (run_dir / "plots").mkdir(exist_ok=True)
    plot_steps(doc, run_dir / "plots" / "memory_steps.png")


def show(con, doc: dict) -> None:
    df = rows(doc)
    print_df(con, df, f"memory · {doc['model']} ({doc['dtype']}) · budget {doc['budget_bytes'] / MiB:,.0f} MiB · "
                      f"longest canvas within it (search) and one request's steps at --length", FMT, drop=())
    for line in goals(doc):
        con.print(line)
    if doc.get("derive_note"):
        con.print(doc["derive_note"])
    con.print(f"run directory: {doc['run_dir']}")
