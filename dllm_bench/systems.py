"""Serving systems for `dllm-bench serve`: parse system specs, validate knobs, build the system.

Spec grammar (`--systems`)::

    specs   := spec ("," spec)*
    spec    := NAME [":" knob ("," knob)*]
    knob    := KEY "=" VALUE

The outer list and a spec's knob list share the comma, so a comma-separated token that holds
an "=" continues the knobs of the spec before it, and a token without "=" starts a new spec:
`engine:cache=dual,retention=0.3,fast-dllm,fast-dllm:batch=1` is three specs:
`engine:cache=dual,retention=0.3` (two knobs), `fast-dllm` and `fast-dllm:batch=1`. KEYs may be
written with dashes (`max-num-logits`); `none` (any case) is None where a knob allows it.

Systems and their knobs:
* `engine` — the dLLM-Serve engine; knobs are EngineConfig fields (ENGINE_KNOBS). It serves with
  `sampling=False` (serving workloads are greedy) and a KV pool sized by the offline profiler
  for the memory budget; the profile is cached on disk (see `profile_cache_dir`).
* every name in `baselines.SYSTEMS` (llada, fast-dllm, dllm-cache, sparse-dllm) — static-batch
  baselines; knobs are that system's knobs plus `batch`. Without `batch` the static batch is the
  largest that fits the memory budget, measured (`baselines.profile_max_batch`, as the paper's
  §6.1 "Hardware Saturation"); `batch=N` fixes it (how the upstream code ran: Fast-dLLM's
  snapshot handles batch 1 only). Each built system records which scenario it is.
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

from dllm_bench.errors import UserError

ENGINE = "engine"
BATCH_KNOB = "batch"
DEFAULT_SYSTEMS = "engine,fast-dllm,dllm-cache,sparse-dllm"
# Bump when what a cached profile means changes (profiler or measure code), so stale ones are redone.
PROFILE_FORMAT = 1
# Steps a static batch runs under the memory meter when its largest batch is measured: a full
# forward (step 0: every cache built, full-sequence logits), Sparse-dLLM's delayed selection
# step (1) and a cache-reusing step with every cache held (2). Later steps of a block repeat
# these shapes, so running the whole first block (the baselines' default) finds the same peak
# at ~10x the cost — tens of minutes at LLaDA's vocabulary on a CPU.
STATIC_PROFILE_STEPS = 3


# ---------------------------------------------------------------- knob value parsers
def _none(v: str) -> bool:
    return v.strip().lower() in ("none", "null")


def _int(v: str) -> int:
    try:
        f = float(v)
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None
    if not f.is_integer():
        raise ValueError(f"expected an integer, got {v!r}")
    return int(f)


def _float(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None


def _int_or_none(v: str) -> int | None:
    return None if _none(v) else _int(v)


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return v
    return parse


def _engine_knobs() -> dict[str, Callable[[str], Any]]:
    from engine.config import CACHE_POLICIES, SCHEDULERS, SELECTIONS

    return {
        "cache": _choice(CACHE_POLICIES), "selection": _choice(SELECTIONS),
        "retention": _float, "pool_window": _int, "delay_step": _int,
        "scheduler": _choice(SCHEDULERS), "max_num_logits": _int_or_none,
        "max_num_batched_tokens": _int, "max_num_seqs": _int,
    }


ENGINE_KNOBS = tuple(_engine_knobs())


def _by_default(default: Any) -> Callable[[str], Any]:
    """Parser for a baseline knob, from the type of its default value."""
    if isinstance(default, bool):
        def parse_bool(v: str) -> bool:
            low = v.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true/false, got {v!r}")
        return parse_bool
    if isinstance(default, int):
        return _int
    if isinstance(default, float):
        return _float
    if isinstance(default, str):
        return str

    def parse_any(v: str) -> Any:  # default None: None, a number, or a word
        if _none(v):
            return None
        try:
            return _int(v)
        except ValueError:
            pass
        try:
            return float(v)
        except ValueError:
            return v
    return parse_any


def baseline_registry() -> Mapping[str, Any]:
    """baselines.SYSTEMS (imported lazily: it pulls in torch)."""
    from baselines import SYSTEMS

    return SYSTEMS


def system_names() -> list[str]:
    return [ENGINE, *baseline_registry()]


def knob_parsers(name: str) -> dict[str, Callable[[str], Any]]:
    if name == ENGINE:
        return _engine_knobs()
    spec = baseline_registry()[name]
    parsers = {k: _by_default(d) for k, d in spec.knobs.items()}
    parsers[BATCH_KNOB] = _int
    return parsers


# ---------------------------------------------------------------- specs
@dataclass(frozen=True)
class SystemVariant:
    """One system to serve, with its knob overrides in the order given."""

    name: str
    knobs: tuple[tuple[str, Any], ...] = ()
    label: str = ""  # canonical spec text; names the variant in every table and point

    @property
    def is_baseline(self) -> bool:
        return self.name != ENGINE

    @property
    def knob_dict(self) -> dict[str, Any]:
        return dict(self.knobs)

    @property
    def batch(self) -> int | None:
        return self.knob_dict.get(BATCH_KNOB)

    def to_dict(self) -> dict:
        return {"name": self.name, "knobs": self.knob_dict, "label": self.label}

    @classmethod
    def from_dict(cls, d: Mapping) -> SystemVariant:
        return cls(d["name"], tuple(d.get("knobs", {}).items()), d.get("label") or d["name"])


def _fmt_value(v: Any) -> str:
    return "none" if v is None else str(v)


def _validate(name: str, knobs: dict[str, Any], spec_text: str) -> None:
    """Whole-combination checks the per-value parsers cannot do (engine: EngineConfig's own)."""
    if name == ENGINE:
        from engine.config import EngineConfig

        try:
            EngineConfig(**knobs)
        except ValueError as e:
            raise UserError(f"system {spec_text!r}: {e}") from None
        return
    b = knobs.get(BATCH_KNOB)
    if b is not None and b < 1:
        raise UserError(f"system {spec_text!r}: batch must be >= 1, got {b}")
    policy_knobs = {k: v for k, v in knobs.items() if k != BATCH_KNOB}
    spec = baseline_registry()[name]
    try:
        # The policies check their knobs before touching the model, so None is enough here.
        spec.policy(None, **{spec.knob_args.get(k, k): v for k, v in {**spec.knobs, **policy_knobs}.items()})
    except ValueError as e:
        raise UserError(f"system {spec_text!r}: {e}") from None
    except Exception:  # noqa: BLE001 - a policy that needs the model: checked when it is built
        pass


def parse_system(text: str) -> SystemVariant:
    """`name[:k=v[,k=v]]` -> SystemVariant (UserError for unknown names, knobs or values)."""
    text = text.strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    names = system_names()
    if name not in names:
        raise UserError(f"unknown system {name!r}; systems: {', '.join(names)}")
    parsers = knob_parsers(name)
    knobs: dict[str, Any] = {}
    for item in (p.strip() for p in rest.split(",")) if rest.strip() else ():
        key, eq, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key or not raw.strip():
            raise UserError(f"system {text!r}: expected key=value, got {item!r}")
        if key not in parsers:
            raise UserError(f"system {name!r} has no knob {key!r}; its knobs: {', '.join(parsers)}")
        if key in knobs:
            raise UserError(f"system {text!r}: knob {key!r} given twice")
        try:
            knobs[key] = parsers[key](raw.strip())
        except ValueError as e:
            raise UserError(f"system {text!r}: knob {key}: {e}") from None
    _validate(name, knobs, text)
    label = name + (":" + ",".join(f"{k}={_fmt_value(v)}" for k, v in knobs.items()) if knobs else "")
    return SystemVariant(name, tuple(knobs.items()), label)


def split_specs(text: str) -> list[str]:
    """Split the outer comma list: a token with '=' continues the previous spec's knobs."""
    specs: list[str] = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        if "=" in tok and ":" not in tok.split("=", 1)[0]:
            if not specs:
                raise UserError(f"--systems: {tok!r} is a knob with no system before it")
            specs[-1] += ("," if not specs[-1].endswith(":") else "") + tok
        else:
            specs.append(tok)
    return specs


def parse_systems(text: str | None) -> list[SystemVariant]:
    """The whole --systems value (default: all four of the paper); duplicates are an error."""
    specs = split_specs(text if text and text.strip() else DEFAULT_SYSTEMS)
    if not specs:
        raise UserError("--systems is empty")
    out: list[SystemVariant] = []
    seen: set[str] = set()
    for s in specs:
        v = parse_system(s)
        if v.label in seen:
            raise UserError(f"--systems lists {v.label!r} twice")
        seen.add(v.label)
        out.append(v)
    return out


# ---------------------------------------------------------------- resolved configuration
def engine_knobs(variant: SystemVariant, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """EngineConfig overrides for an engine variant: run-wide defaults, then the variant's."""
    base = {k: v for k, v in defaults.items() if k in ENGINE_KNOBS}
    return {**base, **variant.knob_dict}


def baseline_knobs(variant: SystemVariant, defaults: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Policy knobs for a baseline variant (without `batch`): registry defaults, run-wide
    per-system defaults (e.g. the paper's dLLM-Cache prompt interval), then the variant's."""
    spec = baseline_registry()[variant.name]
    knobs = dict(spec.knobs)
    knobs.update({k: v for k, v in dict(defaults.get(variant.name, {})).items() if k in spec.knobs})
    knobs.update({k: v for k, v in variant.knobs if k != BATCH_KNOB})
    return knobs


# ---------------------------------------------------------------- profile cache
def profile_cache_dir() -> Path:
    """`$DLLM_BENCH_CACHE/profiles` (default ~/.cache/dllm-bench/profiles), next to the models."""
    from dllm_bench.presets import cache_root

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
    import baselines
    import engine

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
                   cache_dir: str | os.PathLike | None = None, use_cache: bool = True) -> tuple[dict, bool]:
    """compute() unless a profile for exactly `payload` (model fingerprint, knobs, torch
    version, engine/baselines source hash, shapes...) is on disk. Returns (profile dict, came_from_cache). Writes atomically;
    an unreadable cache entry is recomputed, never trusted."""
    import torch

    from dllm_bench.results import atomic_write_json

    full = {"format": PROFILE_FORMAT, "kind": kind, "torch": torch.__version__, "code": code_fingerprint(),
            **payload}
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
@dataclass
class WorkloadShape:
    """What the static-batch profiling needs from the workload: its worst request."""

    max_prompt_len: int
    max_gen_length: int
    block_length: int
    steps: int | None = None  # None: steps = gen_length (one token per step)


@dataclass
class BuiltSystem:
    system: Any
    info: dict = field(default_factory=dict)


def build_system(variant: SystemVariant, *, model_dir: str | os.PathLike, dtype: str = "float32",
                 device: str = "cpu", memory_budget: int | None, shape: WorkloadShape,
                 engine_defaults: Mapping[str, Any] | None = None,
                 baseline_defaults: Mapping[str, Mapping[str, Any]] | None = None,
                 max_model_len: int | None = None, cache_dir: str | os.PathLike | None = None,
                 use_cache: bool = True, model: Any = None,
                 log: Callable[[str], None] = lambda msg: None) -> BuiltSystem:
    """Load the model (unless given) and build the engine or a baseline for `variant`.

    Engine: EngineConfig(sampling=False, memory_budget, knobs) with `kv_pool_tokens` from the
    (cached) offline profile. Baseline: `baselines.make_system` at batch B = the largest static
    batch whose measured peak fits the budget (cached), or the variant's `batch=N`.
    Returns the system and an `info` dict (what was built and why) for the results.
    """
    import torch

    from engine.engine import DTYPES, resolve_device
    from engine.models.llada import load_llada

    dev = resolve_device(device)
    if model is None:
        log("loading model")
        model = load_llada(model_dir, DTYPES[dtype], dev)
    fp = model_fingerprint(model_dir)
    info: dict[str, Any] = {"system": variant.name, "label": variant.label, "dtype": dtype,
                            "device": str(dev), "memory_budget": memory_budget,
                            "torch_threads": torch.get_num_threads()}
    if not variant.is_baseline:
        return _build_engine(variant, model, model_dir, fp, dtype, str(dev), memory_budget,
                             dict(engine_defaults or {}), max_model_len, cache_dir, use_cache, info, log)
    return _build_baseline(variant, model, fp, dtype, str(dev), memory_budget, shape,
                           dict(baseline_defaults or {}), max_model_len, cache_dir, use_cache, info, log)


def _build_engine(variant, model, model_dir, fp, dtype, device, memory_budget, defaults,
                  max_model_len, cache_dir, use_cache, info, log) -> BuiltSystem:
    from engine.attention import resolve_backend
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.profiler import MemoryProfile, profile_kv_pool

    knobs = engine_knobs(variant, defaults)
    try:
        cfg = EngineConfig(model=str(model_dir), dtype=dtype, device=device, sampling=False,
                           memory_budget=memory_budget, max_model_len=max_model_len, **knobs)
    except ValueError as e:
        raise UserError(f"system {variant.label!r}: {e}") from None
    info.update(kind="engine", knobs=knobs,
                scenario="continuous batching (phase-multiplexed), KV pool profiled for the budget")
    if memory_budget is not None or model.device.type == "cuda":
        backend = resolve_backend(cfg.attention_backend, model.device)
        mml = cfg.max_model_len or model.config.max_sequence_length
        payload = {"model": fp, "engine": {k: v for k, v in cfg.to_dict().items()
                                           if k not in ("model", "kv_pool_tokens")},
                   "backend": backend, "max_model_len": mml}
        log("profiling the engine's KV pool")

        def compute() -> dict:
            try:
                return profile_kv_pool(model, cfg, backend, mml).to_dict()
            except ValueError as e:  # budget too small for weights + activations
                raise UserError(f"system {variant.label!r}: {e}") from None
        prof, hit = cached_profile("engine", payload, compute, cache_dir, use_cache)
        profile = MemoryProfile(**prof)
        cfg.kv_pool_tokens = profile.kv_pool_tokens
        info.update(profile=prof, profile_cached=hit, kv_pool_tokens=profile.kv_pool_tokens)
    else:
        info.update(profile=None, profile_cached=False, kv_pool_tokens=None)
    engine = LLMEngine(cfg, model=model)
    info["engine_config"] = cfg.to_dict()
    return BuiltSystem(engine, info)


def _build_baseline(variant, model, fp, dtype, device, memory_budget, shape, defaults,
                    max_model_len, cache_dir, use_cache, info, log) -> BuiltSystem:
    from baselines import make_system
    from baselines.static_batch import measure_run, profile_max_batch

    knobs = baseline_knobs(variant, defaults)
    steps = shape.steps or shape.max_gen_length
    payload = {"model": fp, "system": variant.name, "knobs": knobs, "dtype": dtype, "device": device,
               "run_steps": STATIC_PROFILE_STEPS, "prompt_len": shape.max_prompt_len, "gen_length": shape.max_gen_length,
               "block_length": shape.block_length, "steps": steps}
    fixed = variant.batch
    info.update(kind="baseline", knobs=knobs)
    if fixed is None:
        if memory_budget is None:
            raise UserError(f"system {variant.label!r}: a memory budget is needed to measure its "
                            "largest static batch (give --memory-budget, or batch=N)")
        log("measuring the largest static batch that fits the budget")

        def compute() -> dict:
            try:
                b, peak = profile_max_batch(model, memory_budget, shape.max_prompt_len, shape.max_gen_length,
                                            shape.block_length, steps, variant.name, knobs,
                                            run_steps=STATIC_PROFILE_STEPS)
            except ValueError as e:  # not even batch 1 fits
                raise UserError(f"system {variant.label!r}: {e}") from None
            return {"max_batch_size": b, "peak_bytes": peak}
        prof, hit = cached_profile("static-batch", {**payload, "budget": memory_budget}, compute,
                                   cache_dir, use_cache)
        batch = int(prof["max_batch_size"])
        info.update(scenario=f"max-fit: B={batch}, the largest static batch that fits the budget (measured)",
                    scenario_kind="max-fit", max_batch_size=batch, peak_bytes=prof["peak_bytes"],
                    profile_cached=hit, fits_budget=True)
    else:
        batch = int(fixed)
        info.update(scenario=f"fixed: B={batch} as given (batch={batch}; how upstream ran)",
                    scenario_kind="fixed", max_batch_size=batch)
        if memory_budget is not None:
            from baselines.static_batch import weight_bytes

            log(f"measuring the peak at batch {batch}")
            prof, hit = cached_profile(
                "static-peak", {**payload, "batch": batch},
                lambda: {"peak_bytes": measure_run(model, batch, shape.max_prompt_len, shape.max_gen_length,
                                                   shape.block_length, steps, variant.name, knobs,
                                                   run_steps=STATIC_PROFILE_STEPS)},
                cache_dir, use_cache)
            avail = memory_budget - weight_bytes(model)
            info.update(peak_bytes=prof["peak_bytes"], profile_cached=hit,
                        fits_budget=prof["peak_bytes"] <= avail)
    try:
        system = make_system(variant.name, model, max_batch_size=batch, max_model_len=max_model_len, **knobs)
    except ValueError as e:
        raise UserError(f"system {variant.label!r}: {e}") from None
    return BuiltSystem(system, info)
