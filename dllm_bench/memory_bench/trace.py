"""One request of one system at one canvas length, every step's memory measured.

A `LiveTracker` spans the whole run from building the system on (the engine's KV pool and
profile, a baseline's caches), so every allocation and free is seen; each step's peak is the
live bytes at its highest point, split by what was live then: KV (the engine's pool, a
baseline's cache tensors), logits (tensors as wide as the vocabulary), FFN (as wide as the MLP)
and attention (everything else: hidden states, Q/K/V, attention outputs, indices). On CUDA
the step's total is the allocator's peak and the split the tracker's. The weights are counted
as their bytes; `fits` is every step within the budget (a CUDA out-of-memory, a request the
system refuses or a budget its profiler rejects: does not fit).
"""
from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from dllm_bench.errors import UserError
from dllm_bench.memory_bench.live import LiveTracker
from dllm_bench.memory_bench.options import MemoryRun
from dllm_bench.systems.build import make_system
from dllm_bench.systems.spec import ENGINE, SystemVariant, baseline_knobs, engine_knobs
from engine.config import EngineConfig
from engine.models import DenseLM
from engine.profiler import weights_bytes

CATEGORIES = ("kv", "logits", "ffn", "attention")


def tagger(model: DenseLM) -> Callable[[torch.Tensor], str]:
    """A storage's category by the width of the tensor that created it, with its dtype:
    "logits/torch.float64", "ffn/torch.float32", "attention/torch.int64", ..."""
    vocab, ffn = model.config.padded_vocab, model.config.mlp_hidden_size

    def tag(t: torch.Tensor) -> str:
        width = t.shape[-1] if t.dim() else 0
        cat = "logits" if width == vocab else "ffn" if width == ffn else "attention"
        return f"{cat}/{t.dtype}"
    return tag


@dataclass
class StepMemory:
    step: int
    phase: str                 # refresh | reuse (the step's work for this request)
    total: int                 # weights + everything live at the step's peak
    weights: int
    kv: int                    # KV allocated (the engine's whole pool; a baseline's caches)
    kv_used: int               # KV holding this request's tokens (the engine: its reserved slots)
    logits: int
    ffn: int
    attention: int
    parts: dict = field(default_factory=dict)   # "category/dtype" -> bytes: the dynamic part (derive)

    @property
    def dynamic(self) -> int:
        """What the request itself needs at the peak: its KV and the step's transients."""
        return self.kv_used + self.logits + self.ffn + self.attention


@dataclass
class Trace:
    system: str
    length: int
    fits: bool
    reason: str = ""                          # why it does not fit
    steps: list[StepMemory] = field(default_factory=list)
    complete: bool = False                    # every step of the request ran
    cache: str | None = None                  # the engine's mode for the request (cache=auto chooses it)
    chunk: int | None = None                  # the engine's Refresh chunk (its profile's; None: one step)

    @property
    def peak(self) -> int:
        return max((s.total for s in self.steps), default=0)

    def to_dict(self) -> dict:
        return {"system": self.system, "length": self.length, "fits": self.fits, "reason": self.reason,
                "complete": self.complete, "peak_bytes": self.peak, "steps": [asdict(s) for s in self.steps]}


def build(variant: SystemVariant, model: DenseLM, run: MemoryRun, length: int):
    """The system at this canvas length: the engine profiled for the budget with max_model_len
    = length; a baseline at batch 1 with the run's Table-3 knobs."""
    if variant.name == ENGINE:
        knobs = engine_knobs(variant, run.preset.engine_defaults())
        knobs.pop("tensor_parallel_size", None)
        cfg = EngineConfig(dtype=run.dtype, device=str(run.device), memory_budget=run.budget.bytes,
                           max_model_len=length, sampling=False, **knobs)
        return make_system(ENGINE, model, engine_config=cfg, label=variant.label)
    knobs = baseline_knobs(variant, run.preset.baseline_knobs)
    return make_system(variant.name, model, batch=1, knobs=knobs, max_model_len=length, label=variant.label)


def _cache_keys(system) -> set[int]:
    if hasattr(system, "pool"):
        return {system.pool.storage.untyped_storage().data_ptr()}
    return {t.untyped_storage().data_ptr() for t in system.policy.cache_tensors()}


def _kv_used(system) -> int | None:
    return system.pool.used * system.pool.bytes_per_token if hasattr(system, "pool") else None


def measure(variant: SystemVariant, model: DenseLM, run: MemoryRun, length: int,
            stop_over_budget: bool = False) -> Trace:
    """Run one request of `length` canvas tokens (random prompt ids) through the system.
    `stop_over_budget`: stop at the first step over the budget (a search only needs to know)."""
    trace = Trace(variant.label, length, False)
    weights, budget, cuda = weights_bytes(model), run.budget.bytes, run.device.type == "cuda"
    gen = torch.Generator().manual_seed(run.opts.seed + length)
    hi = min(model.config.mask_token_id, model.config.eos_token_id)
    prompt = torch.randint(0, hi, (length - run.gen_length,), generator=gen).tolist()
    system = None
    model.rope.reserve(length, run.device, model.dtype)    # the model's table, like its weights: not counted
    if cuda:          # the last system's memory back to the device (on a CPU the tracker ignores it)
        gc.collect()
        torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated(run.device) - weights
    tracker = LiveTracker(run.device, tagger(model))
    try:
        with tracker:
            system = build(variant, model, run, length)
            system.add_request(prompt, run.params())
            while system.has_unfinished():
                tracker.reset_peak()
                if cuda:
                    torch.cuda.reset_peak_memory_stats(run.device)
                before = _kv_used(system)     # a request admitted or finished in the step held its KV during it
                system.step()
                live = torch.cuda.max_memory_allocated(run.device) - start - weights if cuda else tracker.peak_bytes
                step = _step_memory(len(trace.steps), system, tracker.at_peak(), live, weights, before)
                trace.steps.append(step)
                if stop_over_budget and step.total > budget:
                    break
            trace.complete = not system.has_unfinished()
    except (UserError, ValueError) as e:          # the profiler rejects the budget, the pool the request
        trace.reason = str(e).splitlines()[0]
    except torch.OutOfMemoryError:
        trace.reason = "CUDA out of memory"
    finally:
        trace.cache, trace.chunk = _engine_choices(system)
        del system
    if not trace.reason:
        over = trace.peak > budget
        trace.fits = trace.complete and not over
        trace.reason = f"peak {trace.peak} bytes over the budget" if over else ""
    return trace


def _engine_choices(system) -> tuple[str | None, int | None]:
    """The mode the engine admitted its one request in, and the chunk its profile chose."""
    served = getattr(getattr(system, "scheduler", None), "served", None)
    profile = getattr(system, "profile", None)
    return next(iter(served), None) if served else None, getattr(profile, "refresh_chunk_tokens", None)


def _step_memory(i: int, system, at_peak: dict, live: int, weights: int, used_before: int | None) -> StepMemory:
    kv_keys = _cache_keys(system)
    kv = logits = ffn = attention = 0
    parts: dict[str, int] = {}
    for key, (size, tag) in at_peak.items():
        if key in kv_keys:
            kv += size
            continue
        cat = tag.split("/")[0]
        parts[tag] = parts.get(tag, 0) + size
        logits += size if cat == "logits" else 0
        ffn += size if cat == "ffn" else 0
        attention += size if cat == "attention" else 0
    # On CUDA the allocator's peak covers what the tracker cannot see (rounding, workspaces).
    attention += max(0, live - kv - logits - ffn - attention)
    used = _kv_used(system)
    kv_used = kv if used is None else max(used, used_before or 0)
    kv_dtype = next((k.split("/")[1] for k in parts), "")
    if kv_used:
        parts[f"kv/{_kv_dtype(system, kv_dtype)}"] = kv_used
    refresh, _, _ = system.counters.step_log[-1]
    return StepMemory(i, "refresh" if refresh else "reuse", weights + kv + logits + ffn + attention, weights, kv,
                      kv_used, logits, ffn, attention, parts)


def _kv_dtype(system, fallback: str) -> str:
    if hasattr(system, "pool"):
        return str(system.pool.dtype)
    cache = system.policy.cache_tensors()
    return str(cache[0].dtype) if cache else fallback
