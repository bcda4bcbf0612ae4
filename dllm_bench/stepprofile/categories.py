"""Where a profiled step's time went: its profiler events sorted into categories.

A CPU step's time is its ops' self time (an op's time less its children's) by category, and
the rest of the step's wall time — Python between ops — is the host gap. A CUDA step's time is
its kernels' and copies' device time by category, and the host gap is the wall time the device
was idle. Either way the categories and the host gap add up to the step's wall time.

An op takes the category of the outermost op around it that has one (`aten::linear` files its
`aten::mm` and transposes as a GEMM, an `aten::add` its scalar copy as elementwise), unless it
ran inside a named region: the engine's and the baselines' LM head (`regions.LM_HEAD`)
and decoding (`regions.DECODE`: sampling and top-k). A kernel takes the category of the
op that launched it; a kernel without one (a CUDA-graph replay) is filed by its own name.
profile-step's own bookkeeping (its BOOKKEEPING region) is taken out of the step altogether.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from dllm_bench.stepprofile.regions import BOOKKEEPING, DECODE, LM_HEAD, STEP

CATEGORIES = {
    "gemm": "GEMMs", "attention": "attention", "lm_head": "LM head", "indexing": "gathers/scatters/indexing",
    "sampling": "sampling and top-k", "copy_h2d": "copies H2D", "copy_d2h": "copies D2H", "copy_d2d": "copies D2D",
    "elementwise": "norms and elementwise", "other": "other kernels", "host_gap": "host gaps",
}
REGION_CATEGORY = {LM_HEAD: "lm_head", DECODE: "sampling"}
REGIONS = {STEP, BOOKKEEPING, *REGION_CATEGORY}

# aten op names (without the `aten::` prefix) by category. Views, allocations and the like have
# none: an op inside a categorized op takes that op's category, one outside any is "other".
OPS = {
    "gemm": {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot", "einsum",
             "_scaled_mm", "_int_mm"},
    "attention": {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward",
                  "_scaled_dot_product_attention_math"},
    "indexing": {"index", "index_put_", "_index_put_impl_", "index_select", "index_add_", "index_copy_", "gather",
                 "scatter", "scatter_", "scatter_add_", "scatter_reduce", "take", "take_along_dim", "masked_select",
                 "masked_scatter_", "nonzero", "embedding", "index_fill_", "index_put"},
    "sampling": {"topk", "sort", "argsort", "argmax", "argmin", "max", "min", "multinomial", "softmax", "_softmax",
                 "log_softmax", "_log_softmax", "logsumexp", "exponential_", "uniform_", "rand", "randn",
                 "normal_", "bernoulli_"},
    "copy_d2d": {"copy_", "_to_copy", "to", "clone", "contiguous", "cat", "stack", "_copy_from", "_copy_from_and_resize",
                 "repeat_interleave", "repeat", "flip", "roll"},
    "elementwise": {"add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "rsqrt", "sqrt", "pow", "mean",
                    "sum", "silu", "silu_", "sigmoid", "neg", "exp", "log", "cos", "sin", "tanh", "where",
                    "masked_fill", "masked_fill_", "fill_", "zero_", "zeros", "zeros_like", "ones", "ones_like",
                    "full", "full_like", "rms_norm", "_fused_rms_norm", "layer_norm", "native_layer_norm",
                    "clamp", "clamp_", "clamp_min", "eq", "ne", "lt", "gt", "le", "ge", "logical_and", "logical_or",
                    "logical_not", "bitwise_and", "bitwise_or", "bitwise_not", "any", "all", "cumsum", "abs",
                    "reciprocal", "square", "maximum", "minimum", "lerp", "addcmul", "arange", "max_pool1d",
                    "max_pool1d_with_indices", "cosine_similarity", "norm", "linalg_vector_norm", "gelu", "relu", "float_power", "exp_", "sign"},
}
OP_CATEGORY = {name: cat for cat, names in OPS.items() for name in names}

# Kernel names (CUDA) by category, checked in order: attention before GEMM (attention kernels
# are GEMM-shaped), indexing before elementwise (`index_elementwise_kernel`).
KERNELS = [
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|mha_", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|cublas|xmma|nvjet|s16816|splitk|_mma", re.I)),
    ("indexing", re.compile(r"index|gather|scatter|embedding|take_", re.I)),
    ("sampling", re.compile(r"topk|sort|radix|argmax|argmin|multinomial|distribution", re.I)),
    ("copy_d2d", re.compile(r"copy", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|reduce|norm|silu|softmax|cat_|fill", re.I)),
]
MEMCPY = {"HtoD": "copy_h2d", "DtoH": "copy_d2h", "DtoD": "copy_d2d", "PtoP": "copy_d2d", "HtoH": "copy_d2d"}


def op_category(name: str) -> str | None:
    """An op's own category by its name (`aten::mm` -> gemm), None if it has none."""
    short = name.split("::", 1)[1] if name.startswith("aten::") else name
    return OP_CATEGORY.get(short)


def kernel_category(name: str) -> str:
    """A device kernel's or copy's category by its own name."""
    if name.startswith("Memcpy"):
        return next((c for k, c in MEMCPY.items() if k in name), "copy_d2d")
    if name.startswith("Memset"):
        return "elementwise"
    return next((c for c, pat in KERNELS if pat.search(name)), "other")


def _chain(e) -> list:
    """`e` and its enclosing events, outermost first."""
    out = []
    while e is not None:
        out.append(e)
        e = e.cpu_parent
    return out[::-1]


def chain_category(e) -> str | None:
    """The category of a CPU op from the events around it (module docstring); None: inside
    profile-step's bookkeeping (not part of the step)."""
    chain = _chain(e)
    names = [x.name for x in chain]
    if BOOKKEEPING in names:
        return None
    region = next((REGION_CATEGORY[n] for n in reversed(names) if n in REGION_CATEGORY), None)
    if region is not None:
        return region
    for x in chain:
        if not x.is_user_annotation:
            cat = op_category(x.name)
            if cat is not None:
                return cat
    return "other"


@dataclass
class Breakdown:
    """One step: wall time and its split (microseconds), and per (name, category) the time and
    calls of its ops (CPU) or kernels (CUDA)."""

    wall_us: float
    categories_us: dict[str, float]
    busy_us: float                     # time covered by ops (CPU) or by kernels and copies (CUDA)
    items: dict[tuple[str, str], list[float]] = field(default_factory=dict)   # -> [us, calls]


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def breakdown(events, device: bool) -> Breakdown:
    """The step in `events` (one profiler session around one STEP region). `device`: a CUDA
    step (kernels and copies count), else a CPU step (ops' self time counts)."""
    cpu = [e for e in events if e.device_type.name == "CPU" and not e.is_async]
    steps = [e for e in cpu if e.name == STEP]
    if len(steps) != 1:
        raise ValueError(f"expected one {STEP} region in the profile, found {len(steps)}")
    step = steps[0]
    t0, t1 = step.time_range.start, step.time_range.end
    inside = [e for e in cpu if e.thread == step.thread and t0 <= e.time_range.start and e.time_range.end <= t1]
    excluded = [e for e in inside if e.name == BOOKKEEPING and not any(x.name == BOOKKEEPING for x in _chain(e)[:-1])]
    wall = (t1 - t0) - sum(e.time_range.elapsed_us() for e in excluded)
    cats: dict[str, float] = defaultdict(float)
    items: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    spans: list[tuple[float, float]] = []
    if device:
        launchers = {e.id: e for e in cpu if e.linked_correlation_id == 0}
        for k in events:
            if k.device_type.name != "CUDA" or k.time_range.end < t0 or k.time_range.start > t1:
                continue
            if k.is_user_annotation or k.name in REGIONS:     # a region's span on the GPU's timeline
                continue
            cat = kernel_category(k.name)
            op = launchers.get(k.linked_correlation_id)
            if op is not None and not k.name.startswith("Memcpy"):
                cat = chain_category(op) or cat
                if cat == "other":
                    cat = kernel_category(k.name)
            _add(cats, items, k.name, cat, k.time_range.elapsed_us())
            spans.append((k.time_range.start, k.time_range.end))
    else:
        for e in inside:
            if e.is_user_annotation or e is step:
                continue
            cat = chain_category(e)
            if cat is not None:
                _add(cats, items, e.name, cat, e.self_cpu_time_total)
    busy = _union(spans) if device else sum(cats.values())
    cats["host_gap"] = max(0.0, wall - busy)
    return Breakdown(wall, {c: cats.get(c, 0.0) for c in CATEGORIES}, busy, dict(items))


def _add(cats, items, name: str, cat: str, us: float) -> None:
    cats[cat] += us
    item = items[(name, cat)]
    item[0] += us
    item[1] += 1
