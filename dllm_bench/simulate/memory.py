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

from dataclasses import asdict, dataclass

from baselines.registry import SYSTEMS
from dllm_bench.simulate.cost_model import ModelShape
from engine.kv_cache import kv_need

CONTEXT_BYTES = 1 << 30


def weights_bytes(shape: ModelShape) -> int:
    return shape.n_params * shape.wbytes


@dataclass(frozen=True)
class EnginePlan:
    """The engine's memory budget term by term (`profile --device-memory` prints it)."""

    budget_bytes: float
    weights_bytes: int
    context_bytes: int
    activation_bytes: int      # at the token budget
    logit_rows: int            # the logit budget (monolithic: every query token)
    logit_bytes: int
    kv_bytes_per_token: int
    kv_pool_bytes: float       # what is left; negative: no KV pool
    kv_tokens: int


def engine_plan(shape: ModelShape, budget: float, max_num_batched_tokens: int, max_num_logits: int | None) -> EnginePlan:
    act = max_num_batched_tokens * (3 * shape.ffn + 4 * shape.d) * shape.wbytes
    rows = max_num_logits if max_num_logits is not None else max_num_batched_tokens
    logits = rows * shape.vocab * 8
    free = budget - weights_bytes(shape) - CONTEXT_BYTES - act - logits
    return EnginePlan(budget, weights_bytes(shape), CONTEXT_BYTES, act, rows, logits, shape.kv_bytes_per_token, free,
                      max(0, int(free // shape.kv_bytes_per_token)))


def engine_plans(shape: ModelShape, config, length: int, block_length: int) -> dict[str, dict]:
    """The plan with config's logit budget and monolithic (every query row), each with the
    requests of `length` tokens its KV pool holds and the concurrency that allows
    (config: an engine.EngineConfig with its memory_budget set; `cache=auto` holds the most once
    memory binds, as sparse)."""
    need = kv_need(config.cache, length, block_length, config.retention)
    out = {}
    for label, rows in (("logit budget", config.max_num_logits), ("monolithic", None)):
        plan = engine_plan(shape, config.memory_budget, config.max_num_batched_tokens, rows)
        fit = (plan.kv_tokens // need if need else config.max_num_seqs) if plan.kv_pool_bytes > 0 else 0
        out[label] = asdict(plan) | {"requests_that_fit": fit, "concurrency": min(fit, config.max_num_seqs)}
    return out


def engine_kv_tokens(shape: ModelShape, budget: float, max_num_batched_tokens: int,
                     max_num_logits: int | None) -> int:
    plan = engine_plan(shape, budget, max_num_batched_tokens, max_num_logits)
    if plan.kv_pool_bytes <= 0:
        raise ValueError(f"the memory budget {budget / 2**30:.1f} GiB leaves no KV pool after the weights, "
                         "activations and logit budget")
    return plan.kv_tokens


def baseline_bytes_per_token(system: str, shape: ModelShape) -> float:
    """A static batch's live bytes per token at its Refresh forward: the registry's KV and logit
    copies on the model's family (baselines.registry.RefreshPeak), as `models similarity` counts them."""
    peak = SYSTEMS[system].peak_on(shape.family)
    logits = shape.vocab * (peak.logit_copies * shape.wbytes + peak.fp64_logit_copies * 8)
    return peak.kv_copies * shape.kv_bytes_per_token + logits


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
