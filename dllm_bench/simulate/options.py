"""A simulate run's options: serve's ServeOptions replayed on a hardware profile. The model is
simulated by its shape when it has no weights here (`llada-8b`), a GPU profile's budget is its
memory x 0.9 unless given (a preset's "auto" token and logit budgets scaled with it, as on a real
GPU), and each system gets its implementation profile. Used by `simulate` and by `serve`'s GPU
projection (dllm_bench.serve.projection)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dllm_bench.errors import UserError
from dllm_bench.ridge import from_peaks
from dllm_bench.serve.config import ServeRun
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.serve.presets import preset_for
from dllm_bench.simulate.fit.measured import pins
from dllm_bench.simulate.hardware import Hardware
from dllm_bench.simulate.implementations import MEASURED_HOST, default_impl, parse_impl_overrides
from dllm_bench.simulate.run import make_setup
from dllm_bench.simulate.simulator import SimSetup, resolve_sim_model
from dllm_bench.simulate.steps_per_block import StepsPlan
from dllm_bench.simulate.steps_per_block import parse as parse_steps
from dllm_bench.systems.decoding import resolve as resolve_decoding
from dllm_bench.systems.options import parallel_labels
from engine.config import DTYPES

# The share of a GPU's memory a run may use when no budget is given: the engine's
# gpu_memory_utilization default (vLLM's).
GPU_MEMORY_UTILIZATION = 0.9


def budget_on(hw: Hardware, memory_budget: str | None, preset_budget: str | None) -> str | None:
    """The budget to simulate: the flag, else on a GPU profile its memory x 0.9, else the preset's."""
    if memory_budget is not None:
        return memory_budget
    if hw.kind == "gpu":
        return str(int(hw.memory_bytes * GPU_MEMORY_UTILIZATION))
    return preset_budget


def simulation(opts: ServeOptions, hw: Hardware, impl: str | None = None, steps_per_block: str | None = None,
               results_root: Path | None = None, measured: list[Path] | None = None) -> tuple[ServeRun, SimSetup]:
    """The run and the simulator's setup for `opts` on `hw`: the options resolved as serve resolves
    them (device cpu: the run's dtype is the preset's, no warm-ups on a virtual clock), `impl`
    overrides per system (`fast-dllm=engine`). An engine with `tensor_parallel_size` N runs on N of
    `hw`'s GPUs, each with the budget (dllm_bench.simulate.parallel); baselines on one. Systems that
    decode in parallel (--decoding, a Fast-dLLM threshold knob) need `steps_per_block`
    (dllm_bench.simulate.steps_per_block; a run id is looked up under `results_root`). `measured`
    (serve runs to validate against): every system that ran there is simulated as it ran (its
    recorded knobs and KV pool or static batch, dllm_bench.simulate.fit.measured.pins) in this
    project's implementation, the code `serve` measured, unless `impl` names another."""
    sp = preset_for(opts.preset, opts.model)
    model_dir, loadable = resolve_sim_model(sp.model)
    opts = replace(opts, memory_budget=budget_on(hw, opts.memory_budget, sp.memory_budget), model=str(model_dir),
                   preset=sp.name, dataset_path=None, arrivals=None, time_scale=1.0, burstgpt_model=None,
                   max_prompt_len=None, threads=None, device="cpu", num_warmups=0, no_profile_cache=False)
    # simulated seconds cost no wall time; a GPU profile's memory scales "auto" step budgets as
    # a measured run's GPU does (dllm_bench.step_budgets)
    gpu = f"{hw.name} (simulated)" if hw.kind == "gpu" else None
    # ... and its peaks set the "auto" ridge cache=auto weighs, as a measured GPU's do (a CPU
    # profile: a measured CPU run's constant, dllm_bench.ridge)
    dtype = opts.dtype or sp.dtype
    ridge = from_peaks(hw.peak_flops, hw.bandwidth, DTYPES[dtype].itemsize, f"{hw.name}'s peaks") if gpu else None
    run = resolve_run(opts, weights=loadable, wall_clock=False, gpu=gpu, ridge=ridge)
    names = [v.name for v in run.systems]
    parallel = parallel_labels(run.systems, run.engine_defaults)
    if parallel and hw.link is None:
        raise UserError(f"{parallel[0]!r} runs tensor-parallel but hardware profile {hw.name!r} has no 'link' "
                        "between GPUs (bandwidth, latency) to charge its all-reduces to")
    measured_impl = MEASURED_HOST if measured else hw.impl
    impls = {n: default_impl(n, hw.kind, measured_impl) for n in names} | parse_impl_overrides(impl, names)
    plan = steps_plan(run, steps_per_block, results_root)
    setup = make_setup(run, hw, impls, loadable)
    setup.decoding, setup.steps_plan = run.decoding, plan
    if measured:
        setup.pinned = pins(measured)
    return run, setup


def steps_plan(run: ServeRun, spec: str | None, results_root: Path | None) -> StepsPlan | None:
    """--steps-per-block, checked against the systems that decode in parallel in this run."""
    parallel = [v.label for v in run.systems if resolve_decoding(v.name, run.decoding, v.knob_dict).parallel]
    if spec is None:
        if parallel:
            raise UserError(f"{parallel[0]!r} decodes in parallel: the simulator commits no tokens, so give its "
                            "forwards per block with --steps-per-block (a number, or a serve/frontier run's requests)")
        return None
    if not parallel:
        raise UserError("--steps-per-block replays parallel decoding: give the policy it was recorded under, "
                        "e.g. --decoding threshold:0.9")
    plan = parse_steps(spec, results_root)
    plan.check(run.preset.block_length)
    return plan
