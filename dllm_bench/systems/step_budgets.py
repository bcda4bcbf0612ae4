"""The engine's step budgets on a GPU: its token budget (query tokens per step) and logit budget
(logit rows per step) scaled with the device's memory and the model, unless given.

Token budget: a step's activations grow with its query tokens at `activation_bytes_per_token`
(MLP and residual stream in the model's dtype; LLaDA-8B bf16: 106,496 B) and get ACTIVATION_SHARE
of the memory left after the weights, fitted to the paper's settings (RTX 4090: 6.1 GiB left,
4,000 tokens; L40S: 25.0 GiB, 16,384; 6.5 % gives 4,019 and 16,405); a multiple of 256, at least
the longest canvas, at most MAX_TOKENS (larger steps buy latency, not rate). Logit budget:
max_num_seqs x block_length, the most rows a step can ask. On a CPU `auto` is the paper's RTX
4090 setting (FALLBACK_TOKENS, FALLBACK_LOGITS).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dllm_bench.systems.ridge import device_ridge
from dllm_bench.units import format_size
from engine.config import EngineConfig
from engine.profiler import default_budget, weights_bytes

AUTO = "auto"
ACTIVATION_SHARE = 0.065
MULTIPLE = 256
MAX_TOKENS = 32768
FALLBACK_TOKENS, FALLBACK_LOGITS = 4000, 2048


def activation_bytes_per_token(d_model: int, mlp_hidden: int, dtype_bytes: int) -> int:
    """A query token's activations in one layer's step: the MLP's gate, up and act (3 x hidden)
    and four residual-stream vectors (the simulator's memory model uses the same count)."""
    return (3 * mlp_hidden + 4 * d_model) * dtype_bytes


@dataclass(frozen=True)
class StepBudgets:
    max_num_batched_tokens: int
    max_num_logits: int | None
    tokens_rule: str          # why: "auto: ...", "given" or "auto on CPU: ..."
    logits_rule: str
    ridge_rows: int | None = None   # engine_budgets: the device's ridge (dllm_bench.systems.ridge), what cache=auto weighs

    def describe(self) -> str:
        logits = "monolithic" if self.max_num_logits is None else f"{self.max_num_logits} rows"
        return (f"token budget {self.max_num_batched_tokens} ({self.tokens_rule}), "
                f"logit budget {logits} ({self.logits_rule})")


def _round(n: float) -> int:
    return max(MULTIPLE, int(round(n / MULTIPLE)) * MULTIPLE)


def step_budgets(*, tokens: int | str | None, logits: int | str | None, max_num_seqs: int, block_length: int,
                 longest_canvas: int, gpu: str | None = None, budget_bytes: int | None = None,
                 weights_bytes: int = 0, activation_per_token: int = 1) -> StepBudgets:
    """The token and logit budgets of an engine: `tokens` / `logits` as given (a number; logits
    None = monolithic) or AUTO (None tokens: AUTO too). `gpu` names the device whose
    `budget_bytes` the run has (None: a CPU, where AUTO is the paper's RTX 4090 setting)."""
    tokens = AUTO if tokens is None else tokens
    if tokens != AUTO:
        t, t_rule = int(tokens), "given"
    elif gpu is None or budget_bytes is None:
        t, t_rule = FALLBACK_TOKENS, "auto on a CPU: the paper's RTX 4090 setting"
    else:
        left = max(0, budget_bytes - weights_bytes)
        scaled = _round(left * ACTIVATION_SHARE / activation_per_token)
        t = max(longest_canvas, min(MAX_TOKENS, scaled))
        bound = (f", capped at {MAX_TOKENS}" if scaled > MAX_TOKENS else
                 f", raised to the longest canvas {longest_canvas}" if longest_canvas > scaled else "")
        t_rule = f"auto: {format_size(left)} free after weights on {gpu}{bound}"
    if logits != AUTO:
        n, l_rule = (None if logits is None else int(logits)), "given"
    elif gpu is None or budget_bytes is None:
        n, l_rule = FALLBACK_LOGITS, "auto on a CPU: the paper's RTX 4090 setting"
    else:
        n = min(max_num_seqs * block_length, t)
        l_rule = f"auto: max_num_seqs {max_num_seqs} x block {block_length}" + (
            ", capped at the token budget" if n < max_num_seqs * block_length else "")
    return StepBudgets(t, n, t_rule, l_rule)


def engine_budgets(model, *, tokens: int | None, logits: int | str | None, max_num_seqs: int, block_length: int,
                   longest_canvas: int, budget_bytes: int | None = None,
                   cpu: tuple[int, int | None] = (8192, 1024)) -> StepBudgets:
    """The budgets of an engine a command builds over a loaded `model` (generate, accuracy,
    frontier): on CUDA `step_budgets` for the engine's memory budget (`budget_bytes`, or the
    engine's own default: (free + weights) x GPU_MEMORY_UTILIZATION); on a CPU the given values, else `cpu` (the
    command's own defaults: nothing scales). `tokens` None / `logits` AUTO: not given. With the
    device's ridge (measured on CUDA)."""
    ridge = device_ridge(model.device, model.dtype).rows
    if model.device.type != "cuda":
        return StepBudgets(cpu[0] if tokens in (None, AUTO) else int(tokens),
                           cpu[1] if logits == AUTO else logits, "", "", ridge)
    budget = default_budget(model, EngineConfig(memory_budget=budget_bytes, device=str(model.device)))
    c = model.config
    b = step_budgets(tokens=tokens, logits=logits, max_num_seqs=max_num_seqs, block_length=block_length,
                     longest_canvas=longest_canvas, gpu=torch.cuda.get_device_name(model.device),
                     budget_bytes=budget, weights_bytes=weights_bytes(model),
                     activation_per_token=activation_bytes_per_token(c.d_model, c.mlp_hidden_size, model.dtype.itemsize))
    return replace(b, ridge_rows=ridge)
