"""The goals of the engine on a GPU, each with its target, the value this run measured and a
verdict: met, not met, or not measured (and why: the step that would measure it failed, did not
run, or its output lacks the figure). Throughput and latency targets are ratios to the best
baseline of the same regime (the highest tok/s, the lowest P99 E2EL or TTFT: the comparison
most favourable to the baselines)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dllm_bench.benchgpu import derive as dv
from dllm_bench.benchgpu.record import OK, Bench
from dllm_bench.results import fmt_rps
from dllm_bench.systems.spec import ENGINE

MET, NOT_MET = "met", "not met"


@dataclass(frozen=True)
class Goal:
    text: str
    target: str
    check: Callable[[Bench], tuple[str, str | None]]   # (measured, verdict) or (why not, None)


class Missing(Exception):
    """The figure a goal needs is not there; the message says why."""


def _points(bench: Bench, step: str, rps: str | None = None) -> list[Mapping]:
    rec = bench.records.get(step)
    if rec is None:
        raise Missing(f"{step} not selected")
    want = None if rps is None else fmt_rps(float(rps))  # "1.0" names the points of rate "1"
    pts = [p for p in rec.data.get("points", []) if want is None or str(p.get("rps")) == want]
    if not pts:
        raise Missing(f"{step} {rec.status}" + (f": {rec.detail}" if rec.detail else ""))
    return pts


def _system(bench: Bench, points: Sequence[Mapping], system: str, step: str) -> Mapping:
    p = dv.point(points, system) or dv.point(points, bench.aliases.get(system, system))
    if p is None:
        raise Missing(f"no {system} point in {step}")
    return p


def _flag(p: Mapping) -> str:
    """A point whose requests did not all finish: its figures are marked."""
    left = (p.get("num_prompts") or 0) - (p.get("completed") or 0)
    return f" ({left} of {p.get('num_prompts')} requests unfinished)" if left > 0 else ""


def _best(points: Sequence[Mapping], key: str, lowest: bool = False) -> Mapping:
    b = dv.best_baseline(points, key, lowest)
    if b is None:
        raise Missing("no baseline point")
    return b


def _verdict(ok: bool) -> str:
    return MET if ok else NOT_MET


def throughput_vs_best(step: str, rps: str | None, target: float) -> Callable[[Bench], tuple[str, str]]:
    def check(bench: Bench) -> tuple[str, str]:
        pts = _points(bench, step, rps)
        eng, best = _system(bench, pts, "engine", step), _best(pts, "output_throughput")
        r = dv.ratio(eng["output_throughput"], best["output_throughput"])
        return (f"{r:.2f}x: {eng['output_throughput']:.1f} vs {best['system']} {best['output_throughput']:.1f} "
                f"tok/s{_flag(eng)}", _verdict(r >= target))
    return check


def variant_vs(variant: str, baseline: str, target: float) -> Callable[[Bench], tuple[str, str]]:
    def check(bench: Bench) -> tuple[str, str]:
        pts = _points(bench, "serve-full")
        v, b = _system(bench, pts, variant, "serve-full"), _system(bench, pts, baseline, "serve-full")
        r = dv.ratio(v["output_throughput"], b["output_throughput"])
        alias = f" (the engine's default is {variant})" if dv.point(pts, variant) is None else ""
        return (f"{r:.2f}x: {v['output_throughput']:.1f} vs {b['output_throughput']:.1f} tok/s{alias}{_flag(v)}",
                _verdict(r >= target))
    return check


def engine_tok_s(target: float) -> Callable[[Bench], tuple[str, str]]:
    def check(bench: Bench) -> tuple[str, str]:
        eng = _system(bench, _points(bench, "serve-full"), "engine", "serve-full")
        return f"{eng['output_throughput']:.1f} tok/s{_flag(eng)}", _verdict(eng["output_throughput"] >= target)
    return check


def latency_vs_best(step: str, rps: str | None, key: str, target: float, what: str) -> Callable[[Bench], tuple[str, str]]:
    """Lower is better: best baseline's value / the engine's, against `target`."""
    def check(bench: Bench) -> tuple[str, str]:
        rate = bench.scale.rate if rps == "rate" else rps
        pts = _points(bench, step, rate)
        eng, best = _system(bench, pts, "engine", step), _best(pts, key, lowest=True)
        if eng.get(key) is None:
            raise Missing(f"the engine point has no {what}")
        r = dv.ratio(best[key], eng[key])
        return (f"{r:.2f}x lower: {eng[key] / 1000:.2f} s vs {best['system']} {best[key] / 1000:.2f} s{_flag(eng)}",
                _verdict(r >= target))
    return check


def big_step_rows(target: float) -> Callable[[Bench], tuple[str, str]]:
    def check(bench: Bench) -> tuple[str, str]:
        eng = _system(bench, _points(bench, "serve-full"), "engine", "serve-full")
        trace = eng.get("trace_stats") or {}
        if trace.get("big_rows_per_s") is not None:
            rate = trace["big_rows_per_s"]
            return (f"{rate:,.0f} rows/s over the {trace['big_steps']} steps of >= {dv.BIG_STEP_ROWS:,} rows "
                    f"(trace)", _verdict(rate >= target))
        if trace:
            return f"no step of >= {dv.BIG_STEP_ROWS:,} rows in the engine's trace ({trace['steps']} steps)", NOT_MET
        row = dv.serve_rows([eng])[0]
        if row["rows_per_s"] is None or row["rows_per_forward"] is None:
            raise Missing("the engine point has no query rows")
        return (f"{row['rows_per_s']:,.0f} rows/s at {row['rows_per_forward']:,.0f} rows per forward (no trace: "
                f"the whole run)", _verdict(row["rows_per_s"] >= target and row["rows_per_forward"] >= dv.BIG_STEP_ROWS))
    return check


def _profiles(bench: Bench) -> list[Mapping]:
    rec = bench.records.get("profile")
    if rec is None:
        raise Missing("profile not selected")
    entries = [e for e in rec.data.get("entries", []) if e.get("status") == OK]
    if not entries:
        raise Missing(f"profile {rec.status}" + (f": {rec.detail}" if rec.detail else ""))
    return entries


def graphs_speedup(max_batch: int | None, target: float) -> Callable[[Bench], tuple[str, str]]:
    def check(bench: Bench) -> tuple[str, str]:
        pairs = [g for g in dv.graphs_vs_eager(_profiles(bench)) if max_batch is None or g["batch"] <= max_batch]
        done = [g for g in pairs if g["speedup"] is not None]
        if not done:
            raise Missing("no engine batch profiled with graphs both on and off" +
                          (f" at batch <= {max_batch}" if max_batch else ""))
        cells = ", ".join(f"B={g['batch']}: {g['speedup']:.2f}x" for g in done)
        return cells, _verdict(all(g["speedup"] >= target for g in done))
    return check


def one_request_ms(target: float) -> Callable[[Bench], tuple[str, str]]:
    def check(bench: Bench) -> tuple[str, str]:
        one = next((e for e in _profiles(bench) if e.get("system") == ENGINE and e.get("batch") == 1
                    and e.get("cuda_graphs")), None)
        if one is None or one.get("step_ms") is None:
            raise Missing("no engine profile at batch 1 with CUDA graphs (or no step time in it)")
        return f"{one['step_ms']:.2f} ms per Reuse step", _verdict(one["step_ms"] <= target)
    return check


GOALS = (
    Goal("whole GPU, saturation: engine (default) vs best baseline, tok/s", ">= 1.05x",
         throughput_vs_best("serve-full", None, 1.05)),
    Goal("whole GPU, saturation: engine (default) tok/s, fixed decoding", ">= 380 tok/s", engine_tok_s(380)),
    Goal("whole GPU, saturation: engine:cache=dual vs Fast-dLLM, tok/s", ">= 1.0x",
         variant_vs("engine:cache=dual", "fast-dllm", 1.0)),
    Goal("whole GPU, saturation: engine:cache=sparse vs Sparse-dLLM, tok/s", ">= 1.0x",
         variant_vs("engine:cache=sparse", "sparse-dllm", 1.0)),
    Goal("22 GiB, saturation: engine vs best baseline, tok/s", ">= 1.5x", throughput_vs_best("serve-22g", "inf", 1.5)),
    Goal("22 GiB, steady rate: engine P99 E2EL vs the lowest baseline's", ">= 2x lower",
         latency_vs_best("serve-22g", "rate", "p99_e2el_ms", 2.0, "P99 E2EL")),
    Goal("22 GiB, steady rate: engine mean TTFT vs every baseline's", "no worse (>= 1.0x lower)",
         latency_vs_best("serve-22g", "rate", "mean_ttft_ms", 1.0, "TTFT")),
    Goal("whole GPU, saturation: engine mean TTFT vs every baseline's", "no worse (>= 1.0x lower)",
         latency_vs_best("serve-full", None, "mean_ttft_ms", 1.0, "TTFT")),
    Goal("22 GiB, saturation: engine mean TTFT vs every baseline's", "no worse (>= 1.0x lower)",
         latency_vs_best("serve-22g", "inf", "mean_ttft_ms", 1.0, "TTFT")),
    Goal("query rows/s in steps of >= 2,000 rows (engine, whole GPU, saturation)", ">= 25,000 rows/s",
         big_step_rows(25_000)),
    Goal("CUDA graphs vs eager, engine step time, every profiled batch", ">= 1.0x", graphs_speedup(None, 1.0)),
    Goal("CUDA graphs vs eager, batch 1-4", ">= 1.5x", graphs_speedup(4, 1.5)),
    Goal("one request, ms per step (engine, CUDA graphs)", "<= 8 ms", one_request_ms(8.0)),
)


def evaluate(bench: Bench) -> list[dict]:
    rows = []
    for g in GOALS:
        try:
            measured, verdict = g.check(bench)
        except Missing as e:
            measured, verdict = "", f"not measured: {e}"
        rows.append({"goal": g.text, "measured": measured, "target": g.target, "verdict": verdict})
    return rows
