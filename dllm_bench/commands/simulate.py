"""`dllm-bench simulate`: `serve`'s options, replayed on a hardware profile by the real schedulers
with a cost model as the forward (docs/SIMULATE.md). `--paper NAME` replays one of the paper's
experiments and prints published vs simulated numbers with the error of each cell."""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from dllm_bench import console as cons
from dllm_bench import inputs
from dllm_bench.commands.serve_flags import (
    GOODPUT_CONTEXT,
    AsJson,
    BaselineBatch,
    BlockLength,
    Burstiness,
    DecodingPolicy,
    Duration,
    GenCap,
    GenLength,
    Goodput,
    LengthScale,
    MaxConcurrency,
    MaxNumBatchedTokens,
    MaxNumLogits,
    MaxNumSeqs,
    MetricPercentiles,
    NumPrompts,
    PercentileMetrics,
    Preset,
    ResultDir,
    Retention,
    RunId,
    Seed,
    Systems,
    TensorParallelSize,
    goodput_pairs,
)
from dllm_bench.errors import UserError
from dllm_bench.serve.options import ServeOptions
from dllm_bench.simulate import hardware as hwmod
from dllm_bench.simulate import validate
from dllm_bench.simulate.options import simulation
from dllm_bench.simulate.paper.replay import REPLAYS, replay
from dllm_bench.simulate.paper.setting import parse_declared
from dllm_bench.simulate.run import simulate_serve


def register(app: typer.Typer) -> None:

    @app.command("simulate", context_settings=GOODPUT_CONTEXT)
    def simulate_cmd(
        ctx: typer.Context,
        hardware: str | None = typer.Option(None, "--hardware", help="profile name (cpu, rtx4090, l40s, a100-80g, h100, "
                                            "h200) or a file written by `dllm-bench calibrate` or `--fit` [cpu]; with "
                                            "--fit the base profile whose operators the fit starts from"),
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
        systems: Systems = None,
        baseline_batch: BaselineBatch = "max-fit",
        dataset: str | None = typer.Option(None, "--dataset", help="livebench | osc | burstgpt | random (list allowed)"),
        num_prompts: NumPrompts = None,
        duration: Duration = None,
        burstiness: Burstiness = 1.0,
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV "
                                                 "[GPU: its memory x 0.9; cpu: preset]"),
        model: str | None = typer.Option(None, "--model", help="model preset, checkpoint dir, or llada-8b (shape only)"),
        preset: Preset = None,
        max_num_batched_tokens: MaxNumBatchedTokens = None,
        max_num_logits: MaxNumLogits = None,
        max_num_seqs: MaxNumSeqs = None,
        retention: Retention = None,
        length_scale: LengthScale = None,
        gen_cap: GenCap = None,
        gen_length: GenLength = None,
        block_length: BlockLength = None,
        dtype: str | None = typer.Option(None, "--dtype", help="serving dtype (bytes per element) [preset]"),
        seed: Seed = 0,
        repeats: int = typer.Option(1, "--repeats", help="simulate every point N times with workload seeds seed, "
                                    "seed+1, ... (serve's repeats; --validate pairs them by seed)"),
        max_duration: float | None = typer.Option(None, "--max-duration", help="simulated seconds per point"),
        max_concurrency: MaxConcurrency = None,
        decoding: DecodingPolicy = "fixed",
        steps_per_block: str | None = typer.Option(None, "--steps-per-block", help="parallel decoding's forwards per "
                                                   "block (the simulator commits no tokens): N, N,M,... (drawn per "
                                                   "block), or a run's requests.jsonl / run dir / run id (each request "
                                                   "draws a recorded request's blocks)"),
        goodput: Goodput = None,
        percentile_metrics: PercentileMetrics = None,
        metric_percentiles: MetricPercentiles = None,
        result_dir: ResultDir = None,
        run_id: RunId = None,
        as_json: AsJson = False,
        tensor_parallel_size: TensorParallelSize = None,
        validate_runs: str | None = typer.Option(None, "--validate", help="measured serve runs of the same workload "
                                                 "(run ids or dirs, comma-separated: the repeats): each system "
                                                 "simulated as measured (its recorded knobs, KV pool or batch, this "
                                                 "project's implementation); print and write each cell's error with "
                                                 "the measured spread"),
        fit_runs: str | None = typer.Option(None, "--fit", help="measured serve runs (run ids or dirs, comma-"
                                            "separated): fit a profile's step terms to them on --hardware's "
                                            "operators, print each cell's residual and write the profile (--name)"),
        name: str | None = typer.Option(None, "--name", help="with --fit: the profile's name (simulate --hardware NAME)"),
        out: str | None = typer.Option(None, "--out", help="with --fit: the profile's file "
                                       "[~/.cache/dllm-bench/hardware/NAME.json]"),
        fit_evidence: str = typer.Option("auto", "--fit-evidence", help="with --fit: auto (each point's finest: "
                                         "steps.jsonl, else block times, else totals) | steps | blocks | totals"),
        leave_one_out: bool = typer.Option(True, "--leave-one-out/--no-leave-one-out", help="with --fit: also "
                                           "predict each system from a fit to the others"),
    ) -> None:
        """Simulate `serve` on a hardware profile: the real schedulers, a calibrated cost model."""
        goodput = goodput_pairs(ctx, goodput)
        if fit_runs is not None:
            from dllm_bench.simulate.fit.run import fit_command

            if hardware is None or not name:
                raise UserError("--fit needs --hardware BASE (the profile whose operators it starts from: a calibrate "
                                "file of that GPU, or a built-in one) and --name NAME")
            if out is not None:
                inputs.out_file(Path(out), "--out")
            runs = validate.measured_runs([v.strip() for v in fit_runs.split(",") if v.strip()], result_dir, "--fit")
            fit_command(runs, hardware, name, Path(out) if out else None, fit_evidence, leave_one_out, cons.console())
            return
        if name is not None or out is not None:
            raise UserError("--name and --out apply to --fit only")
        hardware = hardware or "cpu"
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
            measured = validate.measured_runs([v.strip() for v in validate_runs.split(",") if v.strip()], result_dir)
        hw = hwmod.load(hardware)
        opts = ServeOptions.pick(locals())
        run, setup = simulation(opts, hw, impl, steps_per_block, result_dir, measured=measured)
        code = simulate_serve(run, setup, result_dir=result_dir, run_id=run_id, as_json=as_json,
                              validate_against=measured)
        if code:
            sys.exit(code)
