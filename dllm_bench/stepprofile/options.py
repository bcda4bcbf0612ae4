"""The options of `dllm-bench profile-step`, checked and resolved the way `serve` resolves its
own (its preset, device, dtype and memory budget: dllm_bench.serve.options.resolve_run), so a
profiled system is built as a serve point's would be."""
from __future__ import annotations

from dataclasses import dataclass

from dllm_bench.errors import UserError
from dllm_bench.serve.config import ServeRun
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.stepprofile.phases import check_feasible
from dllm_bench.systems.options import check_one_device
from dllm_bench.systems.spec import BATCH_KNOB, SystemVariant, engine_knobs, parse_systems, with_knob
from engine.config import EngineConfig
from workloads.datasets import PRESETS as LENGTHS
from workloads.datasets import scale_lengths

MAX_STEPS = 1000        # profiled steps (and as many unprofiled ones) at most


# --batch of a baseline: the largest static batch the budget holds, measured, up to the preset's
# max_num_seqs (the most requests the engine runs in a step)
MAX_FIT = "max-fit"


@dataclass(frozen=True)
class StepProfileOptions:
    system: str = "engine"
    batch: int | str = 1            # requests in the system, or MAX_FIT (a baseline)
    phase: str = "serve"
    steps: int = 5                  # profiled steps (and as many unprofiled ones, for the wall time)
    warmup: int = 2                 # steps of the phase run before any is measured
    prompt_len: int | None = None
    gen_length: int | None = None
    block_length: int | None = None
    model: str | None = None
    preset: str | None = None
    device: str | None = None
    dtype: str | None = None
    memory_budget: str | None = None
    threads: int | None = None
    seed: int = 0
    no_profile_cache: bool = False


@dataclass
class StepProfileSetup:
    options: StepProfileOptions
    run: ServeRun                   # serve's resolution of the same options (preset, budget, device)
    variant: SystemVariant          # a baseline's with batch=B (none: max-fit)
    prompt_len: int
    gen_length: int
    block_length: int


def parse_batch(text: str) -> int | str:
    """--batch: a number >= 1, or max-fit."""
    if text.strip().lower() == MAX_FIT:
        return MAX_FIT
    try:
        b = int(text)
    except ValueError:
        raise UserError(f"--batch must be a number >= 1 or {MAX_FIT}, got {text!r}") from None
    if b < 1:
        raise UserError(f"--batch must be >= 1, got {b}")
    return b


def resolve(o: StepProfileOptions) -> StepProfileSetup:
    """Every option checked (cheap ones first); UserError before anything is built."""
    if o.batch != MAX_FIT and (not isinstance(o.batch, int) or o.batch < 1):
        raise UserError(f"--batch must be >= 1, got {o.batch}")
    if not 1 <= o.steps <= MAX_STEPS:
        raise UserError(f"--steps must be in [1, {MAX_STEPS}], got {o.steps}")
    if not 0 <= o.warmup <= MAX_STEPS:
        raise UserError(f"--warmup must be in [0, {MAX_STEPS}], got {o.warmup}")
    if o.prompt_len is not None and o.prompt_len < 1:
        raise UserError(f"--prompt-len must be >= 1, got {o.prompt_len}")
    variants = parse_systems(o.system, "--system")
    if len(variants) != 1:
        raise UserError(f"--system names one system, got {len(variants)}: {', '.join(v.label for v in variants)}")
    variant = variants[0]
    if variant.is_endpoint:
        raise UserError("--system: profile-step runs a system in this process, not an endpoint")
    if variant.is_baseline:
        if variant.batch is not None and variant.batch != o.batch:
            raise UserError(f"--system {variant.label!r}: the static batch is --batch ({o.batch}), not batch=")
        if variant.batch is None and o.batch != MAX_FIT:
            variant = with_knob(variant, BATCH_KNOB, o.batch)
    elif o.batch == MAX_FIT:
        raise UserError(f"--batch {MAX_FIT} is a baseline's largest static batch; give the engine a number")
    run = resolve_run(ServeOptions(
        systems=variant.label, model=o.model, preset=o.preset, memory_budget=o.memory_budget, dtype=o.dtype,
        device=o.device, threads=o.threads, block_length=o.block_length, gen_length=o.gen_length,
        num_prompts=1 if o.batch == MAX_FIT else o.batch, rps="inf", num_warmups=0,
        no_profile_cache=o.no_profile_cache, seed=o.seed))
    knobs = {} if variant.is_baseline else engine_knobs(variant, run.engine_defaults)
    check_one_device(knobs.get("tensor_parallel_size", 1), variant.label, "profile-step")
    check_feasible(variant.name, knobs.get("cache", EngineConfig.cache), o.phase, o.batch)
    p = run.preset
    gen = p.gen_length or p.gen_cap // p.block_length * p.block_length
    return StepProfileSetup(o, run, variant, o.prompt_len or default_prompt_len(run), gen, p.block_length)


def default_prompt_len(run: ServeRun) -> int:
    """The middle of the preset's dataset prompt lengths at its scale (a trained model's task:
    its drawn prompts' mean), within its prompt cap."""
    p = run.preset
    lengths = LENGTHS.get(p.dataset)
    if lengths is not None:
        n = int(scale_lengths([sum(lengths.prompt_range) / 2], p.length_scale)[0])
    else:
        wl = next(iter(run.workloads.values()))
        n = round(sum(r.prompt_len for r in wl) / len(wl))
    return min(n, p.max_prompt_len) if p.max_prompt_len else n
