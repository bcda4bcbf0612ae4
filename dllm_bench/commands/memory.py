"""`dllm-bench memory`: per system, the longest canvas (prompt + generation) that runs within a
memory budget, found by measurement, and the memory over one request's steps (peak, average,
peak-to-average, split into weights, KV, logits, FFN and attention), with a plot; `--derive`
carries the measured bytes to LLaDA-8B's shape (dllm_bench.memory_bench, docs/MEMORY.md).

A command of its own, not a mode of `profile`: `profile` sizes one engine's KV pool from its
worst admissible steps without running a request; this runs requests through every system
(engine and baselines), over many lengths, into a run directory."""
from __future__ import annotations

import typer

from dllm_bench.commands import budget_flag
from dllm_bench.commands.serve_flags import AsJson, ResultDir, RunId
from dllm_bench.memory_bench.options import DEFAULT_SYSTEMS, MemoryOptions
from dllm_bench.memory_bench.run import memory
from dllm_bench.results import print_json


def register(app: typer.Typer) -> None:
    @app.command("memory")
    def memory_cmd(
        model: str = typer.Option("tiny", "--model", "-m", help="Preset name or LLaDA checkpoint directory."),
        systems: str | None = typer.Option(None, "--systems", help=f"systems as in serve [{DEFAULT_SYSTEMS}]; "
                                           "one request each (no batch knob)"),
        memory_budget: budget_flag.Memory = None,
        length: int | None = typer.Option(None, "--length", help="canvas tokens of the request measured step by "
                                          "step [2 x the engine's token budget]"),
        max_length: int | None = typer.Option(None, "--max-length", help="the longest canvas the search tries "
                                              "[4 x the model's trained length]"),
        resolution: int | None = typer.Option(None, "--resolution", help="search grid in tokens [the trained length / 32, at least a block]"),
        gen_length: int | None = typer.Option(None, "--gen-length", help="generated tokens of each request "
                                              "[one block]"),
        block_length: int | None = typer.Option(None, "--block-length", help="[the model's serve preset's]"),
        steps_per_block: int = typer.Option(4, "--steps-per-block", help="denoising steps per block"),
        no_search: bool = typer.Option(False, "--no-search", help="only the request at --length"),
        derive: str | None = typer.Option(None, "--derive", help="carry the measured bytes per category to a "
                                          "shape and budget, e.g. llada-8b:24GiB (bfloat16, the paper preset's "
                                          "token and logit budgets)"),
        device: str = typer.Option("auto", help="auto | cpu | cuda[:N]"),
        dtype: str | None = typer.Option(None, help="float32 | bfloat16 | float16 | float64 (default: bfloat16 "
                                         "on CUDA, float32 on CPU)"),
        threads: int | None = typer.Option(None, help="torch threads"),
        seed: int = typer.Option(0, help="prompt ids seed"),
        result_dir: ResultDir = None,
        run_id: RunId = None,
        json_out: AsJson = False,
    ) -> None:
        """Longest canvas within a memory budget and memory over one request's steps, per system."""
        doc = memory(MemoryOptions(model=model, systems=systems, memory_budget=memory_budget, length=length,
                                   max_length=max_length, resolution=resolution, gen_length=gen_length,
                                   block_length=block_length, steps_per_block=steps_per_block, derive=derive,
                                   search=not no_search, device=device, dtype=dtype, threads=threads, seed=seed,
                                   run_id=run_id, result_dir=result_dir, json_out=json_out))
        if json_out:
            print_json(doc)
