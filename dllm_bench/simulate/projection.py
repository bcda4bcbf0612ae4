"""`serve`'s GPU projection: the comparison a CPU run has just measured, simulated at GPU scale.

A CPU `serve` point measures a scale-similar model at a handful of requests; what a user wants to
know is how the same systems compare on the GPU they care about. Under the measured table every
CPU run prints the same systems on the same dataset and arrival rate, simulated with the `paper`
preset (the paper's lengths) on the real shape of the run's model family (LLaDA-8B, Dream-7B:
`gpu_model`) on the RTX 4090 profile with at least
MIN_REQUESTS requests per point: the real schedulers on a virtual clock (dllm_bench.simulate),
seconds of CPU. It is labelled as simulated and comes with the `simulate` command that
reproduces it; `serve --no-projection` skips it.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from rich.console import Console

from dllm_bench.checkpoints.presets import PRESETS
from dllm_bench.errors import UserError
from dllm_bench.results import fmt_rps
from dllm_bench.serve.config import ServeRun
from dllm_bench.serve.options import ServeOptions
from dllm_bench.serve.points import PlannedPoint, point_summary
from dllm_bench.serve.presets import PRESETS as SERVE_PRESETS
from dllm_bench.serve.summary import comparisons, print_comparison
from dllm_bench.serve.task_prompts import TASK_DATASET
from dllm_bench.serve.workload import shape_of
from dllm_bench.simulate import hardware as hwmod
from dllm_bench.simulate.options import simulation
from dllm_bench.simulate.simulator import simulate_point

HARDWARE = "rtx4090"        # the paper's Figure 3 GPU, the one a user is likeliest to own
PRESET = "paper"
MIN_REQUESTS = 200


@dataclass
class Projection:
    hardware: str
    description: str
    preset: str
    num_prompts: int
    command: str
    points: list[dict] = field(default_factory=list)
    comparisons: list[dict] = field(default_factory=list)
    validation: str = ""          # Hardware.validation_label: how far the profile is off a measured run

    def to_dict(self) -> dict:
        return {"simulated": True, "hardware": self.hardware, "hardware_description": self.description,
                "validation": self.validation,
                "preset": self.preset, "num_prompts": self.num_prompts, "command": self.command,
                "points": self.points,
                "comparisons": [{k: v for k, v in c.items() if k != "summaries"} for c in self.comparisons]}


def gpu_model(model_type: str) -> str | None:
    """The preset of a family's real model (drawn on a GPU: llada-8b, dream-7b), simulated by its shape."""
    return next((p.name for p in PRESETS.values() if p.model_type == model_type and p.draw_device == "cuda"), None)


def skip_reason(run: ServeRun) -> str | None:
    """Why a run has no projection (None: it has one)."""
    if run.options is None:
        return "the run was not resolved from serve's options"
    if run.dataset_path:
        return "a replayed file (--dataset-path) has no GPU-scale counterpart"
    if not any(not v.is_endpoint for v in run.systems):
        return "only an --endpoint was measured (its model is the server's)"
    if TASK_DATASET in run.datasets:
        return "a trained model's own task (--dataset task) has no GPU-scale counterpart"
    family = run.model_info.get("model_type", "llada")
    if gpu_model(family) is None:
        return f"no GPU-scale model of the {family} family"
    if not run.decoding.fixed:
        return (f"--decoding {run.decoding}: the GPU model's forwards per block under it are not known here; "
                "simulate --decoding ... --steps-per-block with a distribution recorded on the GPU model")
    return None


def projection_options(run: ServeRun, num_prompts: int, preset: str = PRESET) -> ServeOptions:
    """The run's systems, datasets, rates, arrivals and seed on `preset`'s model, lengths and
    budget: every CPU-scale knob (lengths, budgets, dtype, threads) is the preset's."""
    o: ServeOptions = run.options
    return ServeOptions(systems=o.systems, baseline_batch=o.baseline_batch, dataset=",".join(run.datasets),
                        rps=",".join(fmt_rps(r) for r in run.rps), burstiness=run.burstiness, seed=run.seed,
                        retention=o.retention, num_prompts=num_prompts, preset=preset,
                        model=projected_model(run.model_info.get("model_type", "llada"), preset))


def projected_model(model_type: str, preset: str) -> str | None:
    """The model a projection simulates: the preset's own (None) where it is of the run's family,
    else the family's GPU-scale model (`gpu_model`)."""
    own = PRESETS.get(SERVE_PRESETS[preset].model)
    return None if own is not None and own.model_type == model_type else gpu_model(model_type)


def command(o: ServeOptions, hardware: str) -> str:
    """The `dllm-bench simulate` command that reproduces the projection."""
    args = ["dllm-bench", "simulate", "--hardware", hardware, "--preset", o.preset]
    if o.model is not None:
        args += ["--model", o.model]
    if o.systems is not None:
        args += ["--systems", o.systems]
    if o.baseline_batch != "max-fit":
        args += ["--baseline-batch", o.baseline_batch]
    args += ["--dataset", o.dataset, "--rps", o.rps, "--num-prompts", str(o.num_prompts)]
    if o.burstiness != 1.0:
        args += ["--burstiness", f"{o.burstiness:g}"]
    if o.retention is not None:
        args += ["--retention", f"{o.retention:g}"]
    if o.seed:
        args += ["--seed", str(o.seed)]
    return shlex.join(args)


def project(run: ServeRun, hardware: str = HARDWARE, preset: str = PRESET,
            min_requests: int = MIN_REQUESTS) -> Projection:
    """Every (dataset, rate, system) of `run` simulated on `hardware` with `preset`, at least
    `min_requests` requests per point (the run's count when larger). In memory: nothing is
    written besides what the caller keeps."""
    n = max(min_requests, run.num_prompts or 0)
    opts = projection_options(run, n, preset)
    hw = hwmod.load(hardware)
    sim, setup = simulation(opts, hw)
    points = []
    for (ds, rps), wl in sim.workloads.items():
        for v in sim.systems:
            pp = PlannedPoint(ds, rps, v, wl, shape_of(wl, sim.preset.block_length), seed=sim.seed)
            out = simulate_point(v, setup, wl, sim.preset.block_length)
            s, _, extra = point_summary(out, pp, sim)
            extra.update(simulated=True, hardware=hw.name, scenario=out["info"].get("scenario"),
                         scenario_kind=out["info"].get("scenario_kind", "engine"),
                         max_batch_size=out["info"].get("max_batch_size"),
                         kv_pool_tokens=out["info"].get("kv_pool_tokens"))
            points.append({**extra, **s, "system": v.label, "dataset": ds})
    comps = comparisons(points, {v.label for v in sim.systems if v.is_baseline})
    return Projection(hw.name, hw.description, sim.preset.name, n, command(opts, hw.name), points, comps,
                      hw.validation_label())


def print_projection(proj: Projection, console: Console) -> None:
    """The block under the measured table: labelled as simulated, with the command behind it."""
    console.print(f"[bold]GPU projection — simulated, not measured[/bold]: the same comparison on the {proj.hardware} "
                  f"hardware profile ({proj.description}), preset {proj.preset}, {proj.num_prompts} requests per point "
                  f"(dllm_bench.simulate: the real schedulers on a virtual clock); {proj.hardware}: {proj.validation}",
                  highlight=False)
    for c in proj.comparisons:
        print_comparison(c["summaries"], c["baselines"], console,
                         title=f"SIMULATED on {proj.hardware} ({proj.preset}; {proj.validation}): {c['dataset']} @ "
                               f"{fmt_rps(c['rps'])} rps — vs best baseline")
    console.print(f"reproduce: {proj.command}", markup=False, highlight=False)


def gpu_projection(run: ServeRun, console: Console) -> dict | None:
    """serve's projection block, printed; its document for --json and projection.json, or None
    when the run has none (the reason printed)."""
    why = skip_reason(run)
    if why is None:
        try:
            proj = project(run, HARDWARE, PRESET, MIN_REQUESTS)
        except (UserError, ValueError) as e:    # never costs the measured run its results
            why = f"the simulation refused it: {e}"
    if why is not None:
        console.print(f"GPU projection: none ({why})", markup=False, highlight=False)
        return None
    print_projection(proj, console)
    return proj.to_dict()
