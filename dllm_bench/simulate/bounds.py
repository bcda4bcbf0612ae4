"""What a calibration may allocate on the device it profiles: every timed size bounded by the
memory budget, computed from byte counts before anything is allocated.

Without a bound `calibrate --device cuda --preset paper` asks Fast-dLLM for a static batch of 64
paper-length canvases, whose float64 softmax alone ([64, ~1150, 126464]) is ~75 GB. The budget
is the engine's default on CUDA (free memory x GPU_MEMORY_UTILIZATION, taken before the model is loaded, so the
weights are inside it); each host-time batch must fit it by the simulator's own byte counts
(`simulate.memory`), and each operator's working set must fit what the weights leave.

Pure functions of sizes and bytes: tests check them with LLaDA-8B's numbers on GPUs we lack.
"""
from __future__ import annotations

from collections.abc import Sequence

from dllm_bench.device_defaults import GPU_MEMORY_UTILIZATION as UTILIZATION
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.memory import CONTEXT_BYTES, baseline_max_batch, engine_kv_tokens, weights_bytes
from dllm_bench.systems.spec import ENGINE

MAX_WEIGHT_COPIES = 64     # calibrate.measure_ops cycles at most this many copies of a GEMM's weight
SCORE_BYTES = 4            # a float32 score element, if attention falls back to a kernel that stores them


def device_budget(free_bytes: float, utilization: float = UTILIZATION) -> int:
    """The budget of a run on a device with `free_bytes` free before its model is loaded."""
    return int(free_bytes * utilization)


def spare_bytes(shape: ModelShape, budget: float) -> float:
    """What the weights and the allocator's context leave of the budget for one timed operator."""
    return budget - weights_bytes(shape) - CONTEXT_BYTES


def gemm_bytes(m: int, k: int, n: int, wbytes: int, cold_bytes: int) -> int:
    """x [M, K], enough [K, N] weight copies to exceed `cold_bytes`, and the [M, N] output."""
    copies = max(1, min(MAX_WEIGHT_COPIES, -(-cold_bytes // (k * n * wbytes))))
    return (m * k + copies * k * n + m * n) * wbytes


def attention_bytes(q: int, k: int, heads: int, kv_heads: int, head_dim: int, wbytes: int) -> int:
    """Q and the output, K and V, and one [H, q, k] score matrix with its softmax: a flash kernel
    stores none, but SDPA with a mask on some devices (and always on a CPU) does."""
    return (2 * q * heads + 2 * k * kv_heads) * head_dim * wbytes + heads * q * k * (SCORE_BYTES + wbytes)


def peak_sizes(n: int, copy_elems: int, wbytes: int, spare: float) -> tuple[int, int]:
    """The peak GEMM's n and the peak copy's elements, halved until each fits `spare` (a, b and
    a @ b; a float32 source, its cast and the copy's target)."""
    while n > 256 and 3 * n * n * wbytes > spare:
        n //= 2
    while copy_elems > (1 << 20) and copy_elems * (4 + 2 * wbytes) > spare:
        copy_elems //= 2
    return n, copy_elems


def op_fits(op: tuple[str, int, int, int], shape: ModelShape, spare: float, cold_bytes: int) -> bool:
    kind, a, b, c = op
    if kind == "gemm":
        return gemm_bytes(a, b, c, shape.wbytes, cold_bytes) <= spare
    return attention_bytes(a, b, shape.heads, shape.kv_heads, shape.head_dim, shape.wbytes) <= spare


def host_cap(system: str, shape: ModelShape, budget: float, length: int, max_num_batched_tokens: int,
             max_num_logits: int | None) -> int:
    """The most concurrent requests of `length` tokens (prompt + generation) a system can run in
    the budget: a baseline's largest static batch, the engine's KV pool over full-length
    requests (sparse retention stores less: this is its dense bound). 0: not even one."""
    try:
        if system == ENGINE:
            return engine_kv_tokens(shape, budget, max_num_batched_tokens, max_num_logits) // length
        return baseline_max_batch(system, shape, budget, length)
    except ValueError:
        return 0


def bounded_sizes(sizes: Sequence[int], cap: int) -> tuple[int, ...]:
    """The sizes (in their order) a system can run at once; () when none can."""
    return tuple(n for n in sizes if n <= cap)
