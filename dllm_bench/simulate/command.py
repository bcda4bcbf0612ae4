"""`dllm-bench simulate` from its options (SimulateOptions: serve's ServeOptions plus the
simulator's own): `--fit` fits a profile to measured runs (simulate.fit), `--paper` replays one
of the paper's experiments (simulate.paper), else the serving run is simulated on a hardware
profile (simulate.options.simulation -> simulate.run.simulate_serve), with `--validate` against
measured runs of the same workload. Options that apply to another mode only are refused."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dllm_bench import console as cons
from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.serve.options import ServeOptions
from dllm_bench.simulate import hardware as hwmod
from dllm_bench.simulate import validate
from dllm_bench.simulate.options import simulation
from dllm_bench.simulate.paper.replay import REPLAYS, replay
from dllm_bench.simulate.paper.setting import parse_declared
from dllm_bench.simulate.run import simulate_serve


@dataclass(frozen=True)
class SimulateOptions(ServeOptions):
    """`simulate`'s options as given (field names are its CLI parameters')."""
    hardware: str | None = None
    impl: str | None = None
    paper: str | None = None
    paper_prompt_len: str | None = None
    paper_batch: str | None = None
    steps_per_block: str | None = None
    validate_runs: str | None = None
    fit_runs: str | None = None
    name: str | None = None
    out: str | None = None
    fit_evidence: str = "auto"
    leave_one_out: bool = True
    result_dir: Path | None = None
    run_id: str | None = None
    as_json: bool = False


def run_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def simulate(o: SimulateOptions) -> int:
    """Run the mode `o` asks for; the exit code."""
    if o.fit_runs is not None:
        from dllm_bench.simulate.fit.run import fit_command

        if o.hardware is None or not o.name:
            raise UserError("--fit needs --hardware BASE (the profile whose operators it starts from: a calibrate "
                            "file of that GPU, or a built-in one) and --name NAME")
        inputs.profile_name(o.name, "--name")
        out = inputs.out_file(o.out, "--out") if o.out is not None else \
            inputs.out_file(hwmod.cache_dir() / f"{o.name}.json", "--name's profile file")
        runs = validate.measured_runs(run_list(o.fit_runs), o.result_dir, "--fit")
        fit_command(runs, o.hardware, o.name, out, o.fit_evidence, o.leave_one_out, cons.console())
        return 0
    if o.name is not None or o.out is not None:
        raise UserError("--name and --out apply to --fit only")
    if o.paper is not None:
        if o.paper not in REPLAYS:
            raise UserError(f"--paper must be one of {', '.join(REPLAYS)}, got {o.paper!r}")
        if o.paper == "holdout" and o.paper_batch is not None:
            raise UserError("--paper-batch does not apply to --paper holdout (it refits dLLM-Serve alone)")
        replay(o.paper, as_json=o.as_json, declared=parse_declared(o.paper_prompt_len, o.paper_batch))
        return 0
    if o.paper_prompt_len is not None or o.paper_batch is not None:
        raise UserError("--paper-prompt-len and --paper-batch apply to --paper replays only")
    inputs.result_dir(o.result_dir)
    inputs.run_id(o.run_id)
    measured = None
    if o.validate_runs is not None:
        measured = validate.measured_runs(run_list(o.validate_runs), o.result_dir)
    hw = hwmod.load(o.hardware or "cpu")
    run, setup = simulation(o, hw, o.impl, o.steps_per_block, o.result_dir, measured=measured)
    if measured:
        validate.check_cells(measured, run.datasets, [v.label for v in run.systems], run.rps)
    return simulate_serve(run, setup, result_dir=o.result_dir, run_id=o.run_id, as_json=o.as_json,
                          validate_against=measured)
