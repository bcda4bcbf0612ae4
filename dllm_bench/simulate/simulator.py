"""One simulated serving point: a real system (the engine's Scheduler + KV pool + logit budget,
or a baseline's StaticBatchSystem) stepping on the virtual clock with the cost model as its
forward, driven by serve's own open-loop replay (dllm_bench.serve.loadgen.run_open_loop).

Capacities: a run on the `cpu` profile with a loadable model takes the KV pool / static batch
from the same profilers `serve` uses (dllm_bench.systems.build, cached on disk), so simulated
and measured points share them; on a GPU profile they come from dllm_bench.simulate.memory.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from baselines import make_policy
from baselines.static_batch import StaticBatchSystem
from dllm_bench.checkpoints.presets import PRESETS, get_preset
from dllm_bench.checkpoints.store import cache_root, resolve_model
from dllm_bench.errors import UserError
from dllm_bench.serve.loadgen import run_open_loop, step_stats_summary
from dllm_bench.simulate.clock import VirtualClock, VirtualTimed
from dllm_bench.simulate.cost_model import CostModel, Forward, ModelShape
from dllm_bench.simulate.hardware import Hardware
from dllm_bench.simulate.implementations import get_impl
from dllm_bench.simulate.memory import baseline_batch_fits, baseline_max_batch, engine_kv_tokens
from dllm_bench.simulate.parallel import ParallelCostModel
from dllm_bench.simulate.runners import CostPolicy, CostRunner, ShapeModel, cost_engine
from dllm_bench.simulate.steps_per_block import StepsPlan
from dllm_bench.simulate.work import keys_in_place
from dllm_bench.systems.build import GRAPH_KEEP, KEEP_ALL, TIMED, WARM_UP, WARM_UP_PROMPT, warm_up_batch
from dllm_bench.systems.decoding import resolve as resolve_decoding
from dllm_bench.systems.spec import baseline_knobs, engine_knobs
from engine.config import EngineConfig, cuda_graphs_on
from engine.decoding import Decoding
from engine.graphs import keeps
from engine.parallel.model import RankConfig
from engine.sampling import SamplingParams

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16}


def shape_only_dir(name: str) -> Path:
    """A config-only checkpoint dir for a shape preset (e.g. llada-8b): enough for the workload
    (vocabulary, special ids) and the cost model, no weights."""

    preset = get_preset(name)
    ids = {k: v for k, v in preset.special_ids().items() if k != "bos_token_id"}  # as the real configs: no bos
    out = cache_root().parent / "shapes" / name
    out.mkdir(parents=True, exist_ok=True)
    cfg = preset.config_dict(ids)
    path = out / "config.json"
    if not path.is_file() or json.loads(path.read_text(encoding="utf-8")) != cfg:
        path.write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return out


def resolve_sim_model(spec: str) -> tuple[Path, bool]:
    """(checkpoint or config-only dir, loadable?) for a preset name, a shape preset or a dir."""

    # A preset drawn on a GPU (llada-8b) is simulated by its shape: a simulation makes no 16 GB.
    if spec in PRESETS and not PRESETS[spec].asset and (not PRESETS[spec].makeable or PRESETS[spec].draw_device != "cpu"):
        return shape_only_dir(spec), False
    path = resolve_model(spec)
    loadable = any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file()
    return path, loadable


@dataclass
class SimSetup:
    """Everything a point needs besides the workload."""

    model_config: Any                      # engine.models.ModelConfig
    shape: ModelShape
    hardware: Hardware
    dtype: str
    impls: dict[str, str]                  # system name -> implementation profile
    memory_budget: float                   # bytes
    engine_defaults: dict = field(default_factory=dict)
    baseline_defaults: dict = field(default_factory=dict)
    real_capacity: Any = None              # callable(variant, seed) -> info dict from serve's builders, or None
    cost_fn: Callable[[Forward], float] | None = None   # replaces the cost model (tests: unit costs)
    speed: float = 1.0                     # every step's cost x this: a machine slower than its profile
    decoding: Decoding = Decoding()      # --decoding (dllm_bench.systems.decoding): what each system runs
    steps_plan: StepsPlan | None = None    # forwards per block of parallel-decoded requests (--steps-per-block)
    # system label -> {"knobs": {...}, "info": {...}, "graph_capture": ..., "graph_keep": ...,
    # "graphs_replayed": ...}: a measured point's recorded knobs, capacity (KV pool, static batch),
    # where its graphs were captured, by which rule kept, and the buckets its trace shows replayed,
    # which replace the run's defaults (dllm_bench.simulate.fit.measured)
    pinned: dict = field(default_factory=dict)

    def pin_info(self, label: str, seed: int | None = None) -> dict:
        """The capacity a measured point of `label` ran with: its workload seed's own where the run
        measured one per workload (a max-fit batch), else its first point's."""
        pin = self.pinned.get(label, {})
        return pin.get("info_by_seed", {}).get(seed, pin.get("info", {}))

    def cost_model(self, system: str, ranks: int = 1) -> CostModel | ParallelCostModel:
        """`ranks` > 1: an engine on that many of the profile's GPUs (dllm_bench.simulate.parallel)."""
        hw, impl = self.hardware, self.impls[system]
        cm = CostModel(self.shape.rank_share(ranks), hw.peak_flops, hw.bandwidth, hw.efficiency, get_impl(impl),
                       hw.host_cost(impl, system))
        return cm if ranks == 1 else ParallelCostModel(cm, ranks, hw.link)

    def step_price(self, system: str, ranks: int = 1) -> Callable[[Forward], float]:
        """Seconds a forward would take, asked without running it (a graph's timed keep)."""
        fn = self.cost_fn
        if fn is None:
            step = self.cost_model(system, ranks).step
            fn = lambda fw: step(fw).t  # noqa: E731
        return self._at_speed(fn)

    def step_cost(self, system: str, ranks: int = 1) -> Callable[[Forward], float]:
        """What each forward the system runs is charged (a fit's replay records these)."""
        return self.step_price(system, ranks)

    def wake_cost(self, system: str) -> Callable[[float], float] | None:
        """The profile's cost of waking after an idle gap (None: unit-cost tests, or no wake fitted)."""
        host = self.hardware.host_cost(self.impls[system], system)
        if self.cost_fn is not None or host.wake_s <= 0:
            return None
        return self._at_speed(host.wake)

    def add_cost(self, system: str) -> float:
        """Seconds the loop spends handing one request to the system (0 for unit-cost tests)."""
        if self.cost_fn is not None:
            return 0.0
        return self.hardware.host_cost(self.impls[system], system).c_add * self.speed

    def clock(self) -> VirtualClock:
        """A point's clock: idle sleeps return as late as on the profile's machine (not in unit-cost tests)."""
        return VirtualClock(None if self.cost_fn is not None or not self.hardware.sleep_overshoot
                            else self.hardware.overshoot)

    def _at_speed(self, fn: Callable[[Any], float]) -> Callable[[Any], float]:
        k = self.speed
        return fn if k == 1.0 else (lambda x: fn(x) * k)


def _engine(variant, setup: SimSetup, clock: VirtualClock, info: dict, warm: tuple[int, int, int] | None):

    knobs = {**engine_knobs(variant, setup.engine_defaults), **setup.pinned.get(variant.label, {}).get("knobs", {})}
    try:
        cfg = EngineConfig(dtype=setup.dtype, device="cpu", sampling=False, **knobs)
        n = cfg.tensor_parallel_size
        rank_shape = setup.shape.rank_share(n)
    except ValueError as e:
        raise UserError(f"system {variant.label!r}: {e}") from None
    if info.get("kv_pool_tokens") is None:
        try:
            # per rank: each holds its heads' KV of every token, in its own budget
            info["kv_pool_tokens"] = engine_kv_tokens(rank_shape,
                                                      setup.memory_budget, cfg.max_num_batched_tokens,
                                                      cfg.max_num_logits)
        except ValueError as e:
            raise UserError(f"system {variant.label!r}: {e}") from None
        info["scenario"] = "continuous batching (phase-multiplexed), KV pool from the memory model"
    cfg.kv_pool_tokens = info["kv_pool_tokens"]
    # a rank's view of the model (its KV heads): the pool counts one GPU's bytes
    model_config = setup.model_config if n == 1 else RankConfig.of(setup.model_config, n)
    gpu = setup.hardware.kind == "gpu"
    # tensor-parallel ranks run eager (engine.parallel.driver), whatever cuda_graphs says
    graphs = n == 1 and cuda_graphs_on(cfg.cuda_graphs, torch.device("cuda" if gpu else "cpu"))
    # Today's serve captures the graphs at warm-up, outside the point, and on a GPU keeps a bucket's
    # graph only if it timed faster than eager (plain calls on a CPU keep all); a measured run is
    # replayed as it ran (its pin: an older run captured them in the point and kept every one; a
    # traced one kept the buckets its steps replayed).
    pin = setup.pinned.get(variant.label, {})
    where = pin.get("graph_capture", WARM_UP) if graphs else None
    rule = (pin.get("graph_keep", GRAPH_KEEP) if gpu else KEEP_ALL) if graphs else None
    keep, replayed = None, pin.get("graphs_replayed")
    if rule == TIMED and replayed is not None:
        keep = lambda key, graph, eager: key[0] in replayed  # noqa: E731
    elif rule == TIMED:
        price = setup.step_price(variant.name, n)
        keep = lambda key, graph, eager: keeps(price(graph), price(eager))  # noqa: E731
    runner = CostRunner(model_config, cfg, setup.shape, setup.step_cost(variant.name, n), clock,
                        TORCH_DTYPES[setup.dtype], graphs=graphs, in_place=keys_in_place(cfg, gpu), keep=keep)
    engine = cost_engine(cfg, runner)
    captured = runner.capture_graphs(*warm, engine.pool.can_reserve) if where == WARM_UP and warm else 0
    info.update(kind="engine", knobs=knobs, engine_config=cfg.to_dict(), tensor_parallel_size=n,
                graph_capture=where, graphs_captured_at_warm_up=captured, graph_keep=rule,
                graphs=runner.decisions if graphs else None)
    return VirtualTimed(engine, clock, lambda: runner.last, setup.wake_cost(variant.name), setup.add_cost(variant.name))


def _baseline(variant, setup: SimSetup, clock: VirtualClock, info: dict, max_len: int):

    knobs = {**baseline_knobs(variant, setup.baseline_defaults),
             **resolve_decoding(variant.name, setup.decoding, variant.knob_dict).knobs,
             **setup.pinned.get(variant.label, {}).get("knobs", {})}
    model = ShapeModel(setup.model_config, TORCH_DTYPES[setup.dtype])
    fixed, kind = variant.static_batch
    if fixed is not None:
        info.update(max_batch_size=fixed, scenario_kind=kind,
                    scenario=f"static batch B={fixed} ({'the upstream batch' if kind == 'upstream' else 'declared'})")
        if setup.real_capacity is None:      # a GPU profile: the byte counts stand in for serve's measured peak
            need, fits = baseline_batch_fits(variant.name, setup.shape, setup.memory_budget, fixed, max_len)
            info.update(peak_bytes=need, fits_budget=fits)
    elif info.get("max_batch_size") is None:
        try:
            b = baseline_max_batch(variant.name, setup.shape, setup.memory_budget, max_len)
        except ValueError as e:
            raise UserError(f"system {variant.label!r}: {e}") from None
        info.update(max_batch_size=b, scenario_kind="max-fit", fits_budget=True,
                    scenario=f"static batch B={b}: the largest that fits the memory model")
    try:
        policy = CostPolicy(make_policy(variant.name, model, **knobs), setup.shape, setup.step_cost(variant.name), clock,
                            planned=setup.steps_plan is not None)
    except ValueError as e:
        raise UserError(f"system {variant.label!r}: {e}") from None
    system = StaticBatchSystem(model, policy, int(info["max_batch_size"]))
    info.update(kind="baseline", knobs=knobs)
    return VirtualTimed(system, clock, lambda: policy.last, setup.wake_cost(variant.name),
                        setup.add_cost(variant.name))


def plan_requests(system: VirtualTimed, plan: StepsPlan | None, block_length: int, seed: int) -> None:
    """Every request handed to `system` gets its planned forwards per block (Request.planned_steps):
    a cost model commits no tokens, so this is when its parallel-decoded blocks end."""
    if plan is None:
        raise UserError("the simulator needs the forwards per block of parallel decoding (its steps depend on "
                        "token values): give --steps-per-block N or a run's requests.jsonl")
    inner = system.system
    queue = inner.scheduler.waiting if hasattr(inner, "scheduler") else inner.waiting
    add = system.add_request

    def add_planned(prompt_ids, params, request_id=None, arrival_time=None):
        rid = add(prompt_ids, params, request_id=request_id, arrival_time=arrival_time)
        req = next(r for r in reversed(queue) if r.request_id == rid)
        req.planned_steps = plan.draw(rid, params.num_blocks, seed)
        return rid
    system.add_request = add_planned


def build(variant, setup: SimSetup, clock: VirtualClock, max_len: int,
          warm: tuple[int, int, int] | None = None, seed: int | None = None) -> tuple[VirtualTimed, dict]:
    """The system on the clock; `warm`: serve's warm-up of the point (block length, prompt
    tokens, the most requests it batches), where an engine captures its CUDA graphs; `seed`: the
    point's workload seed (a measured capacity pinned per seed)."""
    info: dict[str, Any] = {"system": variant.name, "label": variant.label, "impl": setup.impls[variant.name],
                            "hardware": setup.hardware.name, "memory_budget": setup.memory_budget}
    if setup.real_capacity is not None:
        info.update(setup.real_capacity(variant, seed))
    info.update(setup.pin_info(variant.label, seed))
    if variant.is_baseline:
        return _baseline(variant, setup, clock, info, max_len), info
    return _engine(variant, setup, clock, info, warm), info


def simulate_point(variant, setup: SimSetup, workload: list, block_length: int,
                   max_duration: float | None = None, keep_steps: bool = False,
                   max_concurrency: int | None = None, seed: int = 0) -> dict:
    """{"result": run_open_loop's result in simulated seconds, "info": what was built}; at most
    `max_concurrency` requests in flight, as serve's loop. Under parallel decoding each request
    is planned its forwards per block (setup.steps_plan, drawn with `seed` and its id). An engine
    captures its CUDA graphs at serve's warm-up, before the clock starts (`build`'s `warm`)."""

    clock = setup.clock()
    max_len = max(len(w.prompt_ids) + w.gen_length for w in workload)
    warm = (block_length, len(workload[0].prompt_ids[:WARM_UP_PROMPT]), warm_up_batch(len(workload), max_concurrency))
    system, info = build(variant, setup, clock, max_len, warm, seed)
    dec = resolve_decoding(variant.name, setup.decoding, variant.knob_dict)
    if dec.parallel:
        plan_requests(system, setup.steps_plan, block_length, seed)

    def make_params(item) -> SamplingParams:
        g = int(item.gen_length)
        return SamplingParams(gen_length=g, steps=g, block_length=block_length, temperature=0.0,
                              decoding=dec.decoding)

    res = run_open_loop(system, workload, make_params, max_duration=max_duration, max_concurrency=max_concurrency,
                        clock=clock.now, sleep=clock.sleep, progress_interval=math.inf)
    if not keep_steps:
        res["stats"] = step_stats_summary(res.get("stats") or {})
    info.update(simulated=True, hardware_profile=setup.hardware.path or setup.hardware.name)
    return {"result": res, "info": info}
