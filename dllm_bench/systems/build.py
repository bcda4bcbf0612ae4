"""Building a serving system for `dllm-bench serve`: the engine with a KV pool profiled for the
memory budget, or a baseline at its largest static batch that fits it (or a fixed `batch=N`).

What a variant means (its name, knobs and their resolution against the run-wide defaults) is
dllm_bench.systems.spec; this module turns a resolved variant into a live system. Both kinds of
profile are expensive (a real forward under the memory meter), so they are cached on disk,
keyed by everything that could change the answer (see `cached_profile`).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import baselines
import engine
from baselines import make_system as make_baseline
from baselines.profile import measure_run, profile_max_batch
from dllm_bench.checkpoints.store import cache_root
from dllm_bench.device_defaults import gpu_identity, resolve_device
from dllm_bench.errors import UserError
from dllm_bench.results import atomic_write_json
from dllm_bench.systems.families import check_supports
from dllm_bench.systems.spec import ENGINE, SystemVariant, baseline_knobs, engine_knobs
from engine.attention import choose_backend
from engine.config import DTYPES, EngineConfig
from engine.models import config_from_pretrained, load_model
from engine.profiler import MemoryProfile, default_budget, profile_kv_pool
from engine.profiler import weights_bytes as weight_bytes
from engine.sampling import SamplingParams

# Bump when what a cached profile means changes (profiler or measure code), so stale ones are redone.
PROFILE_FORMAT = 1
# Steps a static batch runs under the memory meter when its largest batch is measured: a full
# forward (step 0: every cache built, full-sequence logits), Sparse-dLLM's delayed selection
# step (1) and a cache-reusing step with every cache held (2). Later steps of a block repeat
# these shapes, so running the whole first block (the baselines' default) finds the same peak
# at ~10x the cost — tens of minutes at LLaDA's vocabulary on a CPU.
STATIC_PROFILE_STEPS = 3


# ---------------------------------------------------------------- profile cache
def profile_cache_dir() -> Path:
    """`$DLLM_BENCH_CACHE/profiles` (default ~/.cache/dllm-bench/profiles), next to the models."""
    return cache_root().parent / "profiles"


def model_fingerprint(model_dir: str | os.PathLike) -> dict:
    """Cheap identity of a checkpoint: its config.json text and its weight files' sizes/mtimes."""
    d = Path(model_dir)
    files = sorted(p for p in d.iterdir() if p.suffix == ".safetensors" or p.name.endswith(".index.json"))
    cfg = (d / "config.json").read_bytes()
    return {"config_sha256": hashlib.sha256(cfg).hexdigest(),
            "weights": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


def code_fingerprint() -> str:
    """Hash of the engine's and the baselines' source: a profile measured by other code (a new
    profiler rule, a leaner step) is stale, so any change there re-measures."""
    h = hashlib.sha256()
    for pkg in (engine, baselines):
        root = Path(pkg.__file__).resolve().parent
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _cache_key(payload: Mapping) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]


def cached_profile(kind: str, payload: Mapping, compute: Callable[[], dict],
                   cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                   device: str | None = None) -> tuple[dict, bool]:
    """compute() unless a profile for exactly `payload` (model fingerprint, knobs, torch
    version, engine/baselines source hash, shapes...) is on disk. Returns (profile dict, came_from_cache). Writes atomically;
    an unreadable cache entry is recomputed, never trusted. On a CUDA `device` the GPU's name and
    total memory are part of the key: an activation peak measured on one GPU (its kernels, its
    flash-attn workspace) is not another's, and a cache dir may be shared across machines."""
    full = {"format": PROFILE_FORMAT, "kind": kind, "torch": torch.__version__, "code": code_fingerprint(),
            **payload}
    gpu = gpu_identity(device) if device is not None else None
    if gpu is not None:
        full["gpu"] = gpu
    path = Path(cache_dir or profile_cache_dir()) / f"{kind}-{_cache_key(full)}.json"
    if use_cache:
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            if stored.get("key") == json.loads(json.dumps(full, default=str)):
                return stored["profile"], True
        except (OSError, ValueError, KeyError, AttributeError):
            pass
    t0 = time.perf_counter()
    prof = compute()
    try:
        atomic_write_json(path, {"key": full, "profile": prof, "seconds": time.perf_counter() - t0})
    except OSError:
        pass  # a read-only cache only costs time
    return prof, False


# ---------------------------------------------------------------- building
def rank_threads(n: int) -> int:
    """Torch threads per rank of an engine over `n` ranks: this process's shared out (on a CPU
    the ranks are n processes on the same cores)."""
    return max(1, torch.get_num_threads() // n)


def make_system(name: str, model: Any, *, engine_config: EngineConfig | None = None, batch: int = 1,
                knobs: Mapping[str, Any] | None = None, max_model_len: int | None = None,
                label: str | None = None) -> Any:
    """THE constructor of a serving system: the engine (`engine_config`, default
    EngineConfig(sampling=False) on the model's device, through
    `engine.open`: over `tensor_parallel_size` ranks each rank loads its shard of
    `engine_config.model` and `model` is None) or the baseline `name` at static batch `batch`
    with its `knobs` over the loaded `model`. Both expose add_request/step/has_unfinished/
    generate/stats and close() (a context manager). A configuration the system rejects is a
    UserError naming `label` (default `name`); a rank failing later is a RankFailure."""
    who = repr(label or name)
    try:
        if name == ENGINE:
            cfg = engine_config or EngineConfig(sampling=False, device=str(model.device))
            n = cfg.tensor_parallel_size
            check_tensor_parallel(cfg.model, n, cfg.device)
            who += f" at --tensor-parallel-size {n}" if n > 1 else ""
            return engine.open(cfg, model=model, threads=rank_threads(n))
        check_supports(name, model.config.model_type)
        return make_baseline(name, model, max_batch_size=batch, max_model_len=max_model_len, **dict(knobs or {}))
    except ValueError as e:
        raise UserError(f"system {who}: {e}") from None


def check_tensor_parallel(model_dir: str | os.PathLike, n: int, device: str) -> None:
    """UserError unless `n` ranks can run the checkpoint at `model_dir` on `device`: its heads,
    MLP and vocabulary split into n, and one GPU per rank (nothing to check for one rank).
    Cheap (config only), so a command checks it before it spawns anything or writes a run
    directory."""
    from engine.parallel.model import RankConfig

    if n == 1:
        return
    if resolve_device(device).type == "cuda" and n > torch.cuda.device_count():
        raise UserError(f"tensor_parallel_size {n} needs {n} GPUs, this machine has {torch.cuda.device_count()}")
    try:
        RankConfig.of(config_from_pretrained(model_dir), n)
    except ValueError as e:
        raise UserError(f"system 'engine' at tensor_parallel_size {n}: {e}") from None


@dataclass
class WorkloadShape:
    """What the static-batch profiling needs from the workload: its worst request."""

    max_prompt_len: int
    max_gen_length: int
    block_length: int
    steps: int | None = None  # None: steps = gen_length (one token per step)
    # The most requests one workload of the point holds: a static batch can never be fuller, so
    # the max-fit search stops there (None: search to the budget's limit).
    max_requests: int | None = None


@dataclass
class BuiltSystem:
    system: Any
    info: dict = field(default_factory=dict)


def build_system(variant: SystemVariant, *, model_dir: str | os.PathLike, dtype: str = "float32",
                 device: str = "cpu", memory_budget: int | None, shape: WorkloadShape | None = None,
                 engine_defaults: Mapping[str, Any] | None = None,
                 baseline_defaults: Mapping[str, Mapping[str, Any]] | None = None,
                 max_model_len: int | None = None, cache_dir: str | os.PathLike | None = None,
                 use_cache: bool = True, model: Any = None, sampling: bool = False,
                 log: Callable[[str], None] = lambda msg: None) -> BuiltSystem:
    """Load the model (unless given, or the engine runs on several ranks: each loads its shard)
    and build the engine or a baseline for `variant`.

    Engine: EngineConfig(sampling, memory_budget, knobs) with `kv_pool_tokens` from the
    (cached) offline profile; `sampling=False` (greedy only, as serving workloads are) leaves
    the Gumbel noise out of the profiled peak. On several ranks each rank profiles its own
    memory (nothing cached). Baseline: `baselines.make_system` at batch B = the largest static
    batch whose measured peak fits the budget (cached), or the variant's `batch=N`.
    Returns the system and an `info` dict (what was built and why) for the results.
    """
    dev = resolve_device(device)
    info: dict[str, Any] = {"system": variant.name, "label": variant.label, "dtype": dtype,
                            "device": str(dev), "memory_budget": memory_budget,
                            "torch_threads": torch.get_num_threads()}
    if variant.is_baseline:
        if shape is None:
            raise ValueError("a baseline is profiled for a workload shape: pass shape")
        model = model if model is not None else _load(model_dir, dtype, dev, log)
        return _build_baseline(variant, model, model_fingerprint(model_dir), dtype, str(dev), memory_budget, shape,
                               dict(baseline_defaults or {}), max_model_len, cache_dir, use_cache, info, log)
    cfg, knobs = _engine_config(variant, model_dir, dtype, str(dev), memory_budget, dict(engine_defaults or {}),
                                max_model_len, sampling)
    n = cfg.tensor_parallel_size
    check_tensor_parallel(model_dir, n, str(dev))
    scenario = "continuous batching (phase-multiplexed), KV pool profiled for the budget"
    if n == 1:      # one device: the whole model here, its profile cached
        model = model if model is not None else _load(model_dir, dtype, dev, log)
        cfg = _profiled(variant, cfg, model, model_dir, cache_dir, use_cache, info, log)
    else:           # each rank loads its shard and profiles its own memory; threads shared out
        model = None
        log(f"starting {n} tensor-parallel ranks (each loads and profiles its shard)")
        scenario = (f"continuous batching (phase-multiplexed) on {n} tensor-parallel ranks, KV pool per rank "
                    "profiled for the budget")
        info["tensor_parallel_size"] = n
    system = make_system("engine", model, engine_config=cfg, label=variant.label)
    if n > 1:
        info.update(profile=system.profile.to_dict() if system.profile is not None else None, profile_cached=False,
                    kv_pool_tokens=system.pool.capacity)
    info.update(kind="engine", knobs=knobs, scenario=scenario, engine_config=cfg.to_dict(),
                attention=system.attention.line)     # the command says it once per run (engine.attention)
    return BuiltSystem(system, info)


def _load(model_dir, dtype: str, device: torch.device, log: Callable[[str], None]) -> Any:
    log("loading model")
    return load_model(model_dir, DTYPES[dtype], device)


def _engine_config(variant, model_dir, dtype, device, memory_budget, defaults, max_model_len,
                   sampling) -> tuple[EngineConfig, dict]:
    """The variant's EngineConfig and knobs; a knob the engine refuses is the user's error."""
    knobs = engine_knobs(variant, defaults)
    try:
        return EngineConfig(model=str(model_dir), dtype=dtype, device=device, sampling=sampling,
                            memory_budget=memory_budget, max_model_len=max_model_len, **knobs), knobs
    except ValueError as e:
        raise UserError(f"system {variant.label!r}: {e}") from None


def _profiled(variant, cfg: EngineConfig, model, model_dir, cache_dir, use_cache, info, log) -> EngineConfig:
    """`cfg` with the KV pool its (cached) offline profile sizes for the budget; none without a
    budget on a CPU (unbounded)."""
    if cfg.memory_budget is None and model.device.type == "cuda":
        # The engine's own default (free memory now), made explicit: a cached profile keyed by
        # "no budget" would hand one GPU state's pool to another.
        cfg.memory_budget = default_budget(model, cfg)
        info["memory_budget"] = cfg.memory_budget
    if cfg.memory_budget is None:
        info.update(profile=None, profile_cached=False, kv_pool_tokens=None)
        return cfg
    try:
        backend = choose_backend(cfg.attention_backend, model.device, model.dtype).name
    except ValueError as e:  # a backend asked for by name that cannot run here
        raise UserError(f"system {variant.label!r}: {e}") from None
    mml = cfg.max_model_len or model.config.max_sequence_length
    payload = {"model": model_fingerprint(model_dir),
               "engine": {k: v for k, v in cfg.to_dict().items() if k not in ("model", "kv_pool_tokens")},
               "backend": backend, "max_model_len": mml}
    log("profiling the engine's KV pool")

    def compute() -> dict:
        try:
            return profile_kv_pool(model, cfg, backend, mml).to_dict()
        except ValueError as e:  # budget too small for weights + activations
            raise UserError(f"system {variant.label!r}: {e}") from None
    prof, hit = cached_profile("engine", payload, compute, cache_dir, use_cache, device=str(model.device))
    profile = MemoryProfile(**prof)
    cfg.kv_pool_tokens = profile.kv_pool_tokens
    # The chunk its reservation was measured at (a long canvas's Refresh, engine.chunking).
    cfg.refresh_chunk_tokens = cfg.refresh_chunk_tokens or profile.refresh_chunk_tokens
    if not profile.long_canvas:      # the budget holds no canvas past the token budget
        cfg.max_model_len = min(mml, cfg.max_num_batched_tokens)
        log(f"memory budget leaves no room for a canvas longer than the token budget: max_model_len "
            f"{cfg.max_model_len}")
    info.update(profile=prof, profile_cached=hit, kv_pool_tokens=profile.kv_pool_tokens)
    return cfg


def _build_baseline(variant, model, fp, dtype, device, memory_budget, shape, defaults,
                    max_model_len, cache_dir, use_cache, info, log) -> BuiltSystem:
    knobs = baseline_knobs(variant, defaults)
    steps = shape.steps or shape.max_gen_length
    payload = {"model": fp, "system": variant.name, "knobs": knobs, "dtype": dtype, "device": device,
               "run_steps": STATIC_PROFILE_STEPS, "prompt_len": shape.max_prompt_len, "gen_length": shape.max_gen_length,
               "block_length": shape.block_length, "steps": steps}
    fixed, kind = variant.static_batch
    info.update(kind="baseline", knobs=knobs)
    if fixed is None:
        if memory_budget is None:
            raise UserError(f"system {variant.label!r}: a memory budget is needed to measure its "
                            "largest static batch (give --memory-budget, or batch=N)")
        log("measuring the largest static batch that fits the budget")

        cap = shape.max_requests or 4096

        def compute() -> dict:
            try:
                b, peak = profile_max_batch(model, memory_budget, shape.max_prompt_len, shape.max_gen_length,
                                            shape.block_length, steps, variant.name, knobs,
                                            run_steps=STATIC_PROFILE_STEPS, max_batch=cap)
            except ValueError as e:  # not even batch 1 fits
                raise UserError(f"system {variant.label!r}: {e}") from None
            return {"max_batch_size": b, "peak_bytes": peak}
        prof, hit = cached_profile("static-batch", {**payload, "budget": memory_budget, "max_batch": cap},
                                   compute, cache_dir, use_cache, device=device)
        batch = int(prof["max_batch_size"])
        capped = shape.max_requests is not None and batch >= shape.max_requests
        info.update(scenario=(f"max-fit: B={batch}, every request of the point fits one static batch (measured; "
                              "the budget may hold more, a larger batch could never fill)" if capped else
                              f"max-fit: B={batch}, the largest static batch that fits the budget (measured)"),
                    scenario_kind="max-fit", max_batch_size=batch, batch_capped=capped,
                    peak_bytes=prof["peak_bytes"], profile_cached=hit, fits_budget=True)
    else:
        batch = int(fixed)
        scenario = (f"upstream: B={batch}, the batch {variant.name}'s upstream code runs" if kind == "upstream"
                    else f"fixed: B={batch} as given (batch={batch})")
        info.update(scenario=scenario, scenario_kind=kind, max_batch_size=batch)
        if memory_budget is not None:
            log(f"measuring the peak at batch {batch}")
            prof, hit = cached_profile(
                "static-peak", {**payload, "batch": batch},
                lambda: {"peak_bytes": measure_run(model, batch, shape.max_prompt_len, shape.max_gen_length,
                                                   shape.block_length, steps, variant.name, knobs,
                                                   run_steps=STATIC_PROFILE_STEPS)},
                cache_dir, use_cache, device=device)
            avail = memory_budget - weight_bytes(model)
            info.update(peak_bytes=prof["peak_bytes"], profile_cached=hit,
                        fits_budget=prof["peak_bytes"] <= avail)
    system = make_system(variant.name, model, batch=batch, knobs=knobs, max_model_len=max_model_len,
                         label=variant.label)
    return BuiltSystem(system, info)


# Where a run's engines captured their CUDA graphs (config.json's `graph_capture`): before each
# point (`warm_up`), or at each bucket's first step inside the point (a run without a warm-up).
WARM_UP, IN_POINT = "warm-up", "in-point"
WARM_UP_PROMPT = 8          # prompt tokens of the warm-up requests (the point's first request's first ones)


def graph_capture(num_warmups: int) -> str:
    return WARM_UP if num_warmups > 0 else IN_POINT


# Which captured graphs a run's engines replay (config.json's `graph_keep`): on CUDA a bucket keeps
# its graph only if it timed faster than eager (`timed`, engine.graphs.keeps); runs recorded before
# that rule existed replayed every bucket's graph (`all`), as plain calls on a CPU still do.
TIMED, KEEP_ALL = "timed", "all"
GRAPH_KEEP = TIMED


def warm_up_batch(n_requests: int, max_concurrency: int | None) -> int:
    """The most requests a point of `n_requests` ever batches: what its warm-up captures up to."""
    return min(n_requests, max_concurrency or n_requests)


def warm_up(system: Any, prompt_ids: list[int], block_length: int, n: int = 1, max_batch: int | None = None) -> None:
    """n one-block requests through a system before it is measured or serves (first-call
    costs are not serving); an engine with CUDA graphs captures its buckets first (those up to
    `max_batch` requests: a point of 32 requests never steps more)."""
    if n <= 0:
        return
    capture = getattr(system, "capture_graphs", None)
    if capture is not None:
        capture(block_length, len(prompt_ids), max_batch)
    params = SamplingParams(gen_length=block_length, steps=block_length, block_length=block_length)
    system.generate([list(prompt_ids)] * n, params)
