"""The options of a serving run: ServeOptions (what the CLI gave, built once by `serve`,
`simulate`, `ablate` and `sweep`) checked and resolved into a ServeRun by resolve_run: cheap
checks first, then the model and the workloads, so a bad option never leaves a run directory
behind. `ablate` and `sweep` fix the options they do not expose (every request at t=0 by
default: saturation throughput) with dataclasses.replace.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dllm_bench import inputs
from dllm_bench.checkpoints.layout import load_config
from dllm_bench.device_defaults import SimulatedGpu, cuda_graphs_on, gpu_name, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.metric_options import metric_options
from dllm_bench.ridge import AUTO, device_ridge
from dllm_bench.serve.config import ServeRun
from dllm_bench.serve.presets import preset_for
from dllm_bench.serve.task_prompts import TASK_DATASET
from dllm_bench.serve.workload import build_workloads, model_info
from dllm_bench.systems import decoding as system_decoding
from dllm_bench.systems.families import for_family
from dllm_bench.systems.options import RunOptions, check_backends, variant_ranks
from dllm_bench.systems.spec import apply_baseline_batch, parse_systems
from dllm_bench.units import comma_list, format_size
from engine.config import DTYPES
from engine.decoding import FIXED

DATASET_CHOICES = ("livebench", "osc", "burstgpt", "random", TASK_DATASET)
ARRIVALS = ("poisson", "gamma", "trace")


# ---------------------------------------------------------------- option parsing
def parse_rps_list(text: str) -> list[float]:
    """`0.5`, `0.1,0.25,0.5,1.0`, `inf` -> floats > 0 (inf = all requests at t=0)."""
    def rate(tok: str) -> float:
        try:
            v = float(tok)
        except ValueError:
            raise UserError(f"--rps: expected numbers > 0 or 'inf' (comma separated), got {tok!r}") from None
        if math.isnan(v) or v <= 0:
            raise UserError(f"--rps must be > 0 (or inf for all requests at t=0), got {tok}")
        return v
    return comma_list(text, "--rps", rate)


def parse_datasets(text: str) -> list[str]:
    out = comma_list(text, "--dataset")
    for d in out:
        if d not in DATASET_CHOICES + ("custom",):
            raise UserError(f"unknown dataset {d!r}; choose from {', '.join(DATASET_CHOICES)} "
                            "(or a file with --dataset-path)")
    return out


def parse_optional_int(text: str | None, what: str) -> int | None:
    """For knobs where 'none' means unbounded (e.g. --max-num-logits none = monolithic)."""
    if text is None:
        return None
    if str(text).strip().lower() in ("none", "null"):
        return None
    try:
        v = int(str(text))
    except ValueError:
        raise UserError(f"{what}: expected a positive integer or 'none', got {text!r}") from None
    if v < 1:
        raise UserError(f"{what} must be >= 1 (or 'none'), got {v}")
    return v


def check_counts(num_prompts: int | None, seed: int, repeats: int = 1) -> None:
    """--num-prompts (when given) >= 1, --seed >= 0 and --repeats >= 1."""
    if num_prompts is not None and num_prompts < 1:
        raise UserError(f"--num-prompts must be >= 1, got {num_prompts}")
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    if repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {repeats}")


def check_gen_length(gen_length: int | None, block_length: int) -> None:
    """--gen-length (one output length for every request): whole blocks, at least one."""
    if gen_length is not None and (gen_length < 1 or gen_length % block_length):
        raise UserError(f"--gen-length must be a positive multiple of the block length ({block_length}), "
                        f"got {gen_length}")


# ---------------------------------------------------------------- the options
@dataclass(frozen=True)
class ServeOptions(RunOptions):
    """Every option of a serving run as given on the command line; None = the preset's value
    (dllm_bench.serve.presets). Field names are the CLI parameters' names (`--num-prompts` ->
    num_prompts), so a command builds one with ServeOptions.pick(locals())."""
    rps: str | None = None
    systems: str | None = None
    baseline_batch: str = "max-fit"
    dataset: str | None = None
    dataset_path: Path | None = None
    num_prompts: int | None = None
    duration: float | None = None
    burstiness: float = 1.0
    arrivals: str | None = None
    time_scale: float = 1.0
    burstgpt_model: str | None = None
    model: str | None = None
    preset: str | None = None
    max_num_batched_tokens: int | None = None
    max_num_logits: str | None = None
    max_num_seqs: int | None = None
    retention: float | None = None
    length_scale: float | None = None
    gen_cap: int | None = None
    gen_length: int | None = None
    block_length: int | None = None
    max_prompt_len: int | None = None
    seed: int = 0
    repeats: int = 1
    max_duration: float | None = None
    num_warmups: int = 1
    no_profile_cache: bool = False
    max_concurrency: int | None = None          # vLLM's: requests in flight at most
    percentile_metrics: str | None = None       # which of ttft,tpot,itl,e2el get percentiles
    metric_percentiles: str | None = None       # which percentiles, e.g. 50,90,99
    goodput: tuple[str, ...] | None = None      # SLO pairs METRIC:MS
    decoding: str = FIXED                     # engine.decoding policy (dllm_bench.systems.decoding)
    trace_steps: bool = False                   # steps.jsonl per point (dllm_bench.serve.trace)


# ---------------------------------------------------------------- option resolution
def resolve_run(opts: ServeOptions, *, weights: bool = True, wall_clock: bool = True,
                gpu: SimulatedGpu | None = None) -> ServeRun:
    """Every option checked (cheap ones first) and the workloads built: any problem is a
    UserError before a run directory exists. `weights=False`: the model is simulated by its
    shape, so its config is all it needs. A count is refused up front when its requests would not
    fit in memory (inputs.fits_memory) or, `wall_clock` (not a simulation), when its arrivals alone
    would take more than a day per point.

    Device defaults (dllm_bench.device_defaults): a checkpoint dir without --preset on a CUDA
    device starts from the GPU preset; a CPU preset on CUDA runs in bfloat16; the budget (`auto`,
    or none given and none in the preset) is free memory x 0.9 on CUDA, measured here, once, for
    every system of the run; the engine's CUDA graphs are on for a CUDA device unless
    --no-cuda-graphs (resolved to true/false into the preset, so config.json says what ran); a
    preset's "auto" token and logit budgets are scaled with the GPU's budget and the model
    (dllm_bench.step_budgets) once the workloads are known, and its "auto" ridge (what cache=auto
    weighs: dllm_bench.ridge) measured on CUDA, once. `gpu`: the GPU a simulated run models (its
    hardware profile's): every default above is taken for it, as on a CUDA device whose free
    memory is the profile's, without asking torch.cuda."""
    o = opts
    rps, num_prompts, duration, burstiness = o.rps, o.num_prompts, o.duration, o.burstiness
    dataset_path, device, dtype, seed = o.dataset_path, o.device, o.dtype, o.seed
    variants = apply_baseline_batch(parse_systems(o.systems), o.baseline_batch)
    sp = preset_for(o.preset, o.model, device=gpu or device or "auto")
    rps_list = parse_rps_list(rps if rps is not None else sp.rps)
    datasets = parse_datasets(o.dataset if o.dataset is not None else sp.dataset)
    arrivals = o.arrivals or ("gamma" if burstiness != 1.0 else "poisson")
    if arrivals not in ARRIVALS:
        raise UserError(f"--arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if not (burstiness > 0):
        raise UserError(f"--burstiness must be > 0 (1 = Poisson, < 1 burstier), got {burstiness}")
    if arrivals == "poisson" and burstiness != 1.0:
        raise UserError("--burstiness applies to gamma arrivals (poisson is burstiness 1); use --arrivals gamma")
    if inputs.input_file(dataset_path, "--dataset-path") is not None:
        if len(datasets) > 1:
            raise UserError("--dataset-path replays one file: give a single --dataset (its label)")
        if datasets == [TASK_DATASET]:
            raise UserError(f"--dataset {TASK_DATASET} draws the trained model's own questions: not with --dataset-path")
    elif "custom" in datasets:
        raise UserError("--dataset custom needs --dataset-path (a BurstGPT CSV or a JSONL file)")
    if arrivals == "trace":
        if dataset_path is None:
            raise UserError("--arrivals trace replays the timestamps of --dataset-path (a BurstGPT CSV or JSONL)")
        if rps is not None:
            raise UserError("--rps does not apply to --arrivals trace (use --time-scale to speed it up)")
    check_counts(num_prompts, seed, o.repeats)
    slowest = min((r for r in rps_list if math.isfinite(r)), default=None)
    if wall_clock and num_prompts and slowest and arrivals != "trace" and o.max_duration is None:
        if num_prompts / slowest > inputs.MAX_ARRIVAL_S:
            raise UserError(f"--num-prompts {num_prompts:,} at {slowest:g} req/s is {num_prompts / slowest / 3600:,.1f} h "
                            f"of arrivals per point and system, over the {inputs.MAX_ARRIVAL_S // 3600} h a point may "
                            "take: lower --num-prompts, raise --rps, or bound each point with --max-duration")
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise UserError(f"--duration must be a number of seconds > 0, got {duration}")
    if duration is not None and num_prompts is None and any(math.isinf(r) for r in rps_list) and arrivals != "trace":
        raise UserError("--rps inf sends everything at t=0: bound it with --num-prompts, not --duration")
    if o.max_duration is not None and not o.max_duration > 0:
        raise UserError(f"--max-duration must be > 0 seconds, got {o.max_duration}")
    if not o.time_scale > 0:
        raise UserError(f"--time-scale must be > 0, got {o.time_scale}")
    if o.num_warmups < 0:
        raise UserError(f"--num-warmups must be >= 0, got {o.num_warmups}")
    if o.max_concurrency is not None and o.max_concurrency < 1:
        raise UserError(f"--max-concurrency must be >= 1, got {o.max_concurrency}")
    reporting = metric_options(o.percentile_metrics, o.metric_percentiles, o.goodput)
    decoding = str(system_decoding.parse(o.decoding))
    over: dict[str, Any] = {}
    for k in ("max_num_batched_tokens", "max_num_seqs", "gen_cap", "block_length", "max_prompt_len", "threads",
              "tensor_parallel_size"):
        v = getattr(o, k)
        if v is not None:
            if v < 1:
                raise UserError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
            over[k] = v
    if o.max_num_logits is not None:
        over["max_num_logits"] = parse_optional_int(o.max_num_logits, "--max-num-logits")
    if o.retention is not None:
        if not 0 < o.retention <= 1:
            raise UserError(f"--retention must be in (0, 1], got {o.retention}")
        over["retention"] = o.retention
    if o.length_scale is not None:
        if not (o.length_scale > 0 and math.isfinite(o.length_scale)):
            raise UserError(f"--length-scale must be > 0, got {o.length_scale}")
        over["length_scale"] = o.length_scale
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if device is not None or gpu is not None:
        over["device"] = device or "cuda"
    over["dtype"] = dtype or sp.dtype_on(gpu or device)
    if o.memory_budget is not None:
        over["memory_budget"] = None if o.memory_budget.strip().lower() == "auto" else o.memory_budget
    if o.gen_length is not None:
        over["gen_length"] = o.gen_length
    sp = replace(sp, **over)
    check_gen_length(sp.gen_length, sp.block_length)
    if sp.gen_cap < sp.block_length:
        raise UserError(f"--gen-cap {sp.gen_cap} is smaller than one block ({sp.block_length} tokens)")
    target = gpu or inputs.device(sp.device)           # the device whose defaults the run takes
    sp = replace(sp, cuda_graphs=cuda_graphs_on(o.cuda_graphs, target))
    mb = resolve_budget(sp.memory_budget, target, required=True)
    budget = mb.bytes
    model_dir = inputs.checkpoint_dir(sp.model, weights=weights)
    # a system with no version for the model's family: refused when named, left out of the default list
    variants = for_family(variants, load_config(model_dir).model_type, explicit=bool(o.systems and o.systems.strip()))
    if weights:     # before a worker spawns ranks the model cannot split into, each variant's own size too
        from dllm_bench.systems.build import check_tensor_parallel

        for n in sorted({variant_ranks(v, sp.engine_defaults()) for v in variants} | {sp.tensor_parallel_size}):
            check_tensor_parallel(model_dir, n, "cpu" if gpu else sp.device)   # a profile's GPUs: the split only
    if gpu is None:  # a measured run: its engines' attention backends on this device, before the header
        check_backends(variants, sp.engine_defaults(), target, sp.dtype)
    info = model_info(model_dir, sp.dtype)
    if budget is not None and budget <= info["weights_bytes"]:
        raise UserError(f"--memory-budget {format_size(budget)} does not even hold the weights "
                        f"({format_size(info['weights_bytes'])} in {sp.dtype})")
    if num_prompts is None and duration is None:
        num_prompts = sp.num_prompts
    # The parent holds every (dataset, rate) workload, a worker one more; requests up to the model's length.
    count = num_prompts or math.ceil(max((r * duration for r in rps_list if math.isfinite(r)), default=1))
    if count <= inputs.MAX_COUNT:  # beyond it, the workload's own count check says so (make_workloads)
        inputs.fits_memory(count, len(datasets) * len(rps_list) + 1, sp.max_model_len or info["max_sequence_length"],
                           "--num-prompts" if num_prompts else f"--duration {duration:g} s x --rps: about", "request")
    run = ServeRun(
        preset=sp, model_dir=model_dir, model_info=info, systems=variants, datasets=datasets,
        rps=rps_list, arrivals=arrivals, burstiness=burstiness, seed=seed, num_prompts=num_prompts,
        duration=duration, dataset_path=str(dataset_path) if dataset_path else None,
        time_scale=o.time_scale, burstgpt_model=o.burstgpt_model, memory_budget=budget,
        memory_budget_source=mb.to_dict(), max_duration=o.max_duration, num_warmups=o.num_warmups,
        use_cache=not o.no_profile_cache, repeats=o.repeats, options=opts, max_concurrency=o.max_concurrency,
        metric_options=reporting, decoding=decoding, trace_steps=o.trace_steps)
    build_workloads(run)
    if sp.auto_budgets:
        longest = max((r.prompt_len + r.gen_length for wl in run.workloads.values() for r in wl), default=1)
        run.preset = sp.with_step_budgets(info, longest, gpu_name(target), budget)
    if run.preset.ridge_rows == AUTO:
        run.preset = run.preset.with_ridge(device_ridge(target, DTYPES[sp.dtype], info))
    return run

