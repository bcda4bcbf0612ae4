"""The document `profile-step` prints with --json (and its table reads): per-step means of the
profiled steps' time split, their shape, FLOPs and bytes against the measured peaks, the ten
longest ops or kernels, and every profiled step.

Rates: `tflops_per_s` is the step's FLOPs over its wall time, `fraction_of_gemm_peak` that rate
over the measured GEMM peak (the step's MFU on this device); `gemm_fraction_of_peak` is the GEMM
and LM-head FLOPs over the time of the GEMM and LM-head categories (how fast the matmuls
themselves ran); `fraction_of_copy_bandwidth` the step's essential bytes over its wall time
over the measured copy bandwidth.
"""
from __future__ import annotations

from collections import defaultdict
from statistics import fmean

import torch

from dllm_bench.stepprofile.categories import CATEGORIES
from dllm_bench.stepprofile.measure import Measured
from dllm_bench.stepprofile.options import StepProfileSetup
from dllm_bench.stepprofile.work import counts

TOP = 10
ROW_FIELDS = ("requests", "padded_requests", "refresh", "reuse", "query_rows", "key_tokens", "logit_rows")


def graph_buckets(graphs) -> list[dict]:
    """Per CUDA-graph bucket of an engine's `StepGraphs`: its decision (graph, eager: its graph timed slower,
    plain: no capturer), both timings, steps and dummies."""
    return [{"batch": b, "keys": k, "block_length": bl,
             "decision": "plain" if e.graph_ms is None else "graph" if e.graph is not None else "eager",
             "graph_ms": e.graph_ms, "eager_ms": e.eager_ms, "steps": e.steps, "dummies": e.dummies}
            for (b, k, bl), e in sorted(graphs.entries.items())]


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def document(s: StepProfileSetup, info: dict, peaks: dict, m: Measured, shape) -> dict:
    o, p = s.options, s.run.preset
    n = len(m.profiled)
    steps = []
    for ps in m.profiled:
        w = counts(ps.forward, shape) if ps.forward is not None else None
        steps.append({**{k: ps.row[k] for k in ("wall_ms", *ROW_FIELDS, "graph")}, "cache": ps.row.get("cache"),
                      "profiled_wall_ms": ps.breakdown.wall_us / 1e3,
                      "categories_ms": {c: v / 1e3 for c, v in ps.breakdown.categories_us.items()},
                      "busy_ms": ps.breakdown.busy_us / 1e3, "work": w})
    wall = fmean(x["profiled_wall_ms"] for x in steps)
    cats = {c: fmean(x["categories_ms"][c] for x in steps) for c in CATEGORIES}
    works = [x["work"] for x in steps if x["work"] is not None]
    work = {k: fmean(w[k] for w in works) for k in works[0]} if works else {}
    if work:
        rate = work["flops"] / (wall / 1e3)
        matmul_ms = cats["gemm"] + cats["lm_head"]
        work.update(
            tflops_per_s=rate / 1e12,
            fraction_of_gemm_peak=_ratio(rate, peaks["gemm_flops_per_s"]),
            gemm_fraction_of_peak=_ratio((work["gemm_flops"] + work["lm_head_flops"]) / (matmul_ms / 1e3)
                                         if matmul_ms else 0.0, peaks["gemm_flops_per_s"]),
            bytes_per_s=work["bytes"] / (wall / 1e3),
            fraction_of_copy_bandwidth=_ratio(work["bytes"] / (wall / 1e3), peaks["copy_bytes_per_s"]))
    items: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for ps in m.profiled:
        for key, (us, calls) in ps.breakdown.items.items():
            items[key][0] += us
            items[key][1] += calls
    top = sorted(items.items(), key=lambda kv: -kv[1][0])[:TOP]
    device = str(info.get("device", p.device))
    return {
        "command": "profile-step", "system": s.variant.label, "kind": info.get("kind"), "model": str(p.model),
        "model_dir": str(s.run.model_dir), "preset": p.name, "device": device, "device_name": _device_name(device),
        "dtype": p.dtype, "threads": p.threads, "batch": o.batch, "phase": o.phase, "prompt_len": s.prompt_len,
        "gen_length": s.gen_length, "block_length": s.block_length, "steps": n, "warmup": o.warmup,
        "memory_budget": s.run.memory_budget, "scenario": info.get("scenario"),
        "kv_pool_tokens": info.get("kv_pool_tokens"), "attention": info.get("attention"), "peaks": peaks,
        "step": {"wall_ms": wall, "unprofiled_wall_ms": fmean(r["wall_ms"] for r in m.plain) if m.plain else None,
                 "categories_ms": cats, "busy_ms": fmean(x["busy_ms"] for x in steps)},
        "composition": {k: fmean(x[k] for x in steps) for k in ROW_FIELDS},
        "work": work,
        "graph_replays": {"profiled": sum(bool(x["graph"]) for x in steps),
                          "unprofiled": sum(bool(r["graph"]) for r in m.plain)},
        "top": [{"name": name, "category": cat, "ms_per_step": us / n / 1e3, "calls_per_step": calls / n,
                 "share_of_step": _ratio(us / n / 1e3, wall)} for (name, cat), (us, calls) in top],
        "steps_detail": steps,
        "unprofiled_steps": len(m.plain), "discarded_steps": m.discarded, "steps_run": m.steps_run, "fills": m.fills,
    }


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"
