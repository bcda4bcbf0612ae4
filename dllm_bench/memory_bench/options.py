"""The options of a `dllm-bench memory` run, as given (`MemoryOptions`) and checked (`resolve`):
every bad input is one UserError before a model is loaded or a run directory exists."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dllm_bench import inputs
from dllm_bench.checkpoints.load import load_shape
from dllm_bench.checkpoints.presets import model_params
from dllm_bench.console import console
from dllm_bench.device_defaults import MemoryBudget, resolve_budget, resolve_device_options
from dllm_bench.errors import UserError
from dllm_bench.serve.presets import ServePreset, preset_for
from dllm_bench.systems.families import for_family
from dllm_bench.systems.options import check_one_device, variant_ranks
from dllm_bench.systems.spec import BATCH_KNOB, ENGINE, SystemVariant, engine_knobs, parse_systems
from dllm_bench.units import format_size, parse_size
from engine.config import DTYPES
from engine.models import ModelConfig
from engine.sampling import SamplingParams

DEFAULT_SYSTEMS = "engine,llada,fast-dllm,dllm-cache,sparse-dllm"
TARGET_MODEL, TARGET_BUDGET, TARGET_PRESET = "llada-8b", "24GiB", "paper"


@dataclass
class MemoryOptions:
    model: str = "tiny"
    systems: str | None = None
    memory_budget: str | None = None       # None: auto (CUDA), required on CPU
    length: int | None = None              # the per-step profile's canvas (None: 2 x the token budget)
    max_length: int | None = None          # the search's cap (None: 4 x the trained length)
    resolution: int | None = None          # the search's step (None: the block length)
    gen_length: int | None = None          # None: one block
    block_length: int | None = None        # None: the serve preset's
    steps_per_block: int = 4
    derive: str | None = None              # "llada-8b:24GiB": the measured per-token bytes scaled to it
    search: bool = True
    device: str = "auto"
    dtype: str | None = None
    threads: int | None = None
    seed: int = 0
    run_id: str | None = None
    result_dir: str | None = None
    json_out: bool = False


@dataclass
class Target:
    """The model a run's measurements are derived to: its shape, dtype and budget."""

    name: str
    config: ModelConfig
    dtype: str
    budget: int
    engine_knobs: dict = field(default_factory=dict)   # its serve preset's token / logit budgets


@dataclass
class MemoryRun:
    """A checked run: what every measurement shares."""

    opts: MemoryOptions
    model_dir: str
    config: ModelConfig
    device: Any
    dtype: str
    budget: MemoryBudget
    variants: list[SystemVariant]
    preset: ServePreset
    block_length: int
    gen_length: int
    steps: int
    length: int
    max_length: int
    resolution: int
    target: Target | None

    @property
    def trained_length(self) -> int:
        return self.config.max_sequence_length

    def params(self) -> SamplingParams:
        return SamplingParams(gen_length=self.gen_length, steps=self.steps, block_length=self.block_length,
                              seed=self.opts.seed)

    def to_dict(self) -> dict:
        return {"model": self.opts.model, "model_dir": self.model_dir, "device": str(self.device),
                "dtype": self.dtype, "memory_budget": self.budget.to_dict(),
                "systems": [v.to_dict() for v in self.variants], "preset": self.preset.name,
                "block_length": self.block_length, "gen_length": self.gen_length, "steps": self.steps,
                "length": self.length, "max_length": self.max_length, "resolution": self.resolution,
                "trained_length": self.trained_length, "search": self.opts.search,
                "derive": None if self.target is None else {"model": self.target.name, "budget": self.target.budget,
                                                            "dtype": self.target.dtype}}


def _positive(name: str, v: int | None) -> None:
    if v is not None and v <= 0:
        raise UserError(f"{name} must be positive, got {v}")


def weights_of(cfg: ModelConfig, dtype: str) -> int:
    """The weights' bytes from the shape alone (before anything is loaded)."""
    n = model_params(cfg)
    return n * DTYPES[dtype].itemsize


def parse_target(spec: str) -> Target:
    """`--derive MODEL[:BUDGET]`: a preset's shape (llada-8b) in bfloat16 at a budget (24GiB)."""
    name, _, budget = spec.partition(":")
    name = name.strip() or TARGET_MODEL
    cfg = load_shape(name)
    size = parse_size(budget.strip() or TARGET_BUDGET, "--derive budget")
    if size <= weights_of(cfg, "bfloat16"):
        raise UserError(f"--derive {spec}: {format_size(size)} does not hold {name}'s bfloat16 weights "
                        f"({format_size(weights_of(cfg, 'bfloat16'))})")
    d = preset_for(TARGET_PRESET, None).engine_defaults()     # "auto" budgets: the paper's RTX 4090's
    return Target(name, cfg, "bfloat16", size, {k: d[k] for k in ("max_num_batched_tokens", "max_num_logits")})


def resolve(opts: MemoryOptions) -> MemoryRun:
    for name, v in (("--length", opts.length), ("--max-length", opts.max_length), ("--resolution", opts.resolution),
                    ("--gen-length", opts.gen_length), ("--block-length", opts.block_length),
                    ("--steps-per-block", opts.steps_per_block), ("--threads", opts.threads)):
        _positive(name, v)
    inputs.run_id(opts.run_id)
    if opts.result_dir is not None:
        inputs.result_dir(opts.result_dir)
    dev = resolve_device_options(opts.device if opts.device == "auto" else inputs.device(opts.device), opts.dtype,
                                 "none")
    budget = resolve_budget(opts.memory_budget, dev.device, required=True)
    path = inputs.checkpoint_dir(opts.model)
    cfg = load_shape(str(path))
    weights = weights_of(cfg, dev.dtype)
    if budget.bytes <= weights:
        raise UserError(f"memory budget {format_size(budget.bytes)} does not hold the weights of {opts.model} "
                        f"({format_size(weights)} in {dev.dtype})")
    variants = for_family(parse_systems(opts.systems or DEFAULT_SYSTEMS), cfg.model_type, explicit=bool(opts.systems))
    for v in variants:
        if v.is_endpoint:
            raise UserError("memory measures systems in this process: --systems cannot name an endpoint")
        if BATCH_KNOB in v.knob_dict:
            raise UserError(f"system {v.label!r}: memory runs one request at a time (no batch knob)")
        check_one_device(variant_ranks(v), v.label, "memory")
    preset = preset_for(None, opts.model, str(dev.device))
    block = opts.block_length or preset.block_length
    gen = opts.gen_length or block
    if gen % block:
        raise UserError(f"--gen-length {gen} must be a multiple of --block-length {block}")
    steps = opts.steps_per_block * (gen // block)
    budgets = [engine_knobs(v, preset.engine_defaults())["max_num_batched_tokens"] for v in variants
               if v.name == ENGINE] or [preset.engine_defaults()["max_num_batched_tokens"]]
    tokens = max(budgets)
    length = opts.length or 2 * tokens
    resolution = opts.resolution or max(block, cfg.max_sequence_length // 32)
    max_length = opts.max_length or 4 * cfg.max_sequence_length
    if length <= gen:
        raise UserError(f"--length {length} must exceed the generated tokens ({gen}): a prompt of one token at least")
    if max_length <= gen + resolution:
        raise UserError(f"--max-length {max_length} leaves no length to search above --gen-length {gen}")
    target = parse_target(opts.derive) if opts.derive else None
    # Lengths asked for beyond what the model was trained on (the search's default cap goes there
    # on purpose, and its table shows the trained length beside every answer): one warning.
    beyond = [n for n, v in (("--length", opts.length), ("--max-length", opts.max_length if opts.search else None))
              if v is not None and v > cfg.max_sequence_length]
    if beyond:
        console().print(f"warning: {' and '.join(beyond)} beyond {opts.model}'s trained length "
                        f"({cfg.max_sequence_length} tokens): memory is measured there, quality is not")
    return MemoryRun(opts, str(path), cfg, dev.device, dev.dtype, budget, variants, preset, block, gen, steps,
                     length, max_length, resolution, target)
