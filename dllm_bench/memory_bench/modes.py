"""`cache=auto` carried to the target: a canvas runs in the first mode that holds it — dual,
sparse, then none (engine.kv_cache: a request no cache mode can hold runs without one) — so
its longest canvas there is the longest any of those modes holds, each derived from traces of
requests that ran in it. The modes the search ran the engine in come with its traces. None, the
one that reaches furthest (it holds no KV) and that a pool holding every probe never shows, is
measured: the same engine with its KV pool emptied (`kv_pool_tokens=0`: every request is one no
cache holds) and the Refresh chunk its profile chose at each length.
"""
from __future__ import annotations

import dataclasses

from dllm_bench.memory_bench import derive as dv
from dllm_bench.memory_bench.options import MemoryRun
from dllm_bench.memory_bench.trace import Trace, measure
from dllm_bench.systems.spec import SystemVariant
from engine.models import DenseLM


def none_traces(variant: SystemVariant, traces: list[Trace], model: DenseLM, run: MemoryRun) -> list[Trace]:
    """The engine's requests run none: those the search ran so, and the same request measured
    with an empty pool at every other length a request completed."""
    out = [t for t in traces if t.cache == "none"]
    have = {t.length for t in out if t.complete}
    cached = {t.length: t for t in traces if t.complete and t.cache != "none" and t.length not in have}
    for n, t in sorted(cached.items()):
        knobs = (("kv_pool_tokens", 0),) + ((("refresh_chunk_tokens", t.chunk),) if t.chunk else ())
        out.append(measure(SystemVariant(variant.name, variant.knobs + knobs, variant.label), model, run, n))
    return out


def derive_auto(variant: SystemVariant, traces: list[Trace], model: DenseLM, run: MemoryRun,
                reservation: float, guard: float) -> dv.Derived:
    """The longest canvas any of auto's modes holds at the target (`Derived.mode` says which);
    the dynamic peak-to-average is the request measured at --length, in the mode it ran in."""
    by_mode = {m: [t for t in traces if t.cache == m] for m in ("dual", "sparse")}
    by_mode["none"] = none_traces(variant, traces, model, run)
    own = dv.derive(variant.label, traces, model, run, run.target, reservation, guard)
    derived = [dataclasses.replace(dv.derive(variant.label, ts, model, run, run.target, reservation, guard), mode=m)
               for m, ts in by_mode.items() if ts]
    best = max(derived, key=lambda d: d.max_length or 0, default=own)
    return dataclasses.replace(best, dynamic_peak_to_average=own.dynamic_peak_to_average)
