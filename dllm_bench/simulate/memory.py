"""Memory capacities on a device we do not have: the engine's KV pool and a baseline's largest
static batch, from byte counts (docs/SIMULATE.md, "Memory"). On this machine the simulator uses
the real profilers instead (dllm_bench.systems.build), so simulated and measured runs share them.

* weights: every parameter in the serving dtype, plus 1 GiB of context and allocator slack;
* engine: budget − weights − activations at the token budget (T·(3·ffn + 4·d) elements) −
  the logit budget's rows × V × 8 B (float64 Gumbel / confidence transients) → KV token slots;
* baseline at padded length L, per request at its Refresh step: the cache's bytes per token
  plus V logits in the model dtype, a softmax copy and, for Fast-dLLM, a float64 copy of both.
"""
from __future__ import annotations

from dllm_bench.simulate.cost_model import ModelShape

CONTEXT_BYTES = 1 << 30


def weights_bytes(shape: ModelShape) -> int:
    return shape.n_params * shape.wbytes


def engine_kv_tokens(shape: ModelShape, budget: float, max_num_batched_tokens: int,
                     max_num_logits: int | None) -> int:
    act = max_num_batched_tokens * (3 * shape.ffn + 4 * shape.d) * shape.wbytes
    rows = max_num_logits if max_num_logits is not None else max_num_batched_tokens
    free = budget - weights_bytes(shape) - CONTEXT_BYTES - act - rows * shape.vocab * 8
    if free <= 0:
        raise ValueError(f"the memory budget {budget / 2**30:.1f} GiB leaves no KV pool after the weights, "
                         "activations and logit budget")
    return int(free // shape.kv_bytes_per_token)


def baseline_bytes_per_token(system: str, shape: ModelShape) -> float:
    w, V = shape.wbytes, shape.vocab
    cache = {"llada": 0, "fast-dllm": shape.kv_bytes_per_token, "sparse-dllm": shape.kv_bytes_per_token,
             "dllm-cache": shape.kv_bytes_per_token + 2 * shape.layers * shape.d * w}[system]
    logits = V * (w + 8 + 8) if system == "fast-dllm" else V * 3 * w
    return cache + logits


def _baseline_free(shape: ModelShape, budget: float) -> float:
    return budget - weights_bytes(shape) - CONTEXT_BYTES


def baseline_max_batch(system: str, shape: ModelShape, budget: float, length: int) -> int:
    free, per = _baseline_free(shape, budget), length * baseline_bytes_per_token(system, shape)
    if free < per:
        raise ValueError(f"{system}: one request of {length} tokens does not fit the memory budget")
    return int(free // per)


def baseline_batch_fits(system: str, shape: ModelShape, budget: float, batch: int, length: int) -> tuple[float, bool]:
    """(bytes above the weights, fits?) for a given static batch padded to `length`: what serve
    measures as a fixed batch's peak on this machine, from the byte counts on a GPU."""
    need = batch * length * baseline_bytes_per_token(system, shape)
    return need, need <= _baseline_free(shape, budget)
