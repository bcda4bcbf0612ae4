"""memory(): every system of the run searched for its longest canvas within the budget, then one
request at `--length` measured step by step, optionally carried to a target model (derive);
the table on stderr, the run directory, --json's document on stdout."""
from __future__ import annotations

import dataclasses

import torch

from dllm_bench import results
from dllm_bench.checkpoints.load import load_model
from dllm_bench.console import console
from dllm_bench.memory_bench import derive as dv
from dllm_bench.memory_bench.modes import derive_auto
from dllm_bench.memory_bench.options import MemoryOptions, resolve
from dllm_bench.memory_bench.output import profile_stats, show, write
from dllm_bench.memory_bench.search import max_length
from dllm_bench.memory_bench.trace import measure
from dllm_bench.systems.spec import ENGINE, engine_knobs
from engine.config import EngineConfig
from engine.kv_cache import AUTO


def memory(opts: MemoryOptions) -> dict:
    run = resolve(opts)                              # every bad input before anything is written
    if opts.threads:
        torch.set_num_threads(opts.threads)
    con = console()
    model = load_model(run.model_dir, run.dtype, str(run.device))
    run_dir = results.create_run("memory", run.to_dict(), name="memory", run_id=opts.run_id, root=opts.result_dir)
    doc = {"run_id": run_dir.name, "run_dir": str(run_dir), "model": opts.model, "dtype": run.dtype,
           "device": str(run.device), "budget_bytes": run.budget.bytes, "trained_length": run.trained_length,
           "length": run.length, "gen_length": run.gen_length, "block_length": run.block_length, "steps": run.steps,
           "systems": []}
    for v in run.variants:
        entry: dict = {"system": v.label}
        if v.name == ENGINE:           # its token budget and cache, default or given (the tables name them)
            knobs = engine_knobs(v, run.preset.engine_defaults())
            entry |= {"max_num_batched_tokens": knobs["max_num_batched_tokens"], "cache": knobs["cache"]}
        traces = []
        if opts.search:
            s = max_length(v.label, lambda n, v=v: measure(v, model, run, n, stop_over_budget=True),
                           run.gen_length + 1, run.max_length, run.resolution, progress=con.print)
            entry["search"] = s.to_dict()
            traces += s.probes
        con.print(f"{v.label}: one request of {run.length:,} tokens, step by step")
        t = measure(v, model, run, run.length)
        traces.append(t)
        entry["profile"] = {"length": t.length, "fits": t.fits, "reason": t.reason, "complete": t.complete,
                            "cache": t.cache, "steps": [dataclasses.asdict(st) for st in t.steps]}
        entry["profile"]["stats"] = profile_stats(entry["profile"]["steps"])
        if run.target is not None:
            entry["derived"] = _derived(v, traces, model, run).to_dict()
        doc["systems"].append(entry)
    if run.target is not None:
        doc["derive_note"] = dv.target_dtype_note(run, run.target)
        doc["derive"] = {"model": run.target.name, "dtype": run.target.dtype, "budget_bytes": run.target.budget,
                         "trained_length": run.target.config.max_sequence_length}
    write(run_dir, doc)
    show(con, doc)
    return doc


def _derived(v, traces, model, run) -> dv.Derived:
    if v.name != ENGINE:
        return dv.derive(v.label, traces, model, run, run.target)
    knobs = engine_knobs(v, run.preset.engine_defaults())
    knobs.pop("tensor_parallel_size", None)
    cfg = EngineConfig(dtype=run.dtype, device=str(run.device), memory_budget=run.budget.bytes, sampling=False,
                       **knobs)
    reservation = dv.engine_reservation(model, run, cfg, run.target)
    guard = cfg.guard_fraction * run.target.budget
    if cfg.cache == AUTO:
        return derive_auto(v, traces, model, run, reservation, guard)
    return dv.derive(v.label, traces, model, run, run.target, reservation, guard)
