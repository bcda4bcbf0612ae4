"""A simulate run's options: serve's ServeOptions replayed on a hardware profile. The model is
simulated by its shape when it has no weights here (`llada-8b`); on a GPU profile the options
resolve as `serve --device cuda --memory-budget auto` resolves them on that GPU
(device_defaults.SimulatedGpu: bfloat16, CUDA graphs, the budget its memory x GPU_MEMORY_UTILIZATION, "auto" step
budgets and ridge scaled with it), on the `cpu` profile as on this CPU; each system gets its
implementation profile. Used by `simulate` and by `serve`'s GPU projection
(dllm_bench.simulate.projection)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dllm_bench.device_defaults import SimulatedGpu
from dllm_bench.errors import UserError
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
from dllm_bench.systems.options import parallel_labels, variant_ranks


def simulated_gpu(hw: Hardware) -> SimulatedGpu | None:
    """The device a GPU profile's run resolves its defaults for (None: the `cpu` profile, this CPU)."""
    if hw.kind != "gpu":
        return None
    # What every engine step pays beyond its roofline: the host's per-step cost and the LM head's
    # call, and per layer 4 GEMM calls (QKV, O, gate+up, down) and one attention call.
    host, e = hw.host_cost(default_impl("engine", hw.kind, hw.impl), "engine"), hw.efficiency
    return SimulatedGpu(hw.name, int(hw.memory_bytes), hw.peak_flops, hw.bandwidth,
                        host.c_step + e.c_op, 4 * e.c_op + e.c_attn)


def simulation(opts: ServeOptions, hw: Hardware, impl: str | None = None, steps_per_block: str | None = None,
               results_root: Path | None = None, measured: list[Path] | None = None) -> tuple[ServeRun, SimSetup]:
    """The run and the simulator's setup for `opts` on `hw`: the options resolved as serve resolves
    them on `hw`'s device (no warm-ups on a virtual clock; on a GPU the budget `auto` unless given:
    a CPU preset's own budget sizes a CPU run), `impl` overrides per system (`fast-dllm=engine`).
    An engine with `tensor_parallel_size` N runs on N of `hw`'s GPUs, each with the budget (dllm_bench.simulate.parallel); baselines on one. Systems that
    decode in parallel (--decoding, a Fast-dLLM threshold knob) need `steps_per_block`
    (dllm_bench.simulate.steps_per_block; a run id is looked up under `results_root`). `measured`
    (serve runs to validate against): every system that ran there is simulated as it ran (its
    recorded knobs and KV pool or static batch, dllm_bench.simulate.fit.measured.pins) in this
    project's implementation, the code `serve` measured, unless `impl` names another."""
    gpu = simulated_gpu(hw)
    sp = preset_for(opts.preset, opts.model, device=gpu or "cpu")
    model_dir, loadable = resolve_sim_model(sp.model)
    # simulated seconds cost no wall time
    opts = replace(opts, model=str(model_dir), preset=sp.name, dataset_path=None, arrivals=None, time_scale=1.0,
                   burstgpt_model=None, max_prompt_len=None, threads=None, device=None if gpu else "cpu",
                   memory_budget=opts.memory_budget or ("auto" if gpu else None), num_warmups=0,
                   no_profile_cache=False)
    run = resolve_run(opts, weights=loadable, wall_clock=False, gpu=gpu)
    names = [v.name for v in run.systems]
    parallel = parallel_labels(run.systems, run.engine_defaults)
    if parallel and hw.link is None:
        raise UserError(f"{parallel[0]!r} runs tensor-parallel but hardware profile {hw.name!r} has no 'link' "
                        "between GPUs (bandwidth, latency) to charge its all-reduces to")
    measured_impl = MEASURED_HOST if measured else hw.impl
    impls = {n: default_impl(n, hw.kind, measured_impl) for n in names} | parse_impl_overrides(impl, names)
    plan = steps_plan(run, steps_per_block, results_root)
    setup = make_setup(run, hw, impls, loadable)
    for v in run.systems:          # the model's heads, KV heads, MLP and vocabulary split N ways, before any run dir
        try:
            setup.shape.rank_share(variant_ranks(v, run.engine_defaults))
        except ValueError as e:
            raise UserError(f"system {v.label!r}: {e}") from None
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
