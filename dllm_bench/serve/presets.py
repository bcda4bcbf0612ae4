"""Serve presets: a model preset plus the workload and budget defaults of `dllm-bench serve`,
one row each in PRESETS (tuning the default is an edit to one row; every field has its CLI flag,
and the preset used is printed and recorded in config.json; docs/SERVE.md "Presets").

Shared by every preset (the paper's Table 3 / §6.1): steps = gen_length (one token per step for
every system: "Execution Parity"); gen_length fixed where the preset says, else the dataset's
output length rounded up to blocks and capped at gen_cap; retention 0.5 for the engine and
Sparse-dLLM; dLLM-Cache intervals 100 / 7; one memory budget for every system. Why each row's
numbers are what they are is in the comment above it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dllm_bench.device_defaults import Device, default_dtype, is_cuda
from dllm_bench.errors import UserError
from dllm_bench.ridge import CPU_RIDGE_ROWS, Ridge
from dllm_bench.serve.task_prompts import TASK_DATASET, training_config
from dllm_bench.step_budgets import (
    AUTO,
    FALLBACK_LOGITS,
    FALLBACK_TOKENS,
    activation_bytes_per_token,
    step_budgets,
)
from dllm_bench.systems.options import parallel_only
from engine.config import DTYPES

# What a trained checkpoint (committed, or made by `dllm-bench train`) starts from: its own task.
TRAINED_PRESET = "trained"

# Table 3 of the paper: the baselines' knobs for every serving run (the registry defaults are
# the upstream *accuracy* settings, e.g. dLLM-Cache's GSM8K prompt interval 50).
PAPER_BASELINE_KNOBS: dict[str, dict[str, Any]] = {
    "fast-dllm": {"fast_dllm_cache": "dual", "threshold": None},
    "dllm-cache": {"prompt_interval": 100, "gen_interval": 7},
    "sparse-dllm": {"kernel_size": 3},
}


@dataclass(frozen=True)
class ServePreset:
    name: str
    model: str                       # model preset name (dllm_bench.checkpoints.presets) or checkpoint dir
    dataset: str                     # livebench | osc | burstgpt | random (workloads.serving)
    num_prompts: int
    length_scale: float              # multiplies dataset token counts (1.0 = paper scale)
    gen_cap: int                     # max gen_length (tokens, rounded down to a block multiple)
    block_length: int
    memory_budget: str | None        # "1GiB"...; None = the device default (CUDA: free x 0.9)
    # Engine token budget per step and logit budget (rows per step; None = monolithic); "auto":
    # scaled with the GPU and the model when the run is resolved (dllm_bench.step_budgets).
    max_num_batched_tokens: int | str
    max_num_logits: int | str | None
    max_num_seqs: int = 64
    retention: float = 0.5           # engine retention and Sparse-dLLM keep_ratio (Table 3)
    max_prompt_len: int | None = None
    # One output length for every request (the paper fixes 256), so static batches are not cut
    # at every change of request shape; None = each request's own length, rounded up to blocks.
    gen_length: int | None = None
    max_model_len: int | None = None
    threads: int = 2                 # torch threads of every system process
    dtype: str = "float32"
    device: str = "cpu"
    # The engine's CUDA graphs (engine.graphs): None = on for a CUDA device; a run resolves it
    # to true/false for its device (dllm_bench.serve.options.resolve_run).
    cuda_graphs: bool | None = None
    # The engine's ranks (docs/PARALLEL.md): N GPUs, or N CPU processes sharing `threads`.
    tensor_parallel_size: int = 1
    rps: str = "0.5"
    baseline_knobs: dict = field(default_factory=lambda: {k: dict(v) for k, v in PAPER_BASELINE_KNOBS.items()})
    note: str = ""
    # Why the two budgets are what they are, once an "auto" was resolved (with_step_budgets).
    tokens_rule: str = ""
    logits_rule: str = ""
    # The device's ridge in query rows (what `cache=auto` weighs: dllm_bench.ridge): "auto" is
    # measured on CUDA, a simulated GPU's profile peaks, CPU_RIDGE_ROWS on a CPU (with_ridge).
    ridge_rows: int | str = AUTO
    ridge_rule: str = ""
    overhead_rows: int = 0    # a step's fixed cost in rows, set with the ridge (dllm_bench.ridge)

    steps_rule = "steps = gen_length (one token per step)"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["steps_rule"] = self.steps_rule
        return d

    def dtype_on(self, device: Device) -> str:
        """The preset's dtype, except that a CPU preset moved to CUDA (`--device cuda`) runs in
        CUDA's default, bfloat16 (dllm_bench.device_defaults); so does one simulated on a GPU
        profile (a SimulatedGpu). The other way the preset's dtype stays (a GPU preset on a CPU)."""
        if device is not None and is_cuda(device) and not is_cuda(self.device):
            return default_dtype(device)
        return self.dtype

    @property
    def auto_budgets(self) -> bool:
        """Whether a step budget is still "auto" (to be scaled with the GPU: with_step_budgets)."""
        return AUTO in (self.max_num_batched_tokens, self.max_num_logits)

    def with_step_budgets(self, model_info: dict, longest_canvas: int, gpu: str | None = None,
                          budget_bytes: int | None = None) -> ServePreset:
        """The preset with its "auto" budgets chosen (dllm_bench.step_budgets) for a run of
        canvases up to `longest_canvas` on `gpu` with `budget_bytes` (None: a CPU), and why."""
        if not self.auto_budgets:
            return self
        b = step_budgets(tokens=self.max_num_batched_tokens, logits=self.max_num_logits,
                         max_num_seqs=self.max_num_seqs, block_length=self.block_length,
                         longest_canvas=longest_canvas, gpu=gpu, budget_bytes=budget_bytes,
                         weights_bytes=model_info["weights_bytes"],
                         activation_per_token=activation_bytes_per_token(
                             model_info["d_model"], model_info["mlp_hidden_size"], DTYPES[self.dtype].itemsize))
        return replace(self, max_num_batched_tokens=b.max_num_batched_tokens, max_num_logits=b.max_num_logits,
                       tokens_rule=b.tokens_rule, logits_rule=b.logits_rule)

    def with_ridge(self, ridge: Ridge) -> ServePreset:
        """The preset with its "auto" ridge set (a given number stays)."""
        if self.ridge_rows != AUTO:
            return self
        return replace(self, ridge_rows=ridge.rows, ridge_rule=ridge.rule, overhead_rows=ridge.overhead)

    def engine_defaults(self) -> dict:
        """The engine knobs this preset sets (a variant's or a flag's own values win); a budget
        never resolved for a GPU (with_step_budgets) is the CPU's "auto": the paper's RTX 4090's."""
        tokens = FALLBACK_TOKENS if self.max_num_batched_tokens == AUTO else self.max_num_batched_tokens
        logits = FALLBACK_LOGITS if self.max_num_logits == AUTO else self.max_num_logits
        return {"max_num_batched_tokens": tokens, "max_num_logits": logits,
                "max_num_seqs": self.max_num_seqs, "retention": self.retention, "cuda_graphs": self.cuda_graphs,
                "tensor_parallel_size": self.tensor_parallel_size,
                "ridge_rows": CPU_RIDGE_ROWS if self.ridge_rows == AUTO else self.ridge_rows,
                "overhead_rows": self.overhead_rows}

    def describe(self) -> str:
        """One line stating the preset (printed at the start and the end of a run), with why
        each step budget is what it is when one was "auto"."""
        logits = ("monolithic" if self.max_num_logits is None else
                  "auto" if self.max_num_logits == AUTO else f"{self.max_num_logits} rows")
        why_t, why_l = (f" ({r})" if r else "" for r in (self.tokens_rule, self.logits_rule))
        gen = f"gen_length {self.gen_length} for every request" if self.gen_length else f"gen cap {self.gen_cap}"
        return (f"preset {self.name}: model {self.model}, {self.dataset} x{self.length_scale:g} "
                f"lengths, {self.num_prompts} prompts, block {self.block_length}, {gen}, {self.steps_rule}, memory budget {self.memory_budget or 'device default'}, "
                f"token budget {self.max_num_batched_tokens}{why_t}, logit budget {logits}{why_l}, "
                f"ridge {self.ridge_rows} rows{f' ({self.ridge_rule})' if self.ridge_rule else ''}, retention "
                f"{self.retention:g}, {self.dtype} on {self.device}, {self.threads} threads"
                + parallel_only(self.tensor_parallel_size,
                                f", engine on {self.tensor_parallel_size} ranks (tensor parallel; baselines on one device)"))


# Requests of the scale-similar default: at its paper-length shapes a request costs ~25-80 s of
# 2 idle cores per system (dLLM-Cache the most) and measuring each baseline's largest batch
# ~1-2 min, so two keep `serve --rps 0.5` (four systems) in 10 min; 3 took ~14 min.
NUM_PROMPTS_SIMILAR = 2
# similar-dream's budget: its weights (544 MB) and a KV pool whose engine concurrency and
# Fast-dLLM batch relate to Dream-7B's on an RTX 4090 as cpu-default's do to LLaDA-8B's.
SIMILAR_DREAM_BUDGET = "1400MiB"

PRESETS: dict[str, ServePreset] = {p.name: p for p in [
    # similar-1024 keeps LLaDA-8B's LM-head / body FLOPs and logit-row / KV bytes within 4 %
    # (docs/SCALING.md) at the paper's LiveBench lengths, gen 128 (4 blocks). 1300 MiB (weights
    # 480 MiB) holds the RTX 4090's dLLM-Serve concurrency (~34 requests; 29 here) and Fast-dLLM's
    # largest batch (5); Sparse-dLLM and dLLM-Cache fit 6, not 10 (8 layers' activations weigh
    # more against their KV than 32 do). Token budget 2048: two Refreshes of the longest canvas
    # per step (4096 without FlashAttention would cost a third of the pool; 1088 serialised
    # concurrent Refreshes and ran the engine ~2x slower at 3 requests).
    ServePreset(
        "cpu-default", model="similar-1024", dataset="livebench", num_prompts=NUM_PROMPTS_SIMILAR,
        length_scale=1.0, gen_cap=128, gen_length=128, block_length=32, memory_budget="1300MiB",
        max_num_batched_tokens=2048, max_num_logits=256, threads=2,
        note="scale-similar to LLaDA-8B on an RTX 4090 (docs/SCALING.md); <= 10 min for --rps 0.5 on 2 cores"),
    # One d = 1536 layer with the same ratios: dLLM-Cache recomputes the whole model every step.
    ServePreset(
        "similar-1536", model="similar-1536", dataset="livebench", num_prompts=6,
        length_scale=1.0, gen_cap=128, gen_length=128, block_length=32, memory_budget="400MiB",
        max_num_batched_tokens=1088, max_num_logits=256, threads=2,
        note="one-layer scale model (the first default): dLLM-Cache caches nothing here"),
    # LLaDA's 126,464-token vocabulary on a 4-layer d = 256 body: the logit tensor dominates
    # every step (~128x LLaDA-8B's LM-head share); 1 GiB over ~273 MB of weights holds only a
    # few full-sequence logit tensors (`profile`, `make bench-mechanisms`).
    ServePreset(
        "serve-126k", model="serve-126k", dataset="livebench", num_prompts=16, length_scale=0.125,
        gen_cap=64, block_length=32, memory_budget="1GiB", max_num_batched_tokens=1024,
        max_num_logits=256, threads=1,
        note="logit-memory stress: LLaDA vocab on a tiny body; baselines saturated at 0.5 RPS"),
    # A trained checkpoint serving its own test questions (serve.task_prompts), so the confidences
    # parallel decoding reads are real; 64 MiB holds 3.7 MB of weights and far more KV than 16
    # requests of ~140 tokens need.
    ServePreset(
        TRAINED_PRESET, model="synth-cot", dataset=TASK_DATASET, num_prompts=16, length_scale=1.0, gen_cap=32,
        gen_length=32, block_length=32, memory_budget="64MiB", max_num_batched_tokens=1024, max_num_logits=256,
        threads=1, rps="2",
        note="a trained model serving its own task's test questions (real confidences, for --decoding); "
             "every request decodes the model's answer window"),
    ServePreset(
        "tiny", model="tiny", dataset="livebench", num_prompts=8, length_scale=0.05, gen_cap=16,
        block_length=8, memory_budget="8MiB", max_num_batched_tokens=256, max_num_logits=64,
        threads=1, note="tests and smoke runs: seconds per system"),
    # Dream's counterparts of cpu-default and tiny (docs/SCALING.md): similar-dream keeps Dream-7B's
    # LM-head / body and logit-row / KV-token ratios at the same paper-length requests.
    ServePreset(
        "similar-dream", model="similar-dream", dataset="livebench", num_prompts=NUM_PROMPTS_SIMILAR,
        length_scale=1.0, gen_cap=128, gen_length=128, block_length=32, memory_budget=SIMILAR_DREAM_BUDGET,
        max_num_batched_tokens=2048, max_num_logits=256, threads=2,
        note="scale-similar to Dream-7B on an RTX 4090 (docs/SCALING.md)"),
    ServePreset(
        "tiny-dream", model="tiny-dream", dataset="livebench", num_prompts=8, length_scale=0.05, gen_cap=16,
        block_length=8, memory_budget="8MiB", max_num_batched_tokens=256, max_num_logits=64,
        threads=1, note="tests and smoke runs of the Dream family: seconds per system"),
    # Table 3 on a GPU: token and logit budgets "auto", scaled with the GPU's memory and the model
    # when the run is resolved (dllm_bench.step_budgets); a flag or a variant's knob wins.
    ServePreset(
        "paper", model="llada-8b", dataset="livebench", num_prompts=200, length_scale=1.0, gen_cap=256, gen_length=256,
        block_length=32, memory_budget=None, max_num_batched_tokens=AUTO, max_num_logits=AUTO,
        threads=8, dtype="bfloat16", device="cuda", rps="0.1,0.25,0.5,1.0",
        note="the paper's Table 3 on a GPU: pass --model /path/to/LLaDA-8B-Instruct (token and logit budgets "
             "scaled with the GPU: ~4,000 tokens on an RTX 4090, ~16,384 on an L40S, as the paper ran)"),
]}

DEFAULT_PRESET = "cpu-default"
# What a checkpoint directory starts from on a CUDA device: LLaDA-8B's own serving setting
# (bfloat16, budget auto, the paper's token/logit budgets), not the CPU scale model's.
GPU_PRESET = "paper"


def get_preset(name: str) -> ServePreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown serve preset {name!r}; presets: {', '.join(PRESETS)}") from None


def preset_for(preset: str | None, model: str | None, device: Device = None) -> ServePreset:
    """The serve preset to start from: the one named, else the one whose model is `model`
    (so `--model tiny` gets tiny-sized workloads), else — on a CUDA `device` (`auto`: CUDA when
    present; None: never) — GPU_PRESET, else the default; with `model` swapped in."""
    if preset is not None:
        p = get_preset(preset)
    else:
        p = next((q for q in PRESETS.values() if model is not None and q.model == model), None)
        if p is None and training_config(model):
            p = PRESETS[TRAINED_PRESET]
        if p is None:
            gpu = model is not None and device is not None and is_cuda(device)
            p = PRESETS[GPU_PRESET if gpu else DEFAULT_PRESET]
    p = replace(p, model=model) if model is not None and model != p.model else p
    window = training_config(p.model).get("window") if p.name == TRAINED_PRESET else None
    if window:   # every request decodes the answer window the model was trained with
        p = replace(p, gen_length=window, gen_cap=window, block_length=min(p.block_length, window))
    return p
