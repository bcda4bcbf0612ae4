"""Measured memory carried to a model we cannot run here (LLaDA-8B in bfloat16 at 24 GiB).

Every measured step's bytes are split by category and dtype (`trace.tagger`). Each category is
scaled by the width that makes it — logits by the vocabulary, FFN by the MLP width, attention
(hidden states, Q/K/V, everything else) by d_model, KV by layers x KV width — and the model's
own dtype by the target's element size (float64 confidences stay float64). A system's peak at
each measured length is the largest scaled step; an affine fit over the lengths gives its
bytes per canvas token and its constant, and the longest canvas whose peak stays within the
target budget follows. The engine also holds what its profiler reserves for a full token-budget
step (measured here the same way and scaled by the target's token and logit budgets) and its
guard band; its KV and its request's transients are fitted apart, since the transients share
the reservation. Approximate by construction: labelled "derived" wherever shown.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dllm_bench.memory_bench.live import LiveTracker
from dllm_bench.memory_bench.options import MemoryRun, Target, weights_of
from dllm_bench.memory_bench.trace import Trace, tagger
from engine.config import DTYPES, EngineConfig
from engine.models import DenseLM, ModelConfig
from engine.profiler import mode_peaks

WIDTH = {"logits": lambda c: c.padded_vocab, "ffn": lambda c: c.mlp_hidden_size, "attention": lambda c: c.d_model,
         "kv": lambda c: c.n_layers * c.kv_heads * c.head_dim}


@dataclass
class Derived:
    system: str
    max_length: int | None         # None: fewer than two measured lengths, or no length fits
    bytes_per_token: float | None  # the fitted slope at the target
    lengths: list[int]             # the measured lengths the fit used
    # The request at --length, its steps scaled: peak over average of its KV and transients.
    dynamic_peak_to_average: float | None = None
    mode: str | None = None        # cache=auto: the mode whose longest canvas this is (memory_bench.modes)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def scaler(source: ModelConfig, source_dtype: str, target: Target):
    """bytes of a "category/dtype" part measured on `source` -> its bytes on the target."""
    src_size, dst_size = DTYPES[source_dtype].itemsize, DTYPES[target.dtype].itemsize

    def scale(tag: str, n: float, widths: dict | None = None) -> float:
        cat, _, dtype = tag.partition("/")
        w = (widths or WIDTH)[cat]
        k = w(target.config) / w(source)
        return n * k * (dst_size / src_size if dtype == str(DTYPES[source_dtype]) else 1.0)
    return scale


def _step_parts(trace: Trace, scale) -> list[tuple[float, float]]:
    """Per step: (KV, transients) at the target."""
    out = []
    for s in trace.steps:
        kv = sum(scale(t, n) for t, n in s.parts.items() if t.startswith("kv/"))
        rest = sum(scale(t, n) for t, n in s.parts.items() if not t.startswith("kv/"))
        out.append((kv, rest))
    return out


def _fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    slope, const = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(const)


def _longest(peak, budget: float) -> int | None:
    """The largest L >= 1 with peak(L) <= budget (peak non-decreasing), None if not even 1."""
    if peak(1) > budget:
        return None
    lo, hi = 1, 2
    while peak(hi) <= budget:
        lo, hi = hi, hi * 2
        if hi > 1 << 40:
            return None                   # no growth: not bounded by memory
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) <= budget else (lo, mid)
    return lo


def engine_reservation(model: DenseLM, run: MemoryRun, config: EngineConfig, target: Target) -> float:
    """What the engine's profiler reserves for a full token-budget step, measured here by
    category and scaled to the target's token budget (FFN, attention) and logit budget
    (logits)."""
    with LiveTracker(model.device, tagger(model)) as tracker:
        mode_peaks(model, config, "sdpa" if run.device.type == "cpu" else config.attention_backend,
                   min(config.max_num_batched_tokens, run.trained_length))
    scale = scaler(model.config, run.dtype, target)
    t_src, t_dst = config.max_num_batched_tokens, target.engine_knobs["max_num_batched_tokens"]
    r_src = config.max_num_logits or t_src
    r_dst = target.engine_knobs["max_num_logits"] or t_dst
    per = {"logits": r_dst / r_src, "ffn": t_dst / t_src, "attention": t_dst / t_src}
    return sum(scale(tag, n) * per[tag.split("/")[0]] for n, tag in tracker.at_peak().values())


def derive(system: str, traces: list[Trace], model: DenseLM, run: MemoryRun, target: Target,
           reservation: float | None = None, guard: float = 0.0) -> Derived:
    """The longest canvas of `system` at the target from its complete measured traces;
    `reservation` and `guard` (the engine): held beside its KV, the transients inside them."""
    done = sorted({t.length: t for t in traces if t.complete and t.steps}.values(), key=lambda t: t.length)
    scale = scaler(model.config, run.dtype, target)
    at = next((t for t in done if t.length == run.length), None)
    ratio = None
    if at is not None:
        dyn = [k + r for k, r in _step_parts(at, scale)]
        ratio = max(dyn) / (sum(dyn) / len(dyn)) if sum(dyn) else None
    if len(done) < 2:
        return Derived(system, None, None, [t.length for t in done], ratio)
    xs = [t.length for t in done]
    kv, rest = zip(*[(max(k for k, _ in p), max(r for _, r in p)) for p in (_step_parts(t, scale) for t in done)])
    both = [max(k + r for k, r in _step_parts(t, scale)) for t in done]
    weights = weights_of(target.config, target.dtype)
    if reservation is None:
        b, a = _fit(xs, both)
        peak = lambda n: weights + a + b * n   # noqa: E731
    else:
        (bk, ak), (br, ar) = _fit(xs, list(kv)), _fit(xs, list(rest))
        b = bk + br
        peak = lambda n: weights + ak + bk * n + max(reservation, ar + br * n) + guard   # noqa: E731
    return Derived(system, _longest(peak, target.budget), b, xs, ratio)


def target_dtype_note(run: MemoryRun, target: Target) -> str:
    return (f"derived: {run.opts.model} ({run.dtype}) measured per category, scaled to {target.name} "
            f"({target.dtype}) at {target.budget / 2**30:.0f} GiB")

