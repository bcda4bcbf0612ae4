"""Offline memory profiler: the worst admissible steps run under the memory meter, and what is
left of the budget goes to the KV pool (docs/ENGINE.md; docs/MEMORY.md)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine import chunking
from engine.config import EngineConfig, cuda_graphs_on
from engine.kv_cache import AUTO, SERVED, KVPool, bytes_per_token, kv_need, longest_held
from engine.memory import MemoryMeter, budget_from_free, free_device_memory
from engine.models import DenseLM
from engine.request import Phase, Request
from engine.runner import ModelRunner
from engine.sampling import SamplingParams
from engine.scheduler import serves_long

REFRESH_PHASE = {"none": Phase.REFRESH, "dual": Phase.REFRESH_STORE, "sparse": Phase.REFRESH_SELECT}


@dataclass
class MemoryProfile:
    budget_bytes: int
    weights_bytes: int
    activation_peak_bytes: int
    refresh_peak_bytes: int
    reuse_peak_bytes: int
    guard_bytes: int
    kv_pool_bytes: int
    kv_pool_tokens: int
    bytes_per_token: int
    max_num_logits: int | None
    max_num_batched_tokens: int
    max_num_seqs: int
    cache: str
    retention: float
    # a Refresh longer than the token budget (0/None when none is served): chunk, peaks
    refresh_chunk_tokens: int | None = None
    long_refresh_peak_bytes: int = 0
    long_reuse_peak_bytes: int = 0
    # False when the budget holds the steps within the token budget but not a longer canvas.
    long_canvas: bool = True

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def weights_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def default_budget(model: DenseLM, config: EngineConfig) -> int:
    if config.memory_budget is not None:
        return config.memory_budget
    if model.device.type == "cuda":   # measured with the weights loaded: they count as free
        free, _ = free_device_memory(model.device)
        return budget_from_free(free, weights_bytes(model), config.gpu_memory_utilization)
    raise ValueError("a memory budget is needed to profile on CPU (e.g. --memory-budget 4GiB)")


def _synthetic(n_tokens: int, prompt_len: int, block_length: int, model: DenseLM, config: EngineConfig,
               cache: str) -> Request:
    gen = n_tokens - prompt_len
    params = SamplingParams(gen_length=gen, steps=gen // block_length, block_length=block_length,
                            temperature=1.0 if config.sampling else 0.0)
    return Request(f"profile-{n_tokens}", [0] * prompt_len, params, model.config.mask_token_id, model.device,
                   cache=cache)


def _measure(runner: ModelRunner, batch: list[tuple[Request, Phase]], config: EngineConfig) -> int:
    pool = runner.pool
    for req, _ in batch:  # caches live in the pool, outside the activation measurement
        need = kv_need(req.cache, req.length, req.params.block_length, config.retention)
        req.slots, req.kv_pool, req.kv_tokens = pool.reserve(need), pool, need
    with MemoryMeter(runner.model.device) as meter:
        runner.run(batch)
    for req, _ in batch:
        pool.release(req.kv_tokens, req.slots)
    return meter.peak_bytes


def measure_activation_peak(model: DenseLM, config: EngineConfig, backend: str, max_model_len: int):
    """(refresh_peak, reuse_peak) bytes of the worst admissible steps (auto: dual's or sparse's)."""
    peaks = mode_peaks(model, config, backend, max_model_len).values()
    return max(p[0] for p in peaks), max(p[1] + p[2] for p in peaks)


def mode_peaks(model: DenseLM, config: EngineConfig, backend: str,
               max_model_len: int) -> dict[str, tuple[int, int, int]]:
    """{mode: (Refresh peak, the token budget of short Reuses' peak, the largest Reuse's)}."""
    runner = _scratch_runner(model, config, backend, max_model_len)
    modes = ("dual", "sparse") if config.cache == AUTO else (config.cache,)
    return {mode: _peaks(runner, model, config, max_model_len, mode) for mode in modes}


def _peaks(runner: ModelRunner, model: DenseLM, config: EngineConfig, max_model_len: int,
           mode: str) -> tuple[int, int, int]:
    budget = config.max_num_batched_tokens
    L = min(max_model_len, budget)
    # (a) Refresh: max-length canvases filling the token budget, every generated position a candidate
    n = max(1, min(config.max_num_seqs, budget // L))
    batch = [(_synthetic(L, 1, L - 1, model, config, mode), REFRESH_PHASE[mode]) for _ in range(n)]
    rest = budget - n * L
    if rest >= 2 and n < config.max_num_seqs:
        batch.append((_synthetic(rest, 1, rest - 1, model, config, mode), REFRESH_PHASE[mode]))
    refresh_peak = _measure(runner, batch, config)
    if mode == "none":
        return refresh_peak, 0, 0
    # (b) Reuse: the token budget full of short Reuse queries, plus the largest single Reuse.
    bl = min(32, max(1, L // 2))
    n_reuse = max(1, min(config.max_num_seqs, budget // bl))
    many = [(_synthetic(2 * bl, bl, bl, model, config, mode), Phase.REUSE) for _ in range(n_reuse)]
    big_bl = min(bl, L - 1)
    one = [(_synthetic(L, L - big_bl, big_bl, model, config, mode), Phase.REUSE)]
    return refresh_peak, _measure(runner, many, config), _measure(runner, one, config)


def _scratch_runner(model: DenseLM, config: EngineConfig, backend: str, max_model_len: int) -> ModelRunner:
    """An eager runner over an unbounded pool, its Reuse keys gathered (a fragmented pool's peak)."""
    pool = KVPool(None, model.config, model.dtype, model.device)
    runner = ModelRunner(model, dataclasses.replace(config, cuda_graphs=False), backend, pool, max_model_len)
    runner.in_place_keys = False
    return runner


def measure_long_context(model: DenseLM, config: EngineConfig, backend: str, max_model_len: int,
                         activation_peak: int, room: int, short_reuse: dict[str, int]) -> tuple[int, int, int] | None:
    """(chunk, chunked Refresh peak, the peak of a Reuse with keys at max_model_len beside
    `short_reuse[mode]`) for canvases beyond the token budget, or None; the largest over the
    modes served. `room`: the bytes the KV pool and this reservation share."""
    T = config.max_num_batched_tokens
    if max_model_len <= T or not serves_long(config):
        return None
    runner = _scratch_runner(model, config, backend, max_model_len)
    scratch = runner.pool
    chunks = [config.refresh_chunk_tokens] if config.refresh_chunk_tokens else \
        [c for c in (chunking.MIN_CHUNK << k for k in range(32)) if c <= T] or [T]
    peaks: dict[int, int] = dict.fromkeys(chunks, 0)
    reuse = 0
    slots = None
    for mode in sorted(SERVED[config.cache], key=lambda m: m != "none"):
        if mode != "none" and slots is None:
            taken = max(0, min(peaks.values()) - activation_peak)          # none's least reservation
            slots = max(0, room - taken) // bytes_per_token(model.config, model.dtype)
        n = max_model_len if slots is None else longest_held(mode, slots, config.retention, max_model_len)
        if n <= T:
            continue
        bl = min(32, T)           # a synthetic request whose slot table points at the scratch slot: no cache held
        req = _synthetic(n, n - bl, bl, model, config, mode)
        need = kv_need(mode, n, bl, config.retention)
        req.slots = torch.full((max(need, 1),), scratch.scratch, dtype=torch.long, device=model.device)
        req.kv_pool, req.kv_tokens = scratch, need
        state, cache, per_chunk = chunking.measure_moments(model, req, REFRESH_PHASE[mode], scratch.storage, config,
                                                           chunks, backend)
        peaks = {c: max(peaks[c], state + max(cache, per_chunk[c])) for c in chunks}
        if mode != "none":
            with MemoryMeter(model.device) as meter:
                runner.run([(req, Phase.REUSE)])
            reuse = max(reuse, meter.peak_bytes + short_reuse[mode])
    chunk = chunking.choose_chunk(peaks, activation_peak)
    return chunk, peaks[chunk], reuse


def profile_kv_pool(model: DenseLM, config: EngineConfig, backend: str, max_model_len: int) -> MemoryProfile:
    budget = default_budget(model, config)
    wb = weights_bytes(model)
    modes = mode_peaks(model, config, backend, max_model_len)
    refresh_peak, reuse_peak = max(p[0] for p in modes.values()), max(p[1] + p[2] for p in modes.values())
    peak, guard = max(refresh_peak, reuse_peak), int(budget * config.guard_fraction)
    chunk, long_refresh, long_reuse = measure_long_context(
        model, config, backend, max_model_len, peak, budget - wb - peak - guard,
        {m: p[1] for m, p in modes.items()}) or (None, 0, 0)
    graph_pool = cuda_graphs_on(config.cuda_graphs, model.device) and config.cache != "none"   # captured graphs' memory
    short = peak + (reuse_peak if graph_pool else 0)
    peak = max(peak, long_refresh, long_reuse) + (max(reuse_peak, long_reuse) if graph_pool else 0)
    long_canvas = chunk is not None
    if long_canvas and budget - wb - peak - guard < 0 <= budget - wb - short - guard:
        # Room for every step within the token budget but not for a longer canvas: serve the
        # former (the engine refuses the latter, saying why) rather than refuse every request.
        chunk, long_refresh, long_reuse, peak, long_canvas = None, 0, 0, short, False
    free = budget - wb - peak - guard
    if free < 0:
        raise ValueError(
            f"memory budget {budget / 2**20:.0f} MiB is too small: weights {wb / 2**20:.0f} MiB + "
            f"activation peak {peak / 2**20:.0f} MiB + guard {guard / 2**20:.0f} MiB"
        )
    bpt = bytes_per_token(model.config, model.dtype)
    tokens = free // bpt
    return MemoryProfile(
        budget_bytes=budget, weights_bytes=wb, activation_peak_bytes=peak, refresh_peak_bytes=refresh_peak,
        reuse_peak_bytes=reuse_peak, guard_bytes=guard, kv_pool_bytes=tokens * bpt, kv_pool_tokens=tokens,
        bytes_per_token=bpt, max_num_logits=config.max_num_logits,
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        cache=config.cache, retention=config.retention, refresh_chunk_tokens=chunk,
        long_refresh_peak_bytes=long_refresh, long_reuse_peak_bytes=long_reuse, long_canvas=long_canvas,
    )
