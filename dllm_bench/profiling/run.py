"""What the offline profiler measures and what it leaves for the KV pool, with the logit budget
and without it (monolithic logits), side by side (the paper's Fig 2): `profile(o)` returns the
document `--json` prints, `tables.print_doc` shows it.

With `device_memory` it plans a GPU we do not have instead: the same two columns from the
model's shapes alone (dllm_bench.simulate.memory's byte counts; no weights, no GPU). With
`tensor_parallel_size` N: per rank of an engine split over N devices (docs/PARALLEL.md), the
plan of one of N such GPUs, or measured by N CPU processes each profiling its own shard
(dllm_bench.systems.profiles)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dllm_bench import inputs
from dllm_bench.checkpoints.load import load_shape
from dllm_bench.checkpoints.presets import model_params
from dllm_bench.device_defaults import default_dtype, is_cuda, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.simulate import hardware
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.memory import engine_plans
from dllm_bench.systems.options import RunOptions, positive
from dllm_bench.systems.profiles import profile_pools
from dllm_bench.units import parse_size
from engine import EngineConfig
from engine.config import DTYPES
from engine.kv_cache import kv_need
from engine.models import config_from_pretrained
from engine.profiler import MemoryProfile, budget_from_free


@dataclass(frozen=True)
class ProfileOptions(RunOptions):
    """`profile`'s options as given (field names are its CLI parameters')."""
    model: str = "mini-126k"
    device_memory: str | None = None
    max_num_batched_tokens: int = 4096
    max_num_logits: int = 1024
    max_num_seqs: int = 256
    max_model_len: int = 1024
    cache: str = "sparse"
    retention: float = 0.5
    prompt_len: int = 256
    gen_length: int = 256
    block_length: int = 32
    sampling: bool = False


def device_memory_bytes(spec: str) -> int:
    """`--device-memory`: a size, or a hardware profile's memory (simulate/hardware/*.json)."""
    if spec.strip().lower() in hardware.builtin_names():
        return int(hardware.load(spec.strip().lower()).memory_bytes)
    try:
        return parse_size(spec, "--device-memory")
    except UserError:
        raise UserError(f"--device-memory takes a size (24GiB, 80GB) or a hardware profile "
                        f"({', '.join(hardware.builtin_names())}), got {spec!r}") from None


def profile(o: ProfileOptions) -> dict:
    """The document of `o`'s two profiles (measured, or planned with `device_memory`): `kind`
    says which, `base` is the budgeted EngineConfig (for the tables)."""
    if o.threads is not None:
        torch.set_num_threads(positive(o.threads, "--threads"))
    if o.device_memory is not None and o.memory_budget is not None:
        raise UserError("give --memory-budget (measured here) or --device-memory (planned from shapes), not both")
    n = positive(o.tensor_parallel_size, "--tensor-parallel-size") or 1
    device_bytes = device_memory_bytes(o.device_memory) if o.device_memory is not None else None
    dtype = o.dtype or default_dtype("cuda" if device_bytes is not None else "auto")
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    budget = (budget_from_free(device_bytes, 0, EngineConfig.gpu_memory_utilization) if device_bytes is not None
              else resolve_budget(o.memory_budget or ("auto" if is_cuda("auto") else "4GiB"), "auto",
                                  required=True).bytes)
    for name, v in (("--prompt-len", o.prompt_len), ("--gen-length", o.gen_length),
                    ("--block-length", o.block_length), ("--max-model-len", o.max_model_len)):
        if v <= 0:
            raise UserError(f"{name} must be positive")
    try:
        base = EngineConfig(memory_budget=budget, max_num_batched_tokens=o.max_num_batched_tokens,
                            max_num_logits=o.max_num_logits, max_num_seqs=o.max_num_seqs,
                            max_model_len=o.max_model_len, cache=o.cache, retention=o.retention,
                            sampling=o.sampling, dtype=dtype)
    except ValueError as e:
        raise UserError(str(e)) from None
    shape = dict(prompt_len=o.prompt_len, gen_length=o.gen_length)
    if device_bytes is not None:
        cfg = load_shape(o.model)
        ms = ModelShape.from_config(cfg, torch.empty(0, dtype=DTYPES[dtype]).element_size())
        try:
            ms = ms.rank_share(n)
        except ValueError as e:
            raise UserError(f"--tensor-parallel-size: {e}") from None
        return dict(kind="plan", base=base, model=o.model, device_memory_bytes=device_bytes, dtype=dtype, shape=shape,
                    n_params=model_params(cfg),
                    tensor_parallel_size=n,
                    plans=engine_plans(ms, base, o.prompt_len + o.gen_length, o.block_length))
    path = inputs.checkpoint_dir(o.model)
    mml = min(o.max_model_len, config_from_pretrained(path).max_sequence_length)
    base = dataclasses.replace(base, model=str(path), tensor_parallel_size=n)
    results = profile_pools({"logit budget": base, "monolithic": dataclasses.replace(base, max_num_logits=None)},
                            mml, o.threads or 1)
    profiles = {k: {"error": v} if isinstance(v, str) else
                v.to_dict() | {"requests_that_fit": requests_that_fit(v, o.prompt_len, o.gen_length, o.block_length)}
                for k, v in results.items()}
    return dict(kind="measured", base=base, model=o.model, shape=shape, tensor_parallel_size=n, profiles=profiles)


def json_doc(doc: dict) -> dict:
    """What `--json` prints (the document less the tables' own keys)."""
    return {k: v for k, v in doc.items() if k not in ("kind", "base")}


def requests_that_fit(p: MemoryProfile, prompt_len: int, gen_length: int, block_length: int,
                      capped: bool = True) -> int:
    """Concurrent requests of this shape a profile's KV pool admits (and max_num_seqs, if capped)."""
    need = kv_need(p.cache, prompt_len + gen_length, block_length, p.retention)
    by_kv = p.kv_pool_tokens // need if need else p.max_num_seqs
    return min(by_kv, p.max_num_seqs) if capped else by_kv
