"""`dllm-bench profile-step`: where one step of a system's time goes, under torch.profiler
(dllm_bench.stepprofile, docs/PROFILE_STEP.md)."""
from __future__ import annotations

import typer

from dllm_bench import results
from dllm_bench.commands import budget_flag
from dllm_bench.commands.serve_flags import AsJson, Model, NoProfileCache, Preset, Threads
from dllm_bench.console import console
from dllm_bench.stepprofile.options import StepProfileOptions, parse_batch
from dllm_bench.stepprofile.report import show
from dllm_bench.stepprofile.run import profile_step


def register(app: typer.Typer) -> None:
    @app.command("profile-step")
    def profile_step_cmd(
        system: str = typer.Option("engine", "--system", help="one system in serve's --systems grammar: engine, "
                                   "engine:cache=dual, engine:cuda_graphs=false, fast-dllm, sparse-dllm, ..."),
        batch: str = typer.Option("1", "--batch", help="requests in the system (a baseline's static batch), or "
                                  "max-fit: a baseline's largest static batch in the memory budget (measured, up to the preset's "
                                  "max_num_seqs)"),
        phase: str = typer.Option("serve", "--phase", help="reuse | refresh (every member in that phase) | mixed "
                                  "(both in each step: the engine's requests admitted a stagger apart) | serve "
                                  "(requests admitted together, stepped as scheduled)"),
        steps: int = typer.Option(5, "--steps", help="profiled steps (and as many timed without the profiler)"),
        warmup: int = typer.Option(2, "--warmup", help="steps of the phase run first, not measured"),
        prompt_len: int | None = typer.Option(None, "--prompt-len", help="prompt tokens per request [preset's "
                                              "dataset: the middle of its prompt lengths]"),
        gen_length: int | None = typer.Option(None, "--gen-length", help="generated tokens per request, a block "
                                              "multiple [preset]"),
        block_length: int | None = typer.Option(None, "--block-length", help="diffusion block length [preset]"),
        model: Model = None,
        preset: Preset = None,
        device: str | None = typer.Option(None, "--device", help="cpu | cuda [preset]"),
        dtype: str | None = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 | float64 [preset]"),
        memory_budget: budget_flag.ProfileStep = None,
        threads: Threads = None,
        seed: int = typer.Option(0, "--seed", help="prompt ids"),
        no_profile_cache: NoProfileCache = False,
        as_json: AsJson = False,
    ) -> None:
        """One system at a batch and phase mix: time per step by category (GEMMs, attention, LM head, indexing,
        sampling, copies, elementwise, host gaps), FLOPs and bytes against the measured peaks, the longest
        kernels."""
        opts = StepProfileOptions(system=system, batch=parse_batch(batch), phase=phase, steps=steps, warmup=warmup,
                                  prompt_len=prompt_len, gen_length=gen_length, block_length=block_length,
                                  model=model, preset=preset, device=device, dtype=dtype,
                                  memory_budget=memory_budget, threads=threads, seed=seed,
                                  no_profile_cache=no_profile_cache)
        err = console()
        with err.status("profile-step") as status:
            doc = profile_step(opts, log=lambda m: status.update(m))
        show(doc, err)
        if as_json:
            results.print_json(doc)
