"""Peaks and operators: what one forward's pieces cost on this machine, and the efficiencies
that explain them.

1. Peaks: the FLOP rate of a large GEMM and the bandwidth of a large copy, in the model dtype.
2. Operators: GEMMs over a grid of M for every (K, N) of the model (the four per-layer GEMMs
   and the LM head) and attention over a (q, k) grid, through the engine's own attention call
   (`engine_attention`), every size within the device's budget (`bounds`); fit (u_c, u_m, u_attn,
   c_op) of `cost_model.gemm_time` / `attention_time` by least squares on log time (relative
   error), then u_c per M (the GEMM time the bandwidth term leaves, per grid row count). Each
   GEMM call reads a weight copy that is not in the cache (copies cycled past the last-level
   cache), as a forward streaming its weights does, by the model's call (F.linear, [N, K]).

The fit functions take samples, not a machine: tests feed them synthetic timings and check that
the parameters come back (the round trip).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from dllm_bench.simulate import bounds
from dllm_bench.simulate.calibrate.mode import Timer, mode_for
from dllm_bench.simulate.cost_model import Efficiency, ModelShape, attention_bytes, attention_time, gemm_time
from dllm_bench.timing import peak_rates
from engine import attention


@dataclass(frozen=True)
class OpSample:
    kind: str            # "gemm" | "attn"
    a: int               # M (gemm) or q (attn, per head group)
    b: int               # K (gemm) or k
    c: int               # N (gemm) or heads·head_dim (attn)
    t: float             # seconds
    kv: int | None = None  # attn: kv_heads·head_dim, the keys' and values' width (None: c, no GQA)


def predict(s: OpSample, eff: Efficiency, peak: float, bw: float, wbytes: int) -> float:
    if s.kind == "gemm":
        return gemm_time(s.a, s.b, s.c, wbytes, peak, bw, eff)
    return attention_time(s.a * s.b * 4.0 * s.c, attention_bytes(s.a, s.b, s.c, s.kv or s.c, wbytes), peak, bw, eff)


def fit_efficiency(samples: list[OpSample], peak: float, bw: float, wbytes: int, rounds: int = 3
                   ) -> tuple[Efficiency, dict]:
    """(u_c, u_m, u_attn, c_op, c_attn) minimising the log-time error over the samples, and the
    per-M u_c table (`fit_u_c_by_m`): the two are fitted in turn, each given the other."""
    from scipy.optimize import least_squares  # scipy costs ~0.5 s to import: only a calibration fits


    meas = np.log([s.t for s in samples])
    table: tuple[tuple[int, float], ...] = ()
    u_c = None          # the scalar u_c is fitted in the first round only: after it the GEMMs
                        # follow the table and u_c scales attention alone (with u_attn)

    def eff_of(x) -> Efficiency:
        x = list(x) if u_c is None else [math.log(u_c), *x]
        return Efficiency(u_c=math.exp(x[0]), u_m=math.exp(x[1]), u_attn=math.exp(x[2]), c_op=math.exp(x[3]),
                          c_attn=math.exp(x[4]), u_c_by_m=table)

    def resid(x):
        e = eff_of(x)
        return np.log([predict(s, e, peak, bw, wbytes) for s in samples]) - meas

    for _ in range(rounds):
        best = None
        lo, hi, x0 = [-12, -12, -12, -30, -30], [0.5, 0.5, 1.5, 0, 0], [math.log(0.5)] * 3
        k = 0 if u_c is None else 1
        for c0 in (1e-6, 1e-5, 1e-4):       # the max() makes the surface piecewise: a few starts
            r = least_squares(resid, x0=(x0 + [math.log(c0)] * 2)[k:], bounds=(lo[k:], hi[k:]))
            if best is None or r.cost < best.cost:
                best = r
        eff = eff_of(best.x)
        u_c = eff.u_c
        table = fit_u_c_by_m(samples, eff, peak, bw, wbytes)
    eff = replace(eff, u_c_by_m=table)
    err = np.exp(np.abs(np.log([predict(s, eff, peak, bw, wbytes) for s in samples]) - meas)) - 1
    return eff, {"ops": len(samples), "median_rel_err": float(np.median(err)), "max_rel_err": float(err.max())}


def fit_u_c_by_m(samples: list[OpSample], eff: Efficiency, peak: float, bw: float, wbytes: int
                 ) -> tuple[tuple[int, float], ...]:
    """u_c per GEMM row count. At each M of the grid, every sample whose time the bandwidth term
    does not explain proposes the compute rate that would (t − c_op); the proposal (or the
    scalar u_c) with the least total log error over all of that M's samples is kept. An M whose
    samples are all bandwidth-bound keeps no row (the interpolation bridges it)."""
    by_m: dict[int, list[OpSample]] = {}
    for s in samples:
        if s.kind == "gemm":
            by_m.setdefault(s.a, []).append(s)
    table = []
    for m, group in sorted(by_m.items()):
        proposals = [2.0 * s.a * s.b * s.c / (peak * (s.t - eff.c_op)) for s in group
                     if s.t - eff.c_op > (s.b * s.c + s.a * s.b + s.a * s.c) * wbytes / (bw * eff.u_m)]
        if not proposals:
            continue

        def loss(u: float, group=group) -> float:
            e = replace(eff, u_c=u, u_c_by_m=())
            return sum(abs(math.log(predict(s, e, peak, bw, wbytes) / s.t)) for s in group)

        table.append((m, min([eff.u_c, *proposals], key=loss)))
    return tuple(table)


# ---------------------------------------------------------------- measuring (this machine)
def peaks_from(ops: list[OpSample], peak: float, bw: float, wbytes: int) -> tuple[float, float]:
    """A peak is the best rate seen: a small GEMM in cache can beat the large-GEMM / large-copy
    figures on a CPU, and an efficiency above 1 would mean the peak was wrong."""
    for s in ops:
        if s.kind == "gemm":
            peak = max(peak, 2.0 * s.a * s.b * s.c / s.t)
            bw = max(bw, (s.b * s.c + s.a * s.b + s.a * s.c) * wbytes / s.t)
    return peak, bw


# The peak GEMM and copy: large enough to reach a device's rate and to exceed its cache (a GPU's
# L2 reaches 96 MiB); a CPU gets there at a quarter of the size, in a fraction of the time.
PEAK_SIZES = {"cpu": (1024, 16 << 20), "cuda": (8192, 256 << 20)}


def measure_peaks(dtype, repeats: int, device="cpu", spare: float | None = None,
                  timer: Timer | None = None) -> tuple[float, float]:
    """`spare`: the bytes the operands may take (`bounds.spare_bytes`); None = unbounded.
    `timer`: how the device is timed (mode.Mode.timer; the device's mode by default)."""
    dev = torch.device(device)
    timed = timer or mode_for(dev).timer(dev)
    n, copy_elems = PEAK_SIZES.get(dev.type, PEAK_SIZES["cpu"])
    if spare is not None:
        n, copy_elems = bounds.peak_sizes(n, copy_elems, torch.empty(0, dtype=dtype).element_size(), spare)
    return peak_rates(n, copy_elems, dtype, dev, repeats, timed)


GEMM_M = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# Attention (q, k): block and window queries (8-128) and whole canvases (1024: the baselines'
# full forwards and dLLM-Cache's partial layers attend ~1000 queries over ~1000 keys on the CPU
# presets). On a GPU the canvases are LLaDA-8B's (prompts of 100-4,096 tokens plus 256).
ATTN_Q = {"cpu": (8, 32, 128, 1024), "cuda": (8, 32, 128, 1024, 4096)}
ATTN_K = {"cpu": (32, 128, 512, 1024), "cuda": (32, 128, 512, 1024, 4096)}


COLD_BYTES = 256 << 20


def op_plan(shape: ModelShape, device_type: str, max_elems: int = 1 << 25, spare: float | None = None,
            cold_bytes: int = COLD_BYTES) -> list[tuple[str, int, int, int]]:
    """The operators `measure_ops` times, in order: (gemm, M, K, N) for each of the model's
    (K, N) and the LM head up to `max_elems` of activation, then (attn, q, k, heads·head_dim);
    with `spare` (bytes, `bounds.spare_bytes`) only those whose operands fit it."""
    kind = "cuda" if device_type == "cuda" else "cpu"
    pairs = [(k, n) for _, k, n in shape.gemms()] + [(shape.d, shape.vocab)]
    gemms = [("gemm", m, k, n) for k, n in pairs for m in GEMM_M if m * max(k, n) <= max_elems]
    plan = gemms + [("attn", q, kk, shape.heads * shape.head_dim) for q in ATTN_Q[kind] for kk in ATTN_K[kind]]
    return plan if spare is None else [op for op in plan if bounds.op_fits(op, shape, spare, cold_bytes)]


def engine_attention(q_len: int, k_len: int, shape: ModelShape, dtype, device) -> Callable[[], object]:
    """One attention call made as the engine's step makes it (engine.step_context): a packed
    varlen kernel over packed rows where the engine would pick one (CUDA: torch's varlen_attn or
    flash-attn), else the padded batch SDPA over 4-D [G, L, H, D] operands, here one group.
    Timing a bare 3-D SDPA instead measured another kernel (on CUDA the math fallback)."""
    dev = torch.device(device)
    q = torch.randn(1, q_len, shape.heads, shape.head_dim, dtype=dtype, device=dev)
    k = torch.randn(1, k_len, shape.kv_heads, shape.head_dim, dtype=dtype, device=dev)
    v = torch.randn_like(k)
    # Looked up at call time, so the engine's current attention is what is timed.
    backend = attention.choose_backend("auto", dev, dtype).name
    if backend in attention.PACKED:
        kernel = attention.PackedKernel(backend)
        cu_q, cu_k = (torch.tensor([0, n], dtype=torch.int32, device=dev) for n in (q_len, k_len))
        return lambda: kernel(q[0], k[0], v[0], cu_q, cu_k, q_len, k_len)
    return lambda: attention.padded_attention(q, k, v, None)


def measure_ops(shape: ModelShape, dtype, repeats: int, max_elems: int = 1 << 25,
                cold_bytes: int = COLD_BYTES, device="cpu", tick: Callable[[], None] | None = None,
                spare: float | None = None, timer: Timer | None = None) -> list[OpSample]:
    """GEMM and attention timings (`op_plan`, bounded by `spare`; `tick` after each). GEMMs cycle
    through enough weight copies to exceed `cold_bytes` (a last-level cache or a GPU's L2 several
    times over), so a small-M GEMM pays for reading its weights from memory as it does inside a
    forward. Attention is the engine's own call (`engine_attention`)."""
    dev = torch.device(device)
    timed = timer or mode_for(dev).timer(dev)
    tick = tick or (lambda: None)
    out: list[OpSample] = []
    weights: dict[tuple[int, int], Iterator] = {}
    for kind, a, b, c in op_plan(shape, dev.type, max_elems, spare, cold_bytes):
        if kind == "gemm":
            if (b, c) not in weights:
                weights.clear()                                  # one (K, N)'s copies in memory at a time
                w = torch.randn(c, b, dtype=dtype, device=dev)      # [N, K]: a Linear's weight
                copies = max(1, min(bounds.MAX_WEIGHT_COPIES, -(-cold_bytes // (b * c * w.element_size()))))
                weights[b, c] = itertools.cycle([w] + [w.clone() for _ in range(copies - 1)])
                del w
            x, ws = torch.randn(a, b, dtype=dtype, device=dev), weights[b, c]
            t = timed(lambda x=x, ws=ws: F.linear(x, next(ws)), repeats)      # the engine's call
        else:
            weights.clear()
            t = timed(engine_attention(a, b, shape, dtype, dev), repeats)
        out.append(OpSample(kind, a, b, c, t, shape.kv_dim if kind == "attn" else None))
        tick()
    return out
