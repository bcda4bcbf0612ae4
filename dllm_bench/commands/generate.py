"""`dllm-bench generate`: decode prompts with the engine or a baseline; several prompts run
concurrently. `--json` prints one JSON document on stdout; progress goes to stderr."""
from __future__ import annotations

import dataclasses
import json
import time

import torch
import typer

from baselines import SYSTEMS
from dllm_bench import console, inputs
from dllm_bench.checkpoints.load import encode_prompt, load_model, load_tokenizer, parse_ids
from dllm_bench.commands.serve_flags import CudaGraphs
from dllm_bench.device_defaults import cuda_graphs_on, resolve_device_options
from dllm_bench.errors import UserError
from dllm_bench.step_budgets import AUTO, engine_budgets
from dllm_bench.systems import decoding as system_decoding
from dllm_bench.systems.build import make_parallel_engine, make_system
from engine import EngineConfig, SamplingParams

SYSTEM_NAMES = ("engine", "llada", "fast-dllm", "dllm-cache", "sparse-dllm")


def build_params(gen_length, steps, block_length, temperature, remasking, seed, decoding="fixed") -> SamplingParams:
    try:
        return SamplingParams(gen_length=gen_length, steps=steps, block_length=block_length,
                              temperature=temperature, remasking=remasking, seed=seed, decoding=decoding)
    except ValueError as e:
        raise UserError(str(e)) from None


def baseline_knobs(system: str, **given) -> dict:
    """Only the knobs the user set that this baseline has (others are its upstream defaults)."""
    known = SYSTEMS[system].knobs
    extra = {k: v for k, v in given.items() if v is not None and k not in known}
    if extra:
        raise UserError(f"--{next(iter(extra)).replace('_', '-')} does not apply to system {system!r}")
    return {k: v for k, v in given.items() if v is not None}


def run_all(system, prompts: list[list[int]], params: SamplingParams, show_progress: bool):
    """Every prompt through the system at once (continuous batching in the engine)."""
    with console.progress(enabled=show_progress) as progress:
        task = progress.add_task("generate", total=len(prompts))
        try:
            return system.generate(prompts, params, lambda done, _total: progress.update(task, completed=done))
        except ValueError as e:  # a request the system can never run (e.g. longer than the model)
            raise UserError(str(e)) from None


def register(app: typer.Typer) -> None:
    @app.command()
    def generate(
        model: str = typer.Option("tiny", "--model", "-m", help="Preset name or HF LLaDA checkpoint directory."),
        prompt: list[str] | None = typer.Option(None, "--prompt", "-p", help="Prompt text (repeatable)."),
        prompt_ids: list[str] | None = typer.Option(None, "--prompt-ids", help="Prompt as comma-separated token ids (repeatable)."),
        gen_length: int = typer.Option(64, help="Tokens to generate (a multiple of --block-length)."),
        block_length: int = typer.Option(32, help="Semi-autoregressive block length."),
        steps: int | None = typer.Option(None, help="Denoising steps in total (default: gen-length, one token per step)."),
        temperature: float = typer.Option(0.0, help="Gumbel-max temperature (0 = greedy)."),
        remasking: str = typer.Option("low_confidence", help="low_confidence | random"),
        seed: int = typer.Option(0, help="Per-request seed (noise, random remasking)."),
        decoding: str = typer.Option("fixed", help="fixed | threshold:τ | factor:f | entropy:γ: tokens committed per "
                                     "step (engine: every policy; fast-dllm: threshold, factor)."),
        dtype: str | None = typer.Option(None, help="float64 | float32 | bfloat16 (default: bfloat16 on CUDA, float32 on CPU)"),
        device: str = typer.Option("auto", help="auto | cpu | cuda"),
        system: str = typer.Option("engine", help="engine | llada | fast-dllm | dllm-cache | sparse-dllm"),
        cache: str = typer.Option("none", help="Engine cache policy: none (exact LLaDA) | dual | sparse | auto "
                                  "(dual per request while the KV pool holds it, else sparse)."),
        retention: float = typer.Option(0.5, help="Engine sparse cache: fraction of context kept per head."),
        selection: str = typer.Option("head", help="Engine sparse cache: head | uniform."),
        max_num_logits: int | None = typer.Option(None, help="Engine logit budget (rows per chunk) [CPU: 1024; "
                                                  "CUDA: scaled with the GPU, max_num_seqs x block]."),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens",
                                                          help="Engine token budget (query tokens per step) [CPU: "
                                                               "8192; CUDA: scaled with the GPU and the model]."),
        no_logit_budget: bool = typer.Option(False, "--no-logit-budget", help="Engine: monolithic full-sequence logits."),
        scheduler: str = typer.Option("phase", help="Engine scheduler: phase | request | lookahead."),
        cuda_graphs: CudaGraphs = None,
        batch: int = typer.Option(8, help="Baselines: static batch size."),
        threshold: float | None = typer.Option(None, help="fast-dllm: parallel-decoding confidence threshold."),
        fast_dllm_cache: str | None = typer.Option(None, help="fast-dllm: dual | prefix."),
        prompt_interval: int | None = typer.Option(None, help="dllm-cache: prompt refresh interval."),
        gen_interval: int | None = typer.Option(None, help="dllm-cache: generation refresh interval."),
        transfer_ratio: float | None = typer.Option(None, help="dllm-cache: adaptive update ratio."),
        keep_ratio: float | None = typer.Option(None, help="sparse-dllm: KV keep ratio."),
        kernel_size: int | None = typer.Option(None, help="sparse-dllm: max-pool kernel (odd)."),
        chat: bool = typer.Option(True, "--chat/--no-chat", help="Apply the tokenizer's chat template to text prompts."),
        threads: int | None = typer.Option(None, help="torch threads (CPU; with --tensor-parallel-size: per rank, default 1)."),
        tensor_parallel_size: int = typer.Option(
            1, "--tensor-parallel-size", "--tp",
            help="Engine: ranks of one engine (heads, MLP, vocabulary split): N GPUs (NCCL), or on a CPU N processes "
                 "x --threads (gloo); workers spawned here, or launch with torchrun (docs/PARALLEL.md)."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    ) -> None:
        """Generate with the engine (continuous batching) or a baseline system."""
        if system not in SYSTEM_NAMES:
            raise UserError(f"--system must be one of {', '.join(SYSTEM_NAMES)}, got {system!r}")
        if threads is not None:
            if threads <= 0:
                raise UserError("--threads must be positive")
            torch.set_num_threads(threads)
        if tensor_parallel_size < 1:
            raise UserError("--tensor-parallel-size must be >= 1")
        if tensor_parallel_size > 1 and system != "engine":
            raise UserError(f"--tensor-parallel-size applies to the engine only, not to system {system!r}")
        if not prompt and not prompt_ids:
            raise UserError("give at least one --prompt or --prompt-ids")
        if batch <= 0:
            raise UserError("--batch must be positive")
        dec = system_decoding.require(system, system_decoding.parse(decoding))
        if dec.knobs and (threshold is not None):
            raise UserError("give the parallel-decoding rule once: --decoding or --threshold")
        params = build_params(gen_length, gen_length if steps is None else steps, block_length, temperature, remasking,
                              seed, dec.decoding)
        opts = resolve_device_options(device, dtype)
        dtype, device = opts.dtype, str(opts.device)
        if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
            raise UserError(f"--max-num-batched-tokens must be >= 1, got {max_num_batched_tokens}")
        given_logits = None if no_logit_budget else (AUTO if max_num_logits is None else max_num_logits)
        try:
            engine_cfg = EngineConfig(cache=cache, retention=retention, selection=selection, dtype=dtype,
                                      max_num_logits=1024 if given_logits == AUTO else given_logits,
                                      max_num_batched_tokens=max_num_batched_tokens or EngineConfig.max_num_batched_tokens,
                                      scheduler=scheduler, device=device,
                                      cuda_graphs=cuda_graphs_on(cuda_graphs, device))
        except ValueError as e:
            raise UserError(str(e)) from None
        given = dict(threshold=threshold, fast_dllm_cache=fast_dllm_cache, prompt_interval=prompt_interval,
                     gen_interval=gen_interval, transfer_ratio=transfer_ratio, keep_ratio=keep_ratio,
                     kernel_size=kernel_size)
        if system == "engine":
            extra = [k for k, v in given.items() if v is not None]
            if extra:
                raise UserError(f"--{extra[0].replace('_', '-')} does not apply to system 'engine'")
            knobs = {}
        else:
            knobs = {**baseline_knobs(system, **given), **dec.knobs}
        path = inputs.checkpoint_dir(model, tokenizer=bool(prompt), why="give prompts with --prompt-ids")
        tok = load_tokenizer(path)
        prompts = [parse_ids(s) for s in (prompt_ids or [])]
        if prompt:
            for text in prompt:
                if not text.strip():
                    raise UserError("empty prompt")
                prompts.append(encode_prompt(tok, text, chat))
        if tensor_parallel_size > 1:
            sysobj = make_parallel_engine(
                dataclasses.replace(engine_cfg, model=str(path), tensor_parallel_size=tensor_parallel_size), threads)
        else:
            mdl, budgets = load_model(model, dtype, device), None
            if system == "engine":   # on CUDA the step budgets scale with the GPU unless given
                budgets = engine_budgets(mdl, tokens=max_num_batched_tokens, logits=given_logits,
                                         max_num_seqs=engine_cfg.max_num_seqs, block_length=block_length,
                                         longest_canvas=max(map(len, prompts)) + gen_length,
                                         cpu=(engine_cfg.max_num_batched_tokens, engine_cfg.max_num_logits))
                engine_cfg = dataclasses.replace(engine_cfg, max_num_batched_tokens=budgets.max_num_batched_tokens,
                                                 max_num_logits=budgets.max_num_logits)
            sysobj = make_system(system, mdl, engine_config=engine_cfg, batch=batch, knobs=knobs)
            if budgets is not None and budgets.tokens_rule and not json_out:
                console.console().print(budgets.describe(), style="dim", highlight=False)
        t0 = time.perf_counter()
        try:
            outs = run_all(sysobj, prompts, params, show_progress=not json_out)
            elapsed = time.perf_counter() - t0
            stats = sysobj.stats()
        finally:
            if tensor_parallel_size > 1:
                sysobj.close()
        if system == "engine":                      # the engine's attention backend and why, once
            console.console().print(sysobj.attention.line, markup=False, highlight=False)
        texts = [tok.decode(o.token_ids, skip_special_tokens=True) if tok is not None else None for o in outs]
        if json_out:
            doc = dict(
                outputs=[dict(tokens=o.token_ids, text=t, nfe=o.nfe, tpf=o.tokens_per_forward,
                              steps_per_block=o.steps_per_block, prompt_tokens=len(o.prompt_ids), cache=o.cache)
                         for o, t in zip(outs, texts)],
                model=str(path), system=system, dtype=dtype, elapsed_s=elapsed,
                cuda_graphs=engine_cfg.cuda_graphs if system == "engine" else None,
                step_budgets=dict(max_num_batched_tokens=engine_cfg.max_num_batched_tokens,
                                  max_num_logits=engine_cfg.max_num_logits) if system == "engine" else None,
                params=dict(gen_length=params.gen_length, steps=params.steps, block_length=params.block_length,
                            temperature=params.temperature, remasking=params.remasking, seed=params.seed,
                            decoding=params.decoding),
                tensor_parallel_size=tensor_parallel_size,
                stats={k: v for k, v in stats.items() if not isinstance(v, list)},
            )
            typer.echo(json.dumps(doc))
            return
        con = console.console(stderr=False)
        for i, (o, t) in enumerate(zip(outs, texts)):
            con.rule(f"output {i} · {len(o.prompt_ids)} prompt tokens · nfe {o.nfe} · {o.tokens_per_forward:.2f} tokens/forward")
            con.print(t if t is not None else o.token_ids, markup=False, highlight=False)
        n_tok = sum(len(o.token_ids) for o in outs)
        con.print(f"[dim]{system} · {len(outs)} request(s) · {n_tok} tokens in {elapsed:.2f}s "
                  f"({n_tok / max(elapsed, 1e-9):.1f} tok/s)[/dim]")
