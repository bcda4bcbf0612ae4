"""`dllm-bench profile`: what the offline profiler measures and what it leaves for the KV pool,
with the logit budget and without it (monolithic logits), side by side (the paper's Fig 2).

`--device-memory 80GiB` plans a GPU we do not have instead: the same two columns from the
model's shapes alone (dllm_bench.simulate.memory's byte counts; no weights, no GPU).

`--tensor-parallel-size N`: per rank of an engine split over N devices (docs/PARALLEL.md) — the
plan of one of N such GPUs, or measured by N CPU processes each profiling its own shard."""
from __future__ import annotations

import dataclasses
import json

import torch
import typer
from rich.table import Table

from dllm_bench import inputs
from dllm_bench.checkpoints.load import load_model, load_shape
from dllm_bench.checkpoints.presets import param_count
from dllm_bench.console import console
from dllm_bench.device_defaults import default_dtype, is_cuda, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.simulate import hardware
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.memory import engine_plans
from dllm_bench.units import parse_size
from engine import EngineConfig
from engine.attention import resolve_backend
from engine.config import DTYPES
from engine.models.llada import LLaDAConfig
from engine.parallel import Cluster
from engine.parallel.rank import rank_profile
from engine.parallel.sharding import check_divisible
from engine.profiler import profile_kv_pool

MiB = 2**20


def run_profiles(model, base: EngineConfig, max_model_len: int, logit_budget: int):
    out = {}
    for label, rows in (("logit budget", logit_budget), ("monolithic", None)):
        cfg = dataclasses.replace(base, max_num_logits=rows)
        try:
            out[label] = profile_kv_pool(model, cfg, resolve_backend(cfg.attention_backend, model.device, model.dtype), max_model_len)
        except ValueError as e:
            out[label] = str(e)   # the budget does not even hold the worst step: say so
    return out


def run_rank_profiles(model_dir: str, base: EngineConfig, max_model_len: int, logit_budget: int, n: int,
                      threads: int | None) -> dict:
    """run_profiles on n CPU processes, each profiling its shard: rank 0's profile, its KV pool
    the smallest any rank holds (every rank's pool addresses the same slots)."""
    out = {}
    cluster = Cluster.spawn(n, "cpu", threads or 1)
    try:
        for label, rows in (("logit budget", logit_budget), ("monolithic", None)):
            cfg = dataclasses.replace(base, max_num_logits=rows, model=model_dir, tensor_parallel_size=n)
            ranks = cluster.collective_rpc(rank_profile, cfg, max_model_len)
            bad = next((r for r in ranks if isinstance(r, str)), None)
            out[label] = bad or dataclasses.replace(ranks[0], kv_pool_tokens=min(r.kv_pool_tokens for r in ranks))
    finally:
        cluster.close()
    return out


def device_memory_bytes(spec: str) -> int:
    """`--device-memory`: a size, or a hardware profile's memory (simulate/hardware/*.json)."""
    if spec.strip().lower() in hardware.builtin_names():
        return int(hardware.load(spec.strip().lower()).memory_bytes)
    try:
        return parse_size(spec, "--device-memory")
    except UserError:
        raise UserError(f"--device-memory takes a size (24GiB, 80GB) or a hardware profile "
                        f"({', '.join(hardware.builtin_names())}), got {spec!r}") from None


def _print_plan(model: str, device_bytes: int, base: EngineConfig, doc: dict, prompt_len: int, gen_length: int) -> None:
    plans, n = doc["plans"], doc["tensor_parallel_size"]
    per = f" · per GPU of {n} (tensor parallel)" if n > 1 else ""
    t = Table(title=f"memory plan · {model} ({doc['n_params'] / 1e9:.2f}B params, {base.dtype}) · device "
                    f"{device_bytes / 2**30:.0f} GiB × {base.gpu_memory_utilization:g} = budget "
                    f"{base.memory_budget / MiB:,.0f} MiB · {base.max_num_batched_tokens} query tokens/step{per}")
    t.add_column("")
    for k in plans:
        t.add_column(k, justify="right")
    rows = [("weights (MiB)", "weights_bytes", MiB), ("context + allocator slack (MiB)", "context_bytes", MiB),
            (f"activations at {base.max_num_batched_tokens} tokens (MiB)", "activation_bytes", MiB),
            ("logit rows", "logit_rows", 1), ("logit rows × vocab × 8 B (MiB)", "logit_bytes", MiB),
            ("KV pool (MiB)", "kv_pool_bytes", MiB), ("KV pool (token slots)", "kv_tokens", 1),
            ("KV bytes per token", "kv_bytes_per_token", 1),
            (f"requests that fit ({prompt_len}+{gen_length})", "requests_that_fit", 1),
            (f"concurrency (max_num_seqs {base.max_num_seqs})", "concurrency", 1)]
    for label, key, div in rows:
        t.add_row(label, *[f"{p[key] / div:,.0f}" for p in plans.values()])
    out = console(stderr=False)
    out.print(t)
    short = [k for k, p in plans.items() if p["kv_pool_bytes"] <= 0]
    for k in short:
        out.print(f"{k}: no KV pool, {-plans[k]['kv_pool_bytes'] / MiB:,.0f} MiB short")


def register(app: typer.Typer) -> None:
    @app.command()
    def profile(
        model: str = typer.Option("mini-126k", "--model", "-m", help="Preset name (llada-8b too with --device-memory) or checkpoint directory."),
        memory_budget: str | None = typer.Option(None, help="Total budget for weights + activations + KV, or auto = free GPU memory x 0.9 (default: auto on CUDA, 4GiB on CPU)."),
        device_memory: str | None = typer.Option(None, help="Plan a GPU of this memory (24GiB, 80GiB, or a hardware profile: l40s, a100-80g, ...) from the model's shapes alone: no weights, no GPU; budget = this × gpu_memory_utilization."),
        max_num_batched_tokens: int = typer.Option(4096, help="Query tokens per step (token budget)."),
        max_num_logits: int = typer.Option(1024, help="Logit rows per chunk for the budgeted profile."),
        max_num_seqs: int = typer.Option(256, help="Concurrent requests cap."),
        max_model_len: int = typer.Option(1024, help="Longest canvas (prompt + generation)."),
        cache: str = typer.Option("sparse", help="none | dual | sparse | auto (the worst step of dual and sparse)"),
        retention: float = typer.Option(0.5, help="Sparse cache retention."),
        prompt_len: int = typer.Option(256, help="Request shape for the 'requests that fit' column."),
        gen_length: int = typer.Option(256, help="Request shape for the 'requests that fit' column."),
        block_length: int = typer.Option(32),
        sampling: bool = typer.Option(False, "--sampling/--greedy", help="Profile for temperature > 0 (float64 Gumbel noise)."),
        dtype: str | None = typer.Option(None, help="float32 | bfloat16 | float16 | float64 (default: bfloat16 on CUDA or with --device-memory, else float32)."),
        threads: int | None = typer.Option(None, help="torch threads (per rank with --tensor-parallel-size, default 1)"),
        tensor_parallel_size: int = typer.Option(
            1, "--tensor-parallel-size", "--tp",
            help="Per rank of an engine split over N devices: with --device-memory the plan of one of N such GPUs, "
                 "else N CPU processes each profile their own shard (the KV pool: the smallest rank's)."),
        json_out: bool = typer.Option(False, "--json"),
    ) -> None:
        """Profile the worst admissible step and size the KV pool, with and without the logit budget."""
        if threads is not None:
            if threads <= 0:
                raise UserError("--threads must be positive")
            torch.set_num_threads(threads)
        if device_memory is not None and memory_budget is not None:
            raise UserError("give --memory-budget (measured here) or --device-memory (planned from shapes), not both")
        if tensor_parallel_size < 1:
            raise UserError("--tensor-parallel-size must be >= 1")
        device_bytes = device_memory_bytes(device_memory) if device_memory is not None else None
        dtype = dtype or ("bfloat16" if device_bytes is not None else default_dtype("auto"))
        if dtype not in DTYPES:
            raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        budget = (int(device_bytes * EngineConfig.gpu_memory_utilization) if device_bytes is not None
                  else resolve_budget(memory_budget or ("auto" if is_cuda("auto") else "4GiB"), "auto",
                                      required=True).bytes)
        for name, v in (("--prompt-len", prompt_len), ("--gen-length", gen_length), ("--block-length", block_length),
                        ("--max-model-len", max_model_len)):
            if v <= 0:
                raise UserError(f"{name} must be positive")
        try:
            base = EngineConfig(memory_budget=budget, max_num_batched_tokens=max_num_batched_tokens,
                                max_num_logits=max_num_logits, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                cache=cache, retention=retention, sampling=sampling, dtype=dtype)
        except ValueError as e:
            raise UserError(str(e)) from None
        if device_bytes is not None:
            cfg = load_shape(model)
            shape = ModelShape.from_config(cfg, torch.empty(0, dtype=DTYPES[dtype]).element_size())
            try:
                shape = shape.rank_share(tensor_parallel_size)
            except ValueError as e:
                raise UserError(f"--tensor-parallel-size: {e}") from None
            doc = {"n_params": param_count(cfg.d_model, cfg.n_layers, cfg.kv_heads * cfg.head_dim, cfg.mlp_hidden_size,
                                           cfg.padded_vocab),
                   "tensor_parallel_size": tensor_parallel_size,
                   "plans": engine_plans(shape, base, prompt_len + gen_length, block_length)}
            if json_out:
                typer.echo(json.dumps(dict(model=model, device_memory_bytes=device_bytes, dtype=dtype,
                                           shape=dict(prompt_len=prompt_len, gen_length=gen_length), **doc)))
            else:
                _print_plan(model, device_bytes, base, doc, prompt_len, gen_length)
            return
        if tensor_parallel_size > 1:
            path = inputs.checkpoint_dir(model)
            cfg = LLaDAConfig.from_pretrained(path)
            try:
                check_divisible(cfg, tensor_parallel_size)
            except ValueError as e:
                raise UserError(f"--tensor-parallel-size: {e}") from None
            results = run_rank_profiles(str(path), base, min(max_model_len, cfg.max_sequence_length), max_num_logits,
                                        tensor_parallel_size, threads)
        else:
            mdl = load_model(model, dtype)
            results = run_profiles(mdl, base, min(max_model_len, mdl.config.max_sequence_length), max_num_logits)
        doc = {k: (v.to_dict() | {"requests_that_fit": v.requests_that_fit(prompt_len, gen_length, block_length)})
               if not isinstance(v, str) else {"error": v} for k, v in results.items()}
        if json_out:
            typer.echo(json.dumps(dict(model=model, shape=dict(prompt_len=prompt_len, gen_length=gen_length),
                                       tensor_parallel_size=tensor_parallel_size, profiles=doc)))
            return
        per = f" · per rank of {tensor_parallel_size} (rank 0 measured; KV pool: the smallest rank's)" \
            if tensor_parallel_size > 1 else ""
        t = Table(title=f"KV pool sizing · {model} · budget {budget / MiB:.0f} MiB · {max_num_batched_tokens} "
                        f"query tokens/step{per}")
        t.add_column("")
        for k in results:
            t.add_column(k, justify="right")
        rows = [("weights (MiB)", "weights_bytes", MiB), ("activation peak (MiB)", "activation_peak_bytes", MiB),
                ("  refresh step (MiB)", "refresh_peak_bytes", MiB), ("  reuse step (MiB)", "reuse_peak_bytes", MiB),
                ("  chunked Refresh at max-model-len (MiB)", "long_refresh_peak_bytes", MiB),
                ("  its chunk (tokens)", "refresh_chunk_tokens", 1),
                ("guard (MiB)", "guard_bytes", MiB), ("KV pool (MiB)", "kv_pool_bytes", MiB),
                ("KV pool (token slots)", "kv_pool_tokens", 1)]
        long = any(d.get("refresh_chunk_tokens") for d in doc.values())    # max-model-len beyond the token budget
        for label, key, div in rows:
            if key in ("long_refresh_peak_bytes", "refresh_chunk_tokens") and not long:
                continue
            t.add_row(label, *[f"{(d[key] or 0) / div:,.0f}" if key in d else d.get("error", "")[:40]
                               for d in doc.values()])
        t.add_row(f"requests that fit ({prompt_len}+{gen_length})", *[f"{d.get('requests_that_fit', 0):,}" for d in doc.values()])
        out = console(stderr=False)
        out.print(t)
        ok = [d for d in doc.values() if "kv_pool_tokens" in d]
        if len(ok) == 2 and ok[1]["activation_peak_bytes"]:
            a, b = ok
            out.print(f"activation peak ratio (monolithic / budgeted): {b['activation_peak_bytes'] / a['activation_peak_bytes']:.1f}x; "
                   f"KV capacity ratio: {a['kv_pool_tokens'] / max(1, b['kv_pool_tokens']):.2f}x")
