"""`dllm-bench serve`: open-loop serving benchmark of the engine against the baselines, like
`vllm bench serve` (docs/SERVE.md).

The options are resolved into a ServeRun (dllm_bench.serve.options.resolve_run); the workload is
built once per (dataset, rps) from the seed, and every system then replays exactly that arrival
sequence against exactly the same memory budget, one system after another, each in a fresh
worker process (dllm_bench.serve.run.serve, dllm_bench.serve.points.measure_points).
"""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from dllm_bench import inputs
from dllm_bench.serve.endpoint import resolve_endpoint
from dllm_bench.serve.options import resolve_run
from dllm_bench.serve.presets import DEFAULT_PRESET, GPU_PRESET, PRESETS
from dllm_bench.serve.run import serve


# ---------------------------------------------------------------- the command
def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        rps: str | None = typer.Option(None, "--rps", "--request-rate",
                                       help="arrival rate(s), req/s: 0.5, or a sweep 0.1,0.25,0.5,1.0; inf = all at t=0 [preset: 0.5]"),
        systems: str | None = typer.Option(None, "--systems",
                                           help="systems and variants: engine,fast-dllm,dllm-cache,sparse-dllm (default), "
                                                "llada; variants name[:k=v,...] e.g. 'engine:cache=dual,fast-dllm:batch=1' "
                                                "(batch=upstream: the batch its upstream code runs)"),
        baseline_batch: str = typer.Option("max-fit", "--baseline-batch",
                                           help="baselines without batch=: max-fit (largest static batch in the budget), "
                                                "upstream (the batch their upstream code runs: Fast-dLLM 1, Sparse-dLLM 1, "
                                                "dLLM-Cache 2), or both side by side"),
        dataset: str | None = typer.Option(None, "--dataset", "--dataset-name",
                                           help="livebench | osc | burstgpt | random, or a list livebench,osc,burstgpt"),
        dataset_path: Path | None = typer.Option(None, "--dataset-path", help="replay a BurstGPT CSV or a JSONL file"),
        num_prompts: int | None = typer.Option(None, "--num-prompts", help="requests per point [preset]"),
        duration: float | None = typer.Option(None, "--duration", help="bound arrivals by time (s) instead of count"),
        burstiness: float = typer.Option(1.0, "--burstiness", help="gamma shape: 1 = Poisson, < 1 burstier"),
        arrivals: str | None = typer.Option(None, "--arrivals", help="poisson | gamma | trace (default: poisson, gamma if --burstiness != 1)"),
        time_scale: float = typer.Option(1.0, "--time-scale", help="trace replay speed-up (60 = a minute per second)"),
        burstgpt_model: str | None = typer.Option(None, "--burstgpt-model", help="BurstGPT CSV rows of one model: ChatGPT | GPT-4"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV of every system, e.g. 1GiB, 512MiB, 2.5GB; auto = free GPU "
                                                 "memory x 0.9 measured once at the start (CUDA only: a CPU run needs a size) [preset, else auto]"),
        model: str | None = typer.Option(None, "--model", help="model preset (dllm-bench models list) or LLaDA checkpoint dir [preset]"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET}, or the one for --model; "
                                                  f"a checkpoint dir on CUDA: {GPU_PRESET})"),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens", help="engine token budget per step"),
        max_num_logits: str | None = typer.Option(None, "--max-num-logits", help="engine logit budget (rows per step), or none"),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="engine max concurrent requests"),
        retention: float | None = typer.Option(None, "--retention", help="sparse KV retention (engine and sparse-dllm keep_ratio)"),
        length_scale: float | None = typer.Option(None, "--length-scale", help="multiply dataset token counts (CPU runs: 0.125)"),
        gen_cap: int | None = typer.Option(None, "--gen-cap", help="max gen_length in tokens"),
        gen_length: int | None = typer.Option(None, "--gen-length", help="one output length for every request (the paper's 256), a block multiple [preset]"),
        block_length: int | None = typer.Option(None, "--block-length", help="diffusion block length"),
        max_prompt_len: int | None = typer.Option(None, "--max-prompt-len", help="cut prompts to this many tokens"),
        threads: int | None = typer.Option(None, "--threads", help="torch threads of every system process [preset]"),
        dtype: str | None = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 | float64 [preset; a CPU preset on CUDA: bfloat16]"),
        device: str | None = typer.Option(None, "--device", help="cpu | cuda [preset]"),
        seed: int = typer.Option(0, "--seed", help="workload seed (arrivals, lengths, prompt ids)"),
        repeats: int = typer.Option(1, "--repeats", help="run every point N times with workload seeds seed, seed+1, ...; tables give median [min-max]"),
        max_duration: float | None = typer.Option(None, "--max-duration", help="abort a point after this many seconds (unfinished requests are counted)"),
        num_warmups: int = typer.Option(1, "--num-warmups", help="unmeasured warm-up requests per system"),
        result_dir: Path | None = typer.Option(None, "--result-dir", help="runs root (default results/runs, or $DLLM_BENCH_RESULTS_DIR)"),
        run_id: str | None = typer.Option(None, "--run-id", help="name of the run directory (default: timestamp-name)"),
        resume: bool = typer.Option(False, "--resume", help="continue a run (--run-id, default the latest): skip finished points"),
        no_profile_cache: bool = typer.Option(False, "--no-profile-cache", help="re-measure KV pools and static batches"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document (summaries, ratios, run dir) on stdout"),
        endpoint: str | None = typer.Option(None, "--endpoint", help="also (without --systems: only) benchmark this OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1"),
        endpoint_model: str | None = typer.Option(None, "--endpoint-model", help="model name sent to --endpoint (default: its first model)"),
        api: str = typer.Option("completions", "--api", help="--endpoint API: completions (token-id prompts) | chat (text)"),
        stream: bool = typer.Option(True, "--stream/--no-stream", help="--endpoint: streamed responses (TTFT = first block)"),
        dllm_extras: bool = typer.Option(True, "--dllm-extras/--no-dllm-extras", help="--endpoint: send block_length, steps, return_token_ids"),
    ) -> None:
        """Open-loop serving benchmark: every system replays the same arrivals under the same memory budget."""
        ep = None
        if endpoint is not None:

            ep, model = resolve_endpoint(endpoint, endpoint_model, api, stream, dllm_extras, model)
        result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
        run = resolve_run(
            rps=rps, systems=systems, dataset=dataset, dataset_path=dataset_path, num_prompts=num_prompts,
            duration=duration, burstiness=burstiness, arrivals=arrivals, time_scale=time_scale,
            burstgpt_model=burstgpt_model, memory_budget=memory_budget, model=model, preset=preset,
            max_num_batched_tokens=max_num_batched_tokens, max_num_logits=max_num_logits,
            max_num_seqs=max_num_seqs, retention=retention, length_scale=length_scale, gen_cap=gen_cap,
            block_length=block_length, max_prompt_len=max_prompt_len, threads=threads, dtype=dtype,
            device=device, seed=seed, max_duration=max_duration, num_warmups=num_warmups,
            no_profile_cache=no_profile_cache, gen_length=gen_length, repeats=repeats, baseline_batch=baseline_batch)
        if ep is not None:
            run.systems = (run.systems if systems is not None else []) + [ep.variant()]
        code = serve(run, result_dir=result_dir, run_id=run_id, resume=resume, as_json=as_json)
        if code:
            sys.exit(code)  # not typer.Exit: with standalone_mode=False click returns its code unused
