"""The frontier of a run's configurations (accuracy vs output tokens/s) and the goals' verdicts,
pure functions over the run's rows (one per configuration: `accuracy` pooled over the models,
`tps` / `tps_min` / `tps_max` the median and min–max over repeats).

Goals (issue 39), both at the run's one concurrency:
* **engine vs Fast-dLLM** — at every accuracy level a Fast-dLLM point reaches, the engine's
  fastest point with at least that accuracy has ≥ 1.0× its throughput;
* **parallel vs fixed** — per engine variant, its fastest point within 1 accuracy point of
  its own `fixed` point has ≥ 2× the tokens/s of `fixed` (stated for synth-cot).

A ratio is the median over repeats with the extremes the min–max intervals allow
(dllm_bench.repeats.ratio); a verdict whose interval straddles its target says "within noise".
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from dllm_bench.repeats import Spread, ratio
from dllm_bench.systems.spec import DECODING_BASELINE, ENGINE
from engine.decoding import FIXED

ENGINE_VS_FAST_DLLM = 1.0      # x Fast-dLLM's throughput at each of its accuracy levels
PARALLEL_VS_FIXED = 2.0        # x the engine's fixed throughput ...
MAX_ACCURACY_LOSS = 0.01       # ... losing at most one accuracy point


def spread(row: Mapping) -> Spread:
    return Spread(row["tps"], row.get("tps_min", row["tps"]), row.get("tps_max", row["tps"]), row.get("repeats", 1))


def dominated(row: Mapping, rows: Sequence[Mapping]) -> bool:
    """Another configuration is at least as accurate and as fast, and better in one of the two."""
    a, t = row["accuracy"], row["tps"]
    return any(o is not row and o["accuracy"] >= a and o["tps"] >= t and (o["accuracy"] > a or o["tps"] > t)
               for o in rows)


def mark_front(rows: Sequence[dict]) -> list[dict]:
    """Each row with `pareto`: not dominated by any configuration of the run."""
    return [{**r, "pareto": not dominated(r, rows)} for r in rows]


def _check(r: Spread, target: float) -> tuple[bool, str]:
    met = r.median >= target
    noisy = r.n > 1 and r.lo < target <= r.hi
    return met, ("within noise" if noisy else "met" if met else "not met")


def engine_vs_fast_dllm(rows: Sequence[Mapping], target: float = ENGINE_VS_FAST_DLLM) -> dict:
    """For each Fast-dLLM point: the fastest engine point at least as accurate, and the ratio."""
    engine = [r for r in rows if r["system_name"] == ENGINE]
    levels = sorted((r for r in rows if r["system_name"] == DECODING_BASELINE), key=lambda r: r["accuracy"])
    if not engine or not levels:
        return {"goal": _goal1(target), "met": None, "text": "needs engine and fast-dllm points", "levels": []}
    out = []
    for f in levels:
        reach = [e for e in engine if e["accuracy"] >= f["accuracy"]]
        if not reach:
            out.append({"fast_dllm": f["label"], "accuracy": f["accuracy"], "engine": None, "ratio": None,
                        "met": False, "mark": "not met (no engine point this accurate)"})
            continue
        e = max(reach, key=lambda r: r["tps"])
        x = ratio(spread(e), spread(f))
        met, mark = _check(x, target)
        out.append({"fast_dllm": f["label"], "accuracy": f["accuracy"], "engine": e["label"],
                    "engine_accuracy": e["accuracy"], "ratio": x.median, "ratio_min": x.lo, "ratio_max": x.hi,
                    "met": met, "mark": mark})
    met = all(lv["met"] for lv in out)
    worst = min((lv for lv in out if lv["ratio"] is not None), key=lambda lv: lv["ratio"], default=None)
    text = (f"{'met' if met else 'not met'}: at each of Fast-dLLM's {len(out)} accuracy levels the engine's fastest "
            f"point at least as accurate is ≥ {target:g}x" if met else
            f"not met at {sum(not lv['met'] for lv in out)} of Fast-dLLM's {len(out)} accuracy levels")
    if worst is not None:
        text += f" (lowest ratio {worst['ratio']:.2f}x vs {worst['fast_dllm']})"
    if any(lv["mark"] == "within noise" for lv in out):
        text += "; some ratios within noise"
    return {"goal": _goal1(target), "met": met, "text": text, "levels": out}


def _goal1(target: float) -> str:
    return f"engine ≥ {target:g}x Fast-dLLM's tok/s at every accuracy level Fast-dLLM reaches (same concurrency)"


def parallel_vs_fixed(rows: Sequence[Mapping], target: float = PARALLEL_VS_FIXED,
                      max_loss: float = MAX_ACCURACY_LOSS) -> dict:
    """Per engine variant: its fastest point within `max_loss` of its fixed point's accuracy."""
    goal = (f"the engine's best point ≥ {target:g}x the tok/s of fixed at ≤ {max_loss * 100:g} accuracy point "
            "lost (stated for synth-cot)")
    variants = []
    for fx in (r for r in rows if r["system_name"] == ENGINE and r["decoding"] == FIXED):
        same = [r for r in rows if r["system"] == fx["system"] and r["accuracy"] >= fx["accuracy"] - max_loss - 1e-12]
        best = max(same, key=lambda r: r["tps"])
        x = ratio(spread(best), spread(fx))
        met, mark = _check(x, target)
        variants.append({"system": fx["system"], "fixed_accuracy": fx["accuracy"], "best": best["label"],
                         "best_accuracy": best["accuracy"], "ratio": x.median, "ratio_min": x.lo,
                         "ratio_max": x.hi, "met": met, "mark": mark})
    if not variants:
        return {"goal": goal, "met": None, "text": "needs an engine point with decoding fixed", "variants": []}
    top = max(variants, key=lambda v: v["ratio"])
    text = (f"{top['mark']}: {top['best']} is {top['ratio']:.2f}x {top['system']} · fixed "
            f"(accuracy {top['best_accuracy'] * 100:.1f} vs {top['fixed_accuracy'] * 100:.1f} %)")
    return {"goal": goal, "met": top["met"], "text": text, "variants": variants}


def verdicts(rows: Sequence[Mapping], task: str) -> dict:
    out = {"engine_vs_fast_dllm": engine_vs_fast_dllm(rows), "parallel_vs_fixed": parallel_vs_fixed(rows)}
    if task != "synth-cot":
        out["parallel_vs_fixed"]["text"] += f" (the goal is stated for synth-cot; this run is {task})"
    return out
