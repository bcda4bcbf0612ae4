"""`dllm-bench profile-step`: one system at batch B, its steps under torch.profiler.

1. options resolved as serve resolves them (dllm_bench.stepprofile.options);
2. the device's GEMM peak and copy bandwidth measured in the model's dtype (calibrate's peaks,
   by CUDA events on a GPU) before anything is loaded;
3. the system built by dllm_bench.systems.build as a serve point's (a baseline at static batch
   B, which must fit the memory budget), checked to hold B requests in one step of the phase;
4. one warm-up request, then the step loop (dllm_bench.stepprofile.measure);
5. the document (dllm_bench.stepprofile.summary) and its table (dllm_bench.stepprofile.report).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from dllm_bench.device_defaults import is_cuda
from dllm_bench.errors import UserError
from dllm_bench.serve.workload import special_ids
from dllm_bench.simulate.calibrate.operators import PEAK_SIZES, measure_peaks
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.stepprofile import phases
from dllm_bench.stepprofile.measure import measure
from dllm_bench.stepprofile.options import MAX_FIT, StepProfileOptions, StepProfileSetup, resolve
from dllm_bench.stepprofile.summary import document, graph_buckets
from dllm_bench.stepprofile.work import record_work
from dllm_bench.systems.build import WorkloadShape, build_system, warm_up
from engine.config import DTYPES
from engine.kv_cache import kv_need
from engine.sampling import SamplingParams
from workloads.datasets import allowed_token_ids, synthetic_prompt_ids

PEAK_REPEATS = 5


def peaks(dtype: str, device: str) -> dict:
    """The GEMM rate and copy bandwidth this device reaches, in the model's dtype."""
    dev = torch.device(device)
    flops, bw = measure_peaks(DTYPES[dtype], PEAK_REPEATS, dev)
    n, elems = PEAK_SIZES.get(dev.type, PEAK_SIZES["cpu"])
    if dev.type == "cuda":
        torch.cuda.empty_cache()           # the system's budget is measured against free memory
    return {"gemm_flops_per_s": flops, "copy_bytes_per_s": bw, "gemm": f"{n}x{n}x{n} {dtype}",
            "copy_bytes": elems * DTYPES[dtype].itemsize, "timer": "CUDA events" if dev.type == "cuda" else "wall clock",
            "repeats": PEAK_REPEATS}


def profile_step(opts: StepProfileOptions, log: Callable[[str], None] = lambda m: None) -> dict:
    s = resolve(opts)
    p = s.run.preset
    fit = opts.batch == MAX_FIT
    torch.set_num_threads(p.threads)
    log(f"measuring the GEMM peak and copy bandwidth on {p.device}")
    pk = peaks(p.dtype, p.device)
    log(f"building {s.variant.label}")
    built = build_system(
        s.variant, model_dir=s.run.model_dir, dtype=p.dtype, device=p.device, memory_budget=s.run.memory_budget,
        shape=WorkloadShape(s.prompt_len, s.gen_length, s.block_length,
                            max_requests=p.max_num_seqs if fit else opts.batch),
        engine_defaults=s.run.engine_defaults, baseline_defaults=s.run.baseline_defaults,
        max_model_len=p.max_model_len, use_cache=s.run.use_cache, log=log)
    system = built.system
    if fit:                                    # the batch the budget holds, measured: from here on, B
        opts = replace(opts, batch=int(built.info["max_batch_size"]))
        s = replace(s, options=opts)
    check_capacity(system, built.info, s)
    prompts = _prompts(s)
    params = SamplingParams(gen_length=s.gen_length, steps=s.gen_length, block_length=s.block_length)
    log("warming up (one request)")
    warm_up(system, prompts[0][:8], s.block_length)
    model = system.model
    shape = ModelShape.from_config(model.config, model.dtype.itemsize)
    recorder = record_work(system, shape)
    log(f"profiling {opts.steps} {opts.phase} steps at batch {opts.batch}")
    spb = params.steps_per_block
    # enough for a mix that comes once per block, or once per batch of requests (a new static batch)
    bound = (opts.warmup + 2 * opts.steps + 2) * (2 * (spb + 1) + s.gen_length)
    m = measure(system, prompts, params, opts.phase, opts.steps, opts.warmup, shape, recorder, is_cuda(p.device),
                bound)
    doc = document(s, built.info, pk, m, shape)
    graphs = getattr(getattr(system, "runner", None), "graphs", None)   # the engine's CUDA-graph buckets
    doc["graph_buckets"] = graph_buckets(graphs) if graphs is not None else None
    return doc


def check_capacity(system, info: dict, s: StepProfileSetup) -> None:
    """UserError unless the system holds B requests of the shape in one step of the phase."""
    o, B = s.options, s.options.batch
    if not phases.is_engine(system):
        if info.get("fits_budget") is False:
            raise UserError(f"{s.variant.label}: a static batch of {B} needs {info.get('peak_bytes'):,} bytes of "
                            "activations and cache, more than the memory budget leaves after the weights; lower "
                            "--batch (serve measures the largest that fits: max-fit)")
        return
    c, length = system.config, s.prompt_len + s.gen_length
    if B > c.max_num_seqs:
        raise UserError(f"--batch {B} exceeds the engine's max_num_seqs {c.max_num_seqs} (set it with --system "
                        f"engine:max_num_seqs=N)")
    need = kv_need(c.cache, length, s.block_length, c.retention)
    if system.pool.capacity is not None and B * need > system.pool.capacity:
        raise UserError(f"--batch {B}: {B} requests of {length} tokens need {B * need:,} KV slots, the memory "
                        f"budget's pool holds {system.pool.capacity:,}; lower --batch or --prompt-len")
    reuse = s.block_length + system.model.config.shift    # a shifted family's Reuse also queries its edge rows
    rows = {"refresh": length, "reuse": reuse, "mixed": reuse}.get(o.phase, 0)
    if B * rows > c.max_num_batched_tokens:            # (serve: what does not fit waits, as it would)
        raise UserError(f"--batch {B}: a {o.phase} step of {B} requests is {B * rows:,} query tokens, over the "
                        f"token budget {c.max_num_batched_tokens:,} (set it with --system "
                        "engine:max_num_batched_tokens=N)")


def _prompts(s: StepProfileSetup) -> list[list[int]]:
    info = s.run.model_info
    rng = np.random.default_rng(s.options.seed)
    allowed = allowed_token_ids(info["vocab_size"], special_ids(info))
    return synthetic_prompt_ids([s.prompt_len] * s.options.batch, allowed, rng)
