"""`dllm-bench server`: the engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn),
the way vLLM serves a model (docs/SERVER.md).

Engine knobs default to the serve preset of the model (`serve --model tiny` and
`server --model tiny` build the same engine), so a served engine and an in-process one compare
like for like; a checkpoint directory on a CUDA machine takes the GPU preset's (bfloat16,
budget auto). Everything is checked, and the engine built and warmed up, before the port is
opened. With `--api-key` (or $DLLM_BENCH_API_KEY) every /v1 route wants the key
(dllm_bench.server.auth); a server reachable beyond loopback without one is warned about.
"""
from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import typer

from dllm_bench import inputs
from dllm_bench.checkpoints.load import load_config, load_tokenizer
from dllm_bench.device_defaults import MemoryBudget, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.serve.presets import DEFAULT_PRESET, GPU_PRESET, PRESETS, ServePreset, preset_for
from dllm_bench.serve.workload import model_info
from dllm_bench.systems.build import build_system, warm_up
from dllm_bench.systems.spec import SystemVariant, parse_system
from dllm_bench.units import format_size
from engine.config import DTYPES

DEFAULT_MAX_WAITING = 256


def _check_port(host: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be in [0, 65535], got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"--host {host!r}: {e}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


@dataclass
class ServerOptions:
    """The server's options resolved: what build_state builds."""

    preset: ServePreset
    variant: SystemVariant
    model_dir: Path
    device: str
    dtype: str
    budget: MemoryBudget
    threads: int
    block_length: int


def resolve_server_options(*, model: str | None, preset: str | None, knobs: dict, memory_budget: str | None,
                           dtype: str | None, device: str | None, threads: int | None = None,
                           block_length: int | None = None, max_waiting: int = DEFAULT_MAX_WAITING) -> ServerOptions:
    """Every option checked, before a weight is loaded: a budget that cannot hold the weights is
    refused here, not after loading them (LLaDA-8B in float32: 32 GB) and profiling for minutes."""
    sp = preset_for(preset, model, device=device or "auto")
    for name, v in (("--threads", threads), ("--block-length", block_length), ("--max-waiting", max_waiting)):
        if v is not None and v < 1:
            raise UserError(f"{name} must be >= 1, got {v}")
    given = {k: v for k, v in knobs.items() if v is not None}
    # Through the --systems grammar: the same value parsers, checks and canonical label.
    variant = parse_system("engine" + (":" + ",".join(f"{k}={v}" for k, v in given.items()) if given else ""))
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    device = inputs.device(device or sp.device)
    dtype = dtype or sp.dtype_on(device)
    model_dir = inputs.checkpoint_dir(sp.model)
    budget = resolve_budget(sp.memory_budget if memory_budget is None else memory_budget, device)
    weights = model_info(model_dir, dtype)["weights_bytes"]
    if budget.bytes is not None and budget.bytes <= weights:
        raise UserError(f"--memory-budget {format_size(budget.bytes)} does not even hold the weights "
                        f"({format_size(weights)} in {dtype})")
    return ServerOptions(sp, variant, model_dir, device, dtype, budget, threads or sp.threads,
                         block_length or sp.block_length)


def build_state(*, model: str | None, preset: str | None, served_model_name: str | None,
                knobs: dict, memory_budget: str | None, dtype: str | None, device: str | None,
                threads: int | None, block_length: int | None, max_waiting: int, sampling: bool,
                use_cache: bool, log=lambda m: None, api_key: str | None = None):
    """The engine (KV pool profiled for the budget, warmed up) in an EngineLoop, and the
    ServerState the app serves; any bad option is a UserError."""
    import torch

    from dllm_bench.server.app import ServerState
    from dllm_bench.server.engine_loop import EngineLoop

    opts = resolve_server_options(model=model, preset=preset, knobs=knobs, memory_budget=memory_budget,
                                  dtype=dtype, device=device, threads=threads, block_length=block_length,
                                  max_waiting=max_waiting)
    sp, model_dir = opts.preset, opts.model_dir
    torch.set_num_threads(opts.threads)
    cfg = load_config(model_dir)
    tokenizer = load_tokenizer(model_dir)
    log(f"{opts.dtype} on {opts.device}, memory budget {opts.budget.detail}")
    built = build_system(opts.variant, model_dir=model_dir, dtype=opts.dtype, device=opts.device,
                         memory_budget=opts.budget.bytes, engine_defaults=sp.engine_defaults(),
                         max_model_len=sp.max_model_len, use_cache=use_cache, sampling=sampling, log=log)
    engine = built.system
    block = opts.block_length
    log("warming up")
    warm_up(engine, [t for t in range(1, 9) if t != cfg.mask_token_id], block)
    state = ServerState(loop=EngineLoop(engine), tokenizer=tokenizer, model_name=served_model_name or sp.model,
                        model_root=str(model_dir), max_model_len=engine.max_model_len, block_length=block,
                        eos_token_id=cfg.eos_token_id, max_waiting=max_waiting, api_key=api_key)
    return state, built.info


def register(app: typer.Typer) -> None:

    @app.command("server")
    def server_cmd(
        model: str | None = typer.Option(None, "--model", help="model preset or LLaDA checkpoint dir [preset]"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset for the engine defaults: {', '.join(PRESETS)} (default {DEFAULT_PRESET}, or the one for --model; a checkpoint dir on CUDA: {GPU_PRESET})"),
        served_model_name: str | None = typer.Option(None, "--served-model-name", help="the model name clients send (default: --model)"),
        host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
        port: int = typer.Option(8000, "--port", help="TCP port"),
        cache: str | None = typer.Option(None, "--cache", help="KV cache policy: none | dual | sparse [sparse]"),
        selection: str | None = typer.Option(None, "--selection", help="sparse selection: head | uniform"),
        retention: float | None = typer.Option(None, "--retention", help="sparse KV retention [preset]"),
        scheduler: str | None = typer.Option(None, "--scheduler", help="phase | request"),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens", help="token budget per step [preset]"),
        max_num_logits: str | None = typer.Option(None, "--max-num-logits", help="logit budget (rows per step), or none [preset]"),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="max concurrent requests [preset]"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV (1GiB, ...); auto = free GPU memory x 0.9 "
                                                 "at start (on CPU: no budget); none = no budget [preset, else auto]"),
        dtype: str | None = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 | float64 [preset; a CPU preset on CUDA: bfloat16]"),
        device: str | None = typer.Option(None, "--device", help="cpu | cuda [preset]"),
        threads: int | None = typer.Option(None, "--threads", help="torch threads [preset]"),
        block_length: int | None = typer.Option(None, "--block-length", help="block length of requests that give none [preset]"),
        max_waiting: int = typer.Option(DEFAULT_MAX_WAITING, "--max-waiting", help="answer 503 + Retry-After once this many requests wait"),
        sampling: bool = typer.Option(True, "--sampling/--no-sampling", help="allow temperature > 0 (--no-sampling: greedy only, a larger KV pool)"),
        no_profile_cache: bool = typer.Option(False, "--no-profile-cache", help="re-measure the KV pool"),
        log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level"),
        api_key: str | None = typer.Option(None, "--api-key", help="every /v1 route then wants `Authorization: Bearer KEY` "
                                           "(401 otherwise; /health and /metrics stay open) [$DLLM_BENCH_API_KEY]"),
    ) -> None:
        """OpenAI-compatible HTTP server for the engine: /v1/completions, /v1/chat/completions (block streaming), /v1/models, /health, /metrics."""
        import uvicorn
        from rich.console import Console

        from dllm_bench.server.app import create_app
        from dllm_bench.server.auth import exposure_warning, resolve_api_key

        if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
            raise UserError(f"--log-level must be critical, error, warning, info, debug or trace, got {log_level!r}")
        _check_port(host, port)
        api_key = resolve_api_key(api_key)
        console = Console(stderr=True)
        knobs = {"cache": cache, "selection": selection, "retention": retention, "scheduler": scheduler,
                 "max_num_batched_tokens": max_num_batched_tokens, "max_num_logits": max_num_logits,
                 "max_num_seqs": max_num_seqs}
        state, info = build_state(
            model=model, preset=preset, served_model_name=served_model_name, knobs=knobs,
            memory_budget=memory_budget, dtype=dtype, device=device, threads=threads,
            block_length=block_length, max_waiting=max_waiting, sampling=sampling,
            use_cache=not no_profile_cache, log=lambda m: console.print(m, style="dim", highlight=False),
            api_key=api_key)
        pool = info.get("kv_pool_tokens")
        console.print(f"serving {state.model_name} ({info['label']}, KV pool "
                      f"{'unbounded' if pool is None else f'{pool} tokens'}) on http://{host}:{port}/v1",
                      markup=False, highlight=False)
        warning = exposure_warning(host, api_key)
        if warning:
            console.print(warning, style="yellow", markup=False, highlight=False)
        sys.stderr.flush()
        uvicorn.run(create_app(state), host=host, port=port, log_level=log_level)
