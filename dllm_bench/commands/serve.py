"""`dllm-bench serve`: open-loop serving benchmark of the engine against the baselines, like
`vllm bench serve` (docs/SERVE.md).

This module is the command: its options, and their checks and resolution into a ServeRun
(cheap checks first, then the model and the workloads, so a bad option never leaves a run
directory behind). The workload is built once per (dataset, rps) from the seed
(dllm_bench/serve/workload.py); every system then replays exactly that arrival sequence against
exactly the same memory budget, one system after another, each in a fresh worker process
(dllm_bench/serve/run.py, dllm_bench/serve/process.py).
"""
from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.serve.run import ServeRun, serve
from dllm_bench.serve.workload import build_workloads, model_info

DATASET_CHOICES = ("livebench", "osc", "burstgpt", "random")
ARRIVALS = ("poisson", "gamma", "trace")


# ---------------------------------------------------------------- option parsing
def parse_rps_list(text: str) -> list[float]:
    """`0.5`, `0.1,0.25,0.5,1.0`, `inf` -> floats > 0 (inf = all requests at t=0)."""
    out: list[float] = []
    for tok in (t.strip() for t in str(text).split(",")):
        if not tok:
            continue
        try:
            v = float(tok)
        except ValueError:
            raise UserError(f"--rps: expected numbers > 0 or 'inf' (comma separated), got {tok!r}") from None
        if math.isnan(v) or v <= 0:
            raise UserError(f"--rps must be > 0 (or inf for all requests at t=0), got {tok}")
        if v in out:
            raise UserError(f"--rps lists {tok} twice")
        out.append(v)
    if not out:
        raise UserError("--rps is empty")
    return out


def parse_datasets(text: str) -> list[str]:
    out = [t.strip() for t in str(text).split(",") if t.strip()]
    if not out:
        raise UserError("--dataset is empty")
    for d in out:
        if d not in DATASET_CHOICES + ("custom",):
            raise UserError(f"unknown dataset {d!r}; choose from {', '.join(DATASET_CHOICES)} "
                            "(or a file with --dataset-path)")
    if len(set(out)) != len(out):
        raise UserError("--dataset lists a dataset twice")
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


# ---------------------------------------------------------------- option resolution
def resolve_run(*, rps: str | None, systems: str | None, dataset: str | None, dataset_path: Path | None,
                num_prompts: int | None, duration: float | None, burstiness: float, arrivals: str | None,
                time_scale: float, burstgpt_model: str | None, memory_budget: str | None, model: str | None,
                preset: str | None, max_num_batched_tokens: int | None, max_num_logits: str | None,
                max_num_seqs: int | None, retention: float | None, length_scale: float | None,
                gen_cap: int | None, block_length: int | None, max_prompt_len: int | None,
                threads: int | None, dtype: str | None, device: str | None, seed: int,
                max_duration: float | None, num_warmups: int, no_profile_cache: bool) -> ServeRun:
    """Every option checked (cheap ones first) and the workloads built: any problem is a
    UserError before a run directory exists."""
    from dllm_bench.serve.presets import preset_for
    from dllm_bench.systems.spec import parse_systems
    from dllm_bench.units import parse_size

    variants = parse_systems(systems)
    sp = preset_for(preset, model)
    rps_list = parse_rps_list(rps if rps is not None else sp.rps)
    datasets = parse_datasets(dataset if dataset is not None else sp.dataset)
    arrivals = arrivals or ("gamma" if burstiness != 1.0 else "poisson")
    if arrivals not in ARRIVALS:
        raise UserError(f"--arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if not (burstiness > 0):
        raise UserError(f"--burstiness must be > 0 (1 = Poisson, < 1 burstier), got {burstiness}")
    if arrivals == "poisson" and burstiness != 1.0:
        raise UserError("--burstiness applies to gamma arrivals (poisson is burstiness 1); use --arrivals gamma")
    if inputs.input_file(dataset_path, "--dataset-path") is not None:
        if len(datasets) > 1:
            raise UserError("--dataset-path replays one file: give a single --dataset (its label)")
    elif "custom" in datasets:
        raise UserError("--dataset custom needs --dataset-path (a BurstGPT CSV or a JSONL file)")
    if arrivals == "trace":
        if dataset_path is None:
            raise UserError("--arrivals trace replays the timestamps of --dataset-path (a BurstGPT CSV or JSONL)")
        if rps is not None:
            raise UserError("--rps does not apply to --arrivals trace (use --time-scale to speed it up)")
    if num_prompts is not None and num_prompts < 1:
        raise UserError(f"--num-prompts must be >= 1, got {num_prompts}")
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise UserError(f"--duration must be a number of seconds > 0, got {duration}")
    if duration is not None and num_prompts is None and any(math.isinf(r) for r in rps_list) and arrivals != "trace":
        raise UserError("--rps inf sends everything at t=0: bound it with --num-prompts, not --duration")
    if max_duration is not None and not max_duration > 0:
        raise UserError(f"--max-duration must be > 0 seconds, got {max_duration}")
    if not time_scale > 0:
        raise UserError(f"--time-scale must be > 0, got {time_scale}")
    if num_warmups < 0:
        raise UserError(f"--num-warmups must be >= 0, got {num_warmups}")
    over: dict[str, Any] = {}
    for k, v in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs),
                 ("gen_cap", gen_cap), ("block_length", block_length), ("max_prompt_len", max_prompt_len),
                 ("threads", threads)):
        if v is not None:
            if v < 1:
                raise UserError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
            over[k] = v
    if max_num_logits is not None:
        over["max_num_logits"] = parse_optional_int(max_num_logits, "--max-num-logits")
    if retention is not None:
        if not 0 < retention <= 1:
            raise UserError(f"--retention must be in (0, 1], got {retention}")
        over["retention"] = retention
    if length_scale is not None:
        if not (length_scale > 0 and math.isfinite(length_scale)):
            raise UserError(f"--length-scale must be > 0, got {length_scale}")
        over["length_scale"] = length_scale
    if dtype is not None:
        if dtype not in ("float32", "float64", "bfloat16", "float16"):
            raise UserError(f"--dtype must be float32, float64, bfloat16 or float16, got {dtype!r}")
        over["dtype"] = dtype
    if device is not None:
        over["device"] = device
    if memory_budget is not None:
        over["memory_budget"] = None if memory_budget.strip().lower() in ("none", "auto") else memory_budget
    sp = replace(sp, **over)
    if sp.gen_cap < sp.block_length:
        raise UserError(f"--gen-cap {sp.gen_cap} is smaller than one block ({sp.block_length} tokens)")
    budget = parse_size(sp.memory_budget, "--memory-budget") if sp.memory_budget else None
    if sp.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"--device {sp.device}: CUDA is not available here (use --device cpu)")
    elif sp.device != "cpu":
        raise UserError(f"--device must be cpu or cuda[:N], got {sp.device!r}")
    if budget is None and not sp.device.startswith("cuda"):
        raise UserError("a --memory-budget is needed on CPU (e.g. --memory-budget 1GiB)")
    model_dir = inputs.checkpoint_dir(sp.model)
    info = model_info(model_dir, sp.dtype)
    if budget is not None and budget <= info["weights_bytes"]:
        from dllm_bench.units import format_size

        raise UserError(f"--memory-budget {format_size(budget)} does not even hold the weights "
                        f"({format_size(info['weights_bytes'])} in {sp.dtype})")
    if num_prompts is None and duration is None:
        num_prompts = sp.num_prompts
    run = ServeRun(
        preset=sp, model_dir=model_dir, model_info=info, systems=variants, datasets=datasets,
        rps=rps_list, arrivals=arrivals, burstiness=burstiness, seed=seed, num_prompts=num_prompts,
        duration=duration, dataset_path=str(dataset_path) if dataset_path else None,
        time_scale=time_scale, burstgpt_model=burstgpt_model, memory_budget=budget,
        max_duration=max_duration, num_warmups=num_warmups, use_cache=not no_profile_cache)
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    build_workloads(run)
    return run


# ---------------------------------------------------------------- the command
def register(app: typer.Typer) -> None:
    from dllm_bench.serve.presets import DEFAULT_PRESET, PRESETS

    @app.command("serve")
    def serve_cmd(
        rps: str | None = typer.Option(None, "--rps", "--request-rate",
                                       help="arrival rate(s), req/s: 0.5, or a sweep 0.1,0.25,0.5,1.0; inf = all at t=0 [preset: 0.5]"),
        systems: str | None = typer.Option(None, "--systems",
                                           help="systems and variants: engine,fast-dllm,dllm-cache,sparse-dllm (default), "
                                                "llada; variants name[:k=v,...] e.g. 'engine:cache=dual,fast-dllm:batch=1'"),
        dataset: str | None = typer.Option(None, "--dataset", "--dataset-name",
                                           help="livebench | osc | burstgpt | random, or a list livebench,osc,burstgpt"),
        dataset_path: Path | None = typer.Option(None, "--dataset-path", help="replay a BurstGPT CSV or a JSONL file"),
        num_prompts: int | None = typer.Option(None, "--num-prompts", help="requests per point [preset]"),
        duration: float | None = typer.Option(None, "--duration", help="bound arrivals by time (s) instead of count"),
        burstiness: float = typer.Option(1.0, "--burstiness", help="gamma shape: 1 = Poisson, < 1 burstier"),
        arrivals: str | None = typer.Option(None, "--arrivals", help="poisson | gamma | trace (default: poisson, gamma if --burstiness != 1)"),
        time_scale: float = typer.Option(1.0, "--time-scale", help="trace replay speed-up (60 = a minute per second)"),
        burstgpt_model: str | None = typer.Option(None, "--burstgpt-model", help="BurstGPT CSV rows of one model: ChatGPT | GPT-4"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV, e.g. 1GiB, 512MiB, 2.5GB [preset]"),
        model: str | None = typer.Option(None, "--model", help="model preset (dllm-bench models list) or LLaDA checkpoint dir [preset]"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET}, or the one for --model)"),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens", help="engine token budget per step"),
        max_num_logits: str | None = typer.Option(None, "--max-num-logits", help="engine logit budget (rows per step), or none"),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="engine max concurrent requests"),
        retention: float | None = typer.Option(None, "--retention", help="sparse KV retention (engine and sparse-dllm keep_ratio)"),
        length_scale: float | None = typer.Option(None, "--length-scale", help="multiply dataset token counts (CPU runs: 0.125)"),
        gen_cap: int | None = typer.Option(None, "--gen-cap", help="max gen_length in tokens"),
        block_length: int | None = typer.Option(None, "--block-length", help="diffusion block length"),
        max_prompt_len: int | None = typer.Option(None, "--max-prompt-len", help="cut prompts to this many tokens"),
        threads: int | None = typer.Option(None, "--threads", help="torch threads of every system process [preset]"),
        dtype: str | None = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 | float64 [preset]"),
        device: str | None = typer.Option(None, "--device", help="cpu | cuda [preset]"),
        seed: int = typer.Option(0, "--seed", help="workload seed (arrivals, lengths, prompt ids)"),
        max_duration: float | None = typer.Option(None, "--max-duration", help="abort a point after this many seconds (unfinished requests are counted)"),
        num_warmups: int = typer.Option(1, "--num-warmups", help="unmeasured warm-up requests per system"),
        result_dir: Path | None = typer.Option(None, "--result-dir", help="runs root (default results/runs, or $DLLM_BENCH_RESULTS_DIR)"),
        run_id: str | None = typer.Option(None, "--run-id", help="name of the run directory (default: timestamp-name)"),
        resume: bool = typer.Option(False, "--resume", help="continue a run (--run-id, default the latest): skip finished points"),
        no_profile_cache: bool = typer.Option(False, "--no-profile-cache", help="re-measure KV pools and static batches"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document (summaries, ratios, run dir) on stdout"),
    ) -> None:
        """Open-loop serving benchmark: every system replays the same arrivals under the same memory budget."""
        result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
        run = resolve_run(
            rps=rps, systems=systems, dataset=dataset, dataset_path=dataset_path, num_prompts=num_prompts,
            duration=duration, burstiness=burstiness, arrivals=arrivals, time_scale=time_scale,
            burstgpt_model=burstgpt_model, memory_budget=memory_budget, model=model, preset=preset,
            max_num_batched_tokens=max_num_batched_tokens, max_num_logits=max_num_logits,
            max_num_seqs=max_num_seqs, retention=retention, length_scale=length_scale, gen_cap=gen_cap,
            block_length=block_length, max_prompt_len=max_prompt_len, threads=threads, dtype=dtype,
            device=device, seed=seed, max_duration=max_duration, num_warmups=num_warmups,
            no_profile_cache=no_profile_cache)
        code = serve(run, result_dir=result_dir, run_id=run_id, resume=resume, as_json=as_json)
        if code:
            sys.exit(code)  # not typer.Exit: with standalone_mode=False click returns its code unused
