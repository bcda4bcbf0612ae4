"""The flags `simulate` declares itself: its own (--hardware, --paper, --validate, --fit, ...) and
the serving flags whose help or default differs from serve's (a simulated run's rates, budget,
model and dtype); the ones it shares with serve are commands/serve_flags.py's."""
from __future__ import annotations

from typing import Annotated

import typer

from dllm_bench.simulate.paper.replay import REPLAYS

Hardware = Annotated[str | None, typer.Option(
    "--hardware", help="profile name (cpu, rtx4090, l40s, a100-80g, h100, h200) or a file written by `dllm-bench "
    "calibrate` or `--fit` [cpu]; with --fit the base profile whose operators the fit starts from")]
Impl = Annotated[str | None, typer.Option(
    "--impl", help="implementation per system, e.g. fast-dllm=engine (engine | hf-eager | hf-fast-dllm | "
    "hf-dllm-cache | dllm-bench)")]
Paper = Annotated[str | None, typer.Option(
    "--paper", help=f"replay the paper ({' | '.join(REPLAYS)}) on its GPU (L40S; fig3: RTX 4090; holdout: u fitted "
    "on each dLLM-Serve point in turn); other options do not apply")]
PaperPromptLen = Annotated[str | None, typer.Option(
    "--paper-prompt-len", help="with --paper: a fixed prompt length per dataset the paper does not give, e.g. "
    "osc=384,burstgpt=256 [our dataset length models]")]
PaperBatch = Annotated[str | None, typer.Option(
    "--paper-batch", help="with --paper: a declared static batch per baseline, e.g. fast-dllm=3 (a third scenario "
    "beside batch 1 and max-fit)")]
Rps = Annotated[str | None, typer.Option("--rps", "--request-rate", help="arrival rate(s), req/s [preset]")]
Dataset = Annotated[str | None, typer.Option("--dataset", help="livebench | osc | burstgpt | random (list allowed)")]
Model = Annotated[str | None, typer.Option(
    "--model", help="model preset, checkpoint dir, or llada-8b (shape only)")]
Dtype = Annotated[str | None, typer.Option(
    "--dtype", help="serving dtype (bytes per element) [preset; a CPU preset on a GPU profile: bfloat16]")]
Repeats = Annotated[int, typer.Option(
    "--repeats", help="simulate every point N times with workload seeds seed, seed+1, ... (serve's repeats; "
    "--validate pairs them by seed)")]
MaxDuration = Annotated[float | None, typer.Option("--max-duration", help="simulated seconds per point")]
StepsPerBlock = Annotated[str | None, typer.Option(
    "--steps-per-block", help="parallel decoding's forwards per block (the simulator commits no tokens): N, N,M,... "
    "(drawn per block), or a run's requests.jsonl / run dir / run id (each request draws a recorded request's "
    "blocks)")]
Validate = Annotated[str | None, typer.Option(
    "--validate", help="measured serve runs of the same workload (run ids or dirs, comma-separated: the repeats): "
    "each system simulated as measured (its recorded knobs, KV pool or batch, this project's implementation); "
    "print and write each cell's error with the measured spread")]
Fit = Annotated[str | None, typer.Option(
    "--fit", help="measured serve runs (run ids or dirs, comma-separated): fit a profile's step terms to them on "
    "--hardware's operators, print each cell's residual and write the profile (--name)")]
Name = Annotated[str | None, typer.Option("--name", help="with --fit: the profile's name (simulate --hardware NAME)")]
Out = Annotated[str | None, typer.Option(
    "--out", help="with --fit: the profile's file [~/.cache/dllm-bench/hardware/NAME.json]")]
FitEvidence = Annotated[str, typer.Option(
    "--fit-evidence", help="with --fit: auto (each point's finest: steps.jsonl, else block times, else totals) | "
    "steps | blocks | totals")]
LeaveOneOut = Annotated[bool, typer.Option(
    "--leave-one-out/--no-leave-one-out", help="with --fit: also predict each system from a fit to the others")]
