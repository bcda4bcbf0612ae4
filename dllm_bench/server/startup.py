"""`dllm-bench server` started from its ServerOptions (dllm_bench.server.options): every option
checked, the engine built (KV pool profiled for the budget) and warmed up, then uvicorn on the
port (docs/SERVER.md).

Everything is checked, and the engine built and warmed up, before the port is served (it is
bound first: a taken port fails in seconds). With `--api-key` (or $DLLM_BENCH_API_KEY) every /v1
route wants the key (dllm_bench.server.auth); a server reachable beyond loopback without one is
warned about.
"""
from __future__ import annotations

import socket
import sys
from dataclasses import replace

from dllm_bench.checkpoints.load import load_config, load_tokenizer
from dllm_bench.errors import UserError
from dllm_bench.server.options import ServerOptions, resolve_server_options
from dllm_bench.systems.build import build_system, warm_up

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


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


def build_state(o: ServerOptions, log=lambda m: None):
    """The engine (KV pool profiled for the budget, warmed up) in an EngineLoop, and the
    ServerState the app serves; any bad option is a UserError."""
    # FastAPI (the app's) loads only when a server is built, not with every command.
    from dllm_bench.server.app import ServerState
    from dllm_bench.server.engine_loop import EngineLoop

    setup = resolve_server_options(o)
    sp, model_dir, run = setup.preset, setup.model_dir, setup.run
    run.apply_threads()
    cfg = load_config(model_dir)
    tokenizer = load_tokenizer(model_dir)
    log(f"{run.dtype} on {setup.device}, memory budget {run.budget.detail}, "
        f"CUDA graphs {'on' if sp.cuda_graphs else 'off'}")
    if sp.tokens_rule or sp.logits_rule:
        log(f"token budget {sp.max_num_batched_tokens} ({sp.tokens_rule}), logit budget "
            f"{sp.max_num_logits} ({sp.logits_rule})")
    log(f"ridge {sp.ridge_rows} rows ({sp.ridge_rule})")
    built = build_system(setup.variant, model_dir=model_dir, dtype=run.dtype, device=setup.device,
                         memory_budget=run.budget.bytes, engine_defaults=sp.engine_defaults(),
                         max_model_len=sp.max_model_len, use_cache=not o.no_profile_cache, sampling=o.sampling,
                         log=log)
    engine = built.system
    if "attention" in built.info:
        log(built.info["attention"])
    block = setup.block_length
    log("warming up")
    warm_up(engine, [t for t in range(1, 9) if t != cfg.mask_token_id], block)
    state = ServerState(loop=EngineLoop(engine), tokenizer=tokenizer, model_name=o.served_model_name or sp.model,
                        model_root=str(model_dir), max_model_len=engine.max_model_len, block_length=block,
                        eos_token_id=cfg.eos_token_id, max_waiting=o.max_waiting, api_key=o.api_key,
                        decoding=run.decoding)
    return state, built.info


def start(o: ServerOptions) -> None:
    """Check the port and every option, build and warm up the engine, then serve until stopped."""
    # uvicorn, FastAPI and the app load only when a server starts, not with every command.
    import uvicorn
    from rich.console import Console

    from dllm_bench.server.app import create_app
    from dllm_bench.server.auth import exposure_warning, resolve_api_key

    if o.log_level not in LOG_LEVELS:
        raise UserError(f"--log-level must be {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}, got {o.log_level!r}")
    sock = open_listener(o.host, o.port)
    port = sock.getsockname()[1]
    o = replace(o, api_key=resolve_api_key(o.api_key))
    console = Console(stderr=True)
    state, info = build_state(o, log=lambda m: console.print(m, style="dim", highlight=False))
    pool = info.get("kv_pool_tokens")
    console.print(f"serving {state.model_name} ({info['label']}, KV pool "
                  f"{'unbounded' if pool is None else f'{pool} tokens'}) on http://{o.host}:{port}/v1",
                  markup=False, highlight=False)
    warning = exposure_warning(o.host, o.api_key)
    if warning:
        console.print(warning, style="yellow", markup=False, highlight=False)
    sys.stderr.flush()
    uvicorn.Server(uvicorn.Config(create_app(state), log_level=o.log_level)).run(sockets=[sock])
