"""`dllm-bench simulate`: `serve`'s options, replayed on a hardware profile by the real schedulers
with a cost model as the forward (docs/SIMULATE.md). `--paper NAME` replays one of the paper's
experiments and prints published vs simulated numbers with the error of each cell."""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from dllm_bench.errors import UserError
from dllm_bench.serve.options import resolve_run
from dllm_bench.serve.presets import DEFAULT_PRESET, PRESETS, preset_for
from dllm_bench.simulate import hardware as hwmod
from dllm_bench.simulate import validate
from dllm_bench.simulate.implementations import default_impl, parse_impl_overrides
from dllm_bench.simulate.paper.replay import REPLAYS, replay
from dllm_bench.simulate.paper.setting import parse_declared
from dllm_bench.simulate.run import make_setup, simulate_serve
from dllm_bench.simulate.simulator import resolve_sim_model


def _budget(memory_budget: str | None, preset_budget: str | None, hw) -> str | None:
    """The budget to simulate: the flag, else on a GPU profile its memory × 0.9 (the engine's
    gpu_memory_utilization default), else the preset's."""
    if memory_budget is not None:
        return memory_budget
    if hw.kind == "gpu":
        return str(int(hw.memory_bytes * 0.9))
    return preset_budget


def register(app: typer.Typer) -> None:

    @app.command("simulate")
    def simulate_cmd(
        hardware: str = typer.Option("cpu", "--hardware", help="profile name (cpu, rtx4090, l40s, a100-80g, h100, h200) "
                                     "or a file written by `dllm-bench calibrate`"),
        impl: str | None = typer.Option(None, "--impl", help="implementation per system, e.g. fast-dllm=engine "
                                        "(engine | hf-eager | hf-fast-dllm | hf-dllm-cache | dllm-bench)"),
        paper: str | None = typer.Option(None, "--paper", help=f"replay the paper ({' | '.join(REPLAYS)}) on "
                                         "its GPU (L40S; fig3: RTX 4090; holdout: u fitted on each "
                                         "dLLM-Serve point in turn); other options do not apply"),
        paper_prompt_len: str | None = typer.Option(None, "--paper-prompt-len", help="with --paper: a fixed prompt "
                                                    "length per dataset the paper does not give, e.g. osc=384,"
                                                    "burstgpt=256 [our dataset length models]"),
        paper_batch: str | None = typer.Option(None, "--paper-batch", help="with --paper: a declared static batch "
                                               "per baseline, e.g. fast-dllm=3 (a third scenario beside batch 1 and "
                                               "max-fit)"),
        rps: str | None = typer.Option(None, "--rps", "--request-rate", help="arrival rate(s), req/s [preset]"),
        systems: str | None = typer.Option(None, "--systems", help="systems and variants, as in serve"),
        dataset: str | None = typer.Option(None, "--dataset", help="livebench | osc | burstgpt | random (list allowed)"),
        num_prompts: int | None = typer.Option(None, "--num-prompts", help="requests per point [preset]"),
        duration: float | None = typer.Option(None, "--duration", help="bound arrivals by time (s)"),
        burstiness: float = typer.Option(1.0, "--burstiness", help="gamma shape: 1 = Poisson"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV "
                                                 "[GPU: its memory x 0.9; cpu: preset]"),
        model: str | None = typer.Option(None, "--model", help="model preset, checkpoint dir, or llada-8b (shape only)"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET})"),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens"),
        max_num_logits: str | None = typer.Option(None, "--max-num-logits"),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs"),
        retention: float | None = typer.Option(None, "--retention"),
        length_scale: float | None = typer.Option(None, "--length-scale"),
        gen_cap: int | None = typer.Option(None, "--gen-cap"),
        block_length: int | None = typer.Option(None, "--block-length"),
        dtype: str | None = typer.Option(None, "--dtype", help="serving dtype (bytes per element) [preset]"),
        seed: int = typer.Option(0, "--seed"),
        repeats: int = typer.Option(1, "--repeats", help="simulate every point N times with workload seeds seed, "
                                    "seed+1, ... (serve's repeats; --validate pairs them by seed)"),
        max_duration: float | None = typer.Option(None, "--max-duration", help="simulated seconds per point"),
        result_dir: Path | None = typer.Option(None, "--result-dir"),
        run_id: str | None = typer.Option(None, "--run-id"),
        as_json: bool = typer.Option(False, "--json"),
        validate_runs: str | None = typer.Option(None, "--validate", help="measured serve runs of the same workload "
                                                 "(run ids or dirs, comma-separated: the repeats): print and write "
                                                 "each cell's error with the measured spread, and again at each "
                                                 "point's measured machine speed when it read the speed gauge"),
    ) -> None:
        """Simulate `serve` on a hardware profile: the real schedulers, a calibrated cost model."""

        if paper is not None:
            if paper not in REPLAYS:
                raise UserError(f"--paper must be one of {', '.join(REPLAYS)}, got {paper!r}")
            if paper == "holdout" and paper_batch is not None:
                raise UserError("--paper-batch does not apply to --paper holdout (it refits dLLM-Serve alone)")
            replay(paper, as_json=as_json, declared=parse_declared(paper_prompt_len, paper_batch))
            return
        if paper_prompt_len is not None or paper_batch is not None:
            raise UserError("--paper-prompt-len and --paper-batch apply to --paper replays only")
        measured = None
        if validate_runs is not None:
            names = [v.strip() for v in validate_runs.split(",") if v.strip()]
            if not names:
                raise UserError("--validate needs at least one measured run")
            measured = validate.measured_runs(names, result_dir)
        hw = hwmod.load(hardware)
        sp = preset_for(preset, model)
        model_dir, loadable = resolve_sim_model(sp.model)
        run = resolve_run(
            rps=rps, systems=systems, dataset=dataset, dataset_path=None, num_prompts=num_prompts, duration=duration,
            burstiness=burstiness, arrivals=None, time_scale=1.0, burstgpt_model=None,
            memory_budget=_budget(memory_budget, sp.memory_budget, hw), model=str(model_dir), preset=sp.name,
            max_num_batched_tokens=max_num_batched_tokens, max_num_logits=max_num_logits, max_num_seqs=max_num_seqs,
            retention=retention, length_scale=length_scale, gen_cap=gen_cap, block_length=block_length,
            max_prompt_len=None, threads=None, dtype=dtype, device="cpu", seed=seed, max_duration=max_duration,
            num_warmups=0, no_profile_cache=False, repeats=repeats, weights=loadable)
        names = [v.name for v in run.systems]
        impls = {n: default_impl(n, hw.kind, hw.impl) for n in names} | parse_impl_overrides(impl, names)
        setup = make_setup(run, hw, impls, loadable)
        code = simulate_serve(run, setup, result_dir=result_dir, run_id=run_id, as_json=as_json,
                              validate_against=measured)
        if code:
            sys.exit(code)
