"""`dllm-bench server`: the engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn),
the way vLLM serves a model (dllm_bench.server.startup.start over its ServerOptions, docs/SERVER.md)."""
from __future__ import annotations

import typer

from dllm_bench.commands import budget_flag
from dllm_bench.commands import serve_flags as f
from dllm_bench.serve.presets import DEFAULT_PRESET, GPU_PRESET, PRESETS
from dllm_bench.server.options import DEFAULT_MAX_WAITING, ServerOptions
from dllm_bench.server.startup import start
from engine.decoding import FIXED


def register(app: typer.Typer) -> None:

    @app.command("server")
    def server_cmd(
        model: str | None = typer.Option(None, "--model", help="model preset or LLaDA checkpoint dir [preset]"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset for the engine defaults: {', '.join(PRESETS)} (default {DEFAULT_PRESET}, or the one for --model; a checkpoint dir on CUDA: {GPU_PRESET})"),
        served_model_name: str | None = typer.Option(None, "--served-model-name", help="the model name clients send (default: --model)"),
        host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
        port: int = typer.Option(8000, "--port", help="TCP port"),
        cache: str | None = typer.Option(None, "--cache", help="KV cache policy: none | dual | sparse | auto [auto]"),
        selection: str | None = typer.Option(None, "--selection", help="sparse selection: head | uniform"),
        retention: float | None = typer.Option(None, "--retention", help="sparse KV retention [preset]"),
        scheduler: str | None = typer.Option(None, "--scheduler", help="phase | request | lookahead"),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens", help="token budget per step [preset]"),
        max_num_logits: str | None = typer.Option(None, "--max-num-logits", help="logit budget (rows per step), or none [preset]"),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="max concurrent requests [preset]"),
        memory_budget: budget_flag.Server = None,
        dtype: f.Dtype = None,
        device: f.Device = None,
        cuda_graphs: f.CudaGraphs = None,
        decoding: str = typer.Option(FIXED, "--decoding", help="the policy of a request that names no threshold, "
                                     "factor or entropy: fixed (the steps' schedule) | threshold:τ | factor:f | entropy:γ"),
        tensor_parallel_size: f.TensorParallelSize = None,
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
        start(ServerOptions.pick(locals()))
