"""`dllm-bench profile`: what the offline profiler measures and what it leaves for the KV pool,
with the logit budget and without it (monolithic logits), side by side (the paper's Fig 2)."""
from __future__ import annotations

import dataclasses
import json

import torch
import typer
from rich.table import Table

from dllm_bench.checkpoints.load import load_model
from dllm_bench.console import console
from dllm_bench.errors import UserError
from dllm_bench.units import parse_size
from engine import EngineConfig
from engine.attention import resolve_backend
from engine.profiler import profile_kv_pool

MiB = 2**20


def run_profiles(model, base: EngineConfig, max_model_len: int, logit_budget: int):
    out = {}
    for label, rows in (("logit budget", logit_budget), ("monolithic", None)):
        cfg = dataclasses.replace(base, max_num_logits=rows)
        try:
            out[label] = profile_kv_pool(model, cfg, resolve_backend(cfg.attention_backend, model.device), max_model_len)
        except ValueError as e:
            out[label] = str(e)   # the budget does not even hold the worst step: say so
    return out


def register(app: typer.Typer) -> None:
    @app.command()
    def profile(
        model: str = typer.Option("mini-126k", "--model", "-m", help="Preset name or checkpoint directory."),
        memory_budget: str = typer.Option("4GiB", help="Total budget for weights + activations + KV, e.g. 4GiB."),
        max_num_batched_tokens: int = typer.Option(4096, help="Query tokens per step (token budget)."),
        max_num_logits: int = typer.Option(1024, help="Logit rows per chunk for the budgeted profile."),
        max_num_seqs: int = typer.Option(256, help="Concurrent requests cap."),
        max_model_len: int = typer.Option(1024, help="Longest canvas (prompt + generation)."),
        cache: str = typer.Option("sparse", help="none | dual | sparse"),
        retention: float = typer.Option(0.5, help="Sparse cache retention."),
        prompt_len: int = typer.Option(256, help="Request shape for the 'requests that fit' column."),
        gen_length: int = typer.Option(256, help="Request shape for the 'requests that fit' column."),
        block_length: int = typer.Option(32),
        sampling: bool = typer.Option(False, "--sampling/--greedy", help="Profile for temperature > 0 (float64 Gumbel noise)."),
        dtype: str = typer.Option("float32"),
        threads: int | None = typer.Option(None, help="torch threads"),
        json_out: bool = typer.Option(False, "--json"),
    ) -> None:
        """Profile the worst admissible step and size the KV pool, with and without the logit budget."""
        if threads:
            torch.set_num_threads(threads)
        budget = parse_size(memory_budget)
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
        mdl = load_model(model, dtype)
        results = run_profiles(mdl, base, min(max_model_len, mdl.config.max_sequence_length), max_num_logits)
        doc = {k: (v.to_dict() | {"requests_that_fit": v.requests_that_fit(prompt_len, gen_length, block_length)})
               if not isinstance(v, str) else {"error": v} for k, v in results.items()}
        if json_out:
            typer.echo(json.dumps(dict(model=model, shape=dict(prompt_len=prompt_len, gen_length=gen_length), profiles=doc)))
            return
        t = Table(title=f"KV pool sizing · {model} · budget {budget / MiB:.0f} MiB · {max_num_batched_tokens} query tokens/step")
        t.add_column("")
        for k in results:
            t.add_column(k, justify="right")
        rows = [("weights (MiB)", "weights_bytes", MiB), ("activation peak (MiB)", "activation_peak_bytes", MiB),
                ("  refresh step (MiB)", "refresh_peak_bytes", MiB), ("  reuse step (MiB)", "reuse_peak_bytes", MiB),
                ("guard (MiB)", "guard_bytes", MiB), ("KV pool (MiB)", "kv_pool_bytes", MiB),
                ("KV pool (token slots)", "kv_pool_tokens", 1)]
        for label, key, div in rows:
            t.add_row(label, *[f"{d[key] / div:,.0f}" if key in d else d.get("error", "")[:40] for d in doc.values()])
        t.add_row(f"requests that fit ({prompt_len}+{gen_length})", *[f"{d.get('requests_that_fit', 0):,}" for d in doc.values()])
        out = console(stderr=False)
        out.print(t)
        ok = [d for d in doc.values() if "kv_pool_tokens" in d]
        if len(ok) == 2 and ok[1]["activation_peak_bytes"]:
            a, b = ok
            out.print(f"activation peak ratio (monolithic / budgeted): {b['activation_peak_bytes'] / a['activation_peak_bytes']:.1f}x; "
                   f"KV capacity ratio: {a['kv_pool_tokens'] / max(1, b['kv_pool_tokens']):.2f}x")
