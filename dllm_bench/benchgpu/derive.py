"""The figures summary.md compares, computed from what the steps kept.

From a serve point's counters (`stats`, as the point summary carries them): query rows per
generated token = query_tokens / output tokens (the work a token costs), rows per forward =
query_tokens / forwards (how big a step is), rows/s = query_tokens / duration (how fast the
rows run), and tok/s against the best baseline (the highest tok/s of a baseline at the same
rate and budget). From a per-step trace (`serve --trace-steps`, steps.jsonl: one row per
forward with wall_ms, requests, query_rows, graph): the median step, the share of graph
replays, and the rows/s of the steps of >= 2,000 rows alone. From a profile-step document: the
step's time, where it went, and the fraction of the GPU's peak it reached (docs/PROFILE_STEP.md's
`--json` fields). A field missing from a document shows as "not measured", never as an error.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dllm_bench.systems.spec import ENGINE

BIG_STEP_ROWS = 2000  # the goal's "steps of >= 2,000 rows"


def pick(doc: Mapping[str, Any] | None, *paths: str) -> Any:
    """The first of `paths` (dotted for nested keys) present in doc and not None."""
    for path in paths:
        node: Any = doc
        for key in path.split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        if node is not None:
            return node
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# ------------------------------------------------------------------ serve points
def best_baseline(points: Sequence[Mapping], key: str = "output_throughput", lowest: bool = False) -> Mapping | None:
    """The baseline point best at `key` (highest, or lowest for latencies)."""
    base = [p for p in points if p.get("is_baseline") and p.get(key) is not None]
    if not base:
        return None
    return (min if lowest else max)(base, key=lambda p: p[key])


def serve_rows(points: Sequence[Mapping]) -> list[dict]:
    """Every point of one rate and budget with its derived figures."""
    best = best_baseline(points)
    rows = []
    for p in points:
        tokens = p.get("total_output_tokens")
        q, fwd, dur = p.get("query_tokens"), p.get("forwards"), p.get("duration_s")
        trace = p.get("trace_stats") or {}
        rows.append({
            **p, "x_best": ratio(p.get("output_throughput"), best.get("output_throughput") if best else None),
            "best_baseline": best.get("system") if best else None,
            "rows_per_token": ratio(q, tokens) if tokens else None, "rows_per_forward": ratio(q, fwd),
            "rows_per_s": ratio(q, dur), "median_step_ms": trace.get("median_ms"),
            "graph_share": trace.get("graph_share")})
    return rows


def by_rate(points: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    out: dict[str, list[Mapping]] = {}
    for p in points:
        out.setdefault(str(p.get("rps")), []).append(p)
    return out


def point(points: Sequence[Mapping], system: str, rps: str | None = None) -> Mapping | None:
    return next((p for p in points if p.get("system") == system and (rps is None or str(p.get("rps")) == rps)), None)


# ------------------------------------------------------------------ per-step traces
def trace_stats(path: Path) -> dict | None:
    """The figures of one steps.jsonl (None for an empty or unreadable one)."""
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    ms = [float(v) for r in rows if (v := pick(r, "wall_ms", "ms")) is not None]
    if not rows or not ms:
        return None
    graphs = [bool(g) for r in rows if (g := pick(r, "graph", "graph_replayed")) is not None]
    big = [(float(pick(r, "query_rows", "query_tokens")), float(r["wall_ms"])) for r in rows
           if r.get("wall_ms") and (pick(r, "query_rows", "query_tokens") or 0) >= BIG_STEP_ROWS]
    return {"steps": len(rows), "median_ms": statistics.median(ms), "total_s": sum(ms) / 1000,
            "graph_share": sum(graphs) / len(graphs) if graphs else None,
            "big_steps": len(big), "big_rows_per_s": sum(q for q, _ in big) / (sum(t for _, t in big) / 1000) if big else None}


# ------------------------------------------------------------------ profile-step documents
def _categories(doc: Mapping) -> list[tuple[str, float]]:
    """(category, ms per step), largest first, from a dict or a list of {name, ms}."""
    raw = pick(doc, "step.categories_ms", "categories", "step.categories")
    items: list[tuple[str, float]] = []
    if isinstance(raw, Mapping):
        for name, v in raw.items():
            ms = v if isinstance(v, (int, float)) else pick(v, "ms", "ms_per_step", "time_ms")
            if isinstance(ms, (int, float)):
                items.append((str(name), float(ms)))
    elif isinstance(raw, list):
        for v in raw:
            name, ms = pick(v, "name", "category"), pick(v, "ms", "ms_per_step", "time_ms")
            if name is not None and isinstance(ms, (int, float)):
                items.append((str(name), float(ms)))
    return sorted(items, key=lambda kv: -kv[1])


def profile_figures(doc: Mapping) -> dict:
    """A profile-step document's step time (timed without the profiler where it has one: the
    profiler's own cost would blur graphs against eager), its largest categories (profiled), the
    share of its steps replayed as CUDA graphs and the fraction of the measured GEMM peak."""
    step_ms = pick(doc, "step.unprofiled_wall_ms", "step.wall_ms", "step_ms")
    cats = _categories(doc)
    total = sum(ms for _, ms in cats)
    replays, steps = pick(doc, "graph_replays.unprofiled", "graph_replays.profiled"), pick(doc, "steps")
    return {"step_ms": float(step_ms) if isinstance(step_ms, (int, float)) else None,
            "graph_share": replays / steps if isinstance(replays, (int, float)) and steps else None,
            "top": ", ".join(f"{n} {100 * ms / total:.0f}%" for n, ms in cats[:3]) if total else None,
            "gemm_peak_fraction": pick(doc, "work.fraction_of_gemm_peak", "fraction_of_gemm_peak")}


def graphs_vs_eager(entries: Sequence[Mapping]) -> list[dict]:
    """Per profiled engine batch: eager ms / graph ms (> 1: graphs faster)."""
    ms: dict[tuple[int, bool], float] = {}
    for e in entries:
        if e.get("system") == ENGINE and e.get("cuda_graphs") is not None and e.get("step_ms"):
            ms[(int(e["batch"]), bool(e["cuda_graphs"]))] = float(e["step_ms"])
    out = []
    for b in sorted({b for b, _ in ms}):
        g, e = ms.get((b, True)), ms.get((b, False))
        out.append({"batch": b, "graph_ms": g, "eager_ms": e, "speedup": ratio(e, g)})
    return out
