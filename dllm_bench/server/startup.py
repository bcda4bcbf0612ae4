"""`dllm-bench server` started: every option checked, the engine built (KV pool profiled for the
budget) and warmed up, then uvicorn on the port (docs/SERVER.md).

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
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dllm_bench import inputs
from dllm_bench.checkpoints.load import load_config, load_tokenizer
from dllm_bench.device_defaults import MemoryBudget, cuda_graphs_on, gpu_name, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.ridge import device_ridge
from dllm_bench.serve.presets import ServePreset, preset_for
from dllm_bench.serve.workload import model_info
from dllm_bench.systems import decoding as system_decoding
from dllm_bench.systems.build import build_system, warm_up
from dllm_bench.systems.spec import SystemVariant, make_variant
from dllm_bench.units import format_size
from engine.config import DTYPES

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

DEFAULT_MAX_WAITING = 256


def open_listener(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the engine is built (a taken port fails in seconds, not
    after minutes of loading) and kept, so `--port 0` serves on the port it printed."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be in [0, 65535], got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"--host {host!r}: {e}") from None
    family, _, _, _, addr = infos[0]
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(addr)
    except OSError as e:
        s.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return s


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
                           block_length: int | None = None, max_waiting: int = DEFAULT_MAX_WAITING,
                           cuda_graphs: bool | None = None) -> ServerOptions:
    """Every option checked, before a weight is loaded: a budget that cannot hold the weights is
    refused here, not after loading them (LLaDA-8B in float32: 32 GB) and profiling for minutes.
    The engine's CUDA graphs (`cuda_graphs`, None: on for CUDA) are resolved into the preset."""
    sp = preset_for(preset, model, device=device or "auto")
    for name, v in (("--threads", threads), ("--block-length", block_length), ("--max-waiting", max_waiting)):
        if v is not None and v < 1:
            raise UserError(f"{name} must be >= 1, got {v}")
    given = {k: v for k, v in knobs.items() if v is not None}
    # The --systems knobs' own parsers, checks and canonical label, one value per flag.
    variant = make_variant("engine", given.items())
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    device = inputs.device(device or sp.device)
    dtype = dtype or sp.dtype_on(device)
    sp = replace(sp, cuda_graphs=cuda_graphs_on(cuda_graphs, device))
    model_dir = inputs.checkpoint_dir(sp.model)
    budget = resolve_budget(sp.memory_budget if memory_budget is None else memory_budget, device)
    info = model_info(model_dir, dtype)
    weights = info["weights_bytes"]
    if budget.bytes is not None and budget.bytes <= weights:
        raise UserError(f"--memory-budget {format_size(budget.bytes)} does not even hold the weights "
                        f"({format_size(weights)} in {dtype})")
    block = block_length or sp.block_length
    if sp.auto_budgets:     # scaled with the GPU (dllm_bench.step_budgets); a request may be a whole canvas
        gpu = gpu_name(device)
        scale = budget.bytes if budget.bytes is not None or gpu is None else resolve_budget("auto", device).bytes
        sp = replace(sp, dtype=dtype, block_length=block).with_step_budgets(
            info, sp.max_model_len or info["max_sequence_length"], gpu, scale)
    sp = sp.with_ridge(device_ridge(device, DTYPES[dtype]))     # what cache=auto weighs (dllm_bench.ridge)
    return ServerOptions(sp, variant, model_dir, device, dtype, budget, threads or sp.threads, block)


def build_state(*, model: str | None, preset: str | None, served_model_name: str | None,
                knobs: dict, memory_budget: str | None, dtype: str | None, device: str | None,
                threads: int | None, block_length: int | None, max_waiting: int, sampling: bool,
                use_cache: bool, log=lambda m: None, api_key: str | None = None, cuda_graphs: bool | None = None,
                decoding: str = "fixed"):
    """The engine (KV pool profiled for the budget, warmed up) in an EngineLoop, and the
    ServerState the app serves; any bad option is a UserError."""
    # FastAPI (the app's) loads only when a server is built, not with every command.
    from dllm_bench.server.app import ServerState
    from dllm_bench.server.engine_loop import EngineLoop

    decoding = str(system_decoding.parse(decoding))
    opts = resolve_server_options(model=model, preset=preset, knobs=knobs, memory_budget=memory_budget,
                                  dtype=dtype, device=device, threads=threads, block_length=block_length,
                                  max_waiting=max_waiting, cuda_graphs=cuda_graphs)
    sp, model_dir = opts.preset, opts.model_dir
    torch.set_num_threads(opts.threads)
    cfg = load_config(model_dir)
    tokenizer = load_tokenizer(model_dir)
    log(f"{opts.dtype} on {opts.device}, memory budget {opts.budget.detail}, "
        f"CUDA graphs {'on' if sp.cuda_graphs else 'off'}")
    if sp.tokens_rule or sp.logits_rule:
        log(f"token budget {sp.max_num_batched_tokens} ({sp.tokens_rule}), logit budget "
            f"{sp.max_num_logits} ({sp.logits_rule})")
    log(f"ridge {sp.ridge_rows} rows ({sp.ridge_rule})")
    built = build_system(opts.variant, model_dir=model_dir, dtype=opts.dtype, device=opts.device,
                         memory_budget=opts.budget.bytes, engine_defaults=sp.engine_defaults(),
                         max_model_len=sp.max_model_len, use_cache=use_cache, sampling=sampling, log=log)
    engine = built.system
    if "attention" in built.info:
        log(built.info["attention"])
    block = opts.block_length
    log("warming up")
    warm_up(engine, [t for t in range(1, 9) if t != cfg.mask_token_id], block)
    state = ServerState(loop=EngineLoop(engine), tokenizer=tokenizer, model_name=served_model_name or sp.model,
                        model_root=str(model_dir), max_model_len=engine.max_model_len, block_length=block,
                        eos_token_id=cfg.eos_token_id, max_waiting=max_waiting, api_key=api_key, decoding=decoding)
    return state, built.info


def start(*, host: str, port: int, log_level: str, api_key: str | None, model: str | None, preset: str | None,
          served_model_name: str | None, knobs: dict, memory_budget: str | None, dtype: str | None,
          device: str | None, threads: int | None, block_length: int | None, max_waiting: int, sampling: bool,
          use_cache: bool, cuda_graphs: bool | None = None, decoding: str = "fixed") -> None:
    """Check the port and every option, build and warm up the engine, then serve until stopped."""
    # uvicorn, FastAPI and the app load only when a server starts, not with every command.
    import uvicorn
    from rich.console import Console

    from dllm_bench.server.app import create_app
    from dllm_bench.server.auth import exposure_warning, resolve_api_key

    if log_level not in LOG_LEVELS:
        raise UserError(f"--log-level must be {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}, got {log_level!r}")
    sock = open_listener(host, port)
    port = sock.getsockname()[1]
    api_key = resolve_api_key(api_key)
    console = Console(stderr=True)
    state, info = build_state(
        model=model, preset=preset, served_model_name=served_model_name, knobs=knobs,
        memory_budget=memory_budget, dtype=dtype, device=device, threads=threads,
        block_length=block_length, max_waiting=max_waiting, sampling=sampling,
        use_cache=use_cache, log=lambda m: console.print(m, style="dim", highlight=False),
        api_key=api_key, cuda_graphs=cuda_graphs, decoding=decoding)
    pool = info.get("kv_pool_tokens")
    console.print(f"serving {state.model_name} ({info['label']}, KV pool "
                  f"{'unbounded' if pool is None else f'{pool} tokens'}) on http://{host}:{port}/v1",
                  markup=False, highlight=False)
    warning = exposure_warning(host, api_key)
    if warning:
        console.print(warning, style="yellow", markup=False, highlight=False)
    sys.stderr.flush()
    uvicorn.Server(uvicorn.Config(create_app(state), log_level=log_level)).run(sockets=[sock])
