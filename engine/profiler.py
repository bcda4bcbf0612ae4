"""The memory meter (CUDA allocator peak, or a CPU step's live storages) and the offline profiler: the worst
admissible steps run under it, what is left of the budget goes to the KV pool (docs/ENGINE.md, MEMORY.md)."""
from __future__ import annotations

import bisect
import dataclasses
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.chunking import LongRefresh
from engine.config import EngineConfig, cuda_graphs_on
from engine.kv_cache import AUTO, KVPool, bytes_per_token, kv_need
from engine.models import DenseLM
from engine.request import Phase, Request
from engine.runner import ModelRunner
from engine.sampling import SamplingParams
from engine.scheduler import serves_long

REFRESH_PHASE = {"none": Phase.REFRESH, "dual": Phase.REFRESH_STORE, "sparse": Phase.REFRESH_SELECT}
MIN_CHUNK = 32      # the smallest chunk measured, then powers of two
NEAR_BEST = 1.1     # no chunk fits: the largest within this factor of the least peak


class LiveBytes(TorchDispatchMode):
    """While entered: the bytes of live storages ops create on `device_type` (`current`) and their `peak`."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.refs, self.sizes = {}, {}      # storage -> live tensors, bytes
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in self._mine((args, kwargs))}
        for t in self._mine(out):
            key = t.untyped_storage().data_ptr()
            if key == 0 or (key not in self.refs and key in inputs):    # a view or an in-place result
                continue
            if key not in self.refs:
                self._add(key, t)
            self.refs[key] += 1
            weakref.finalize(t, self._release, key)
        return out

    def _mine(self, obj):
        """This device's tensors in an op's (nested) arguments or outputs, without tree_flatten's per-leaf cost."""
        if isinstance(obj, torch.Tensor) and obj.device.type == self.device_type and not obj.is_meta:
            yield obj
        elif isinstance(obj, (list, tuple, dict)):
            for o in obj.values() if isinstance(obj, dict) else obj:
                yield from self._mine(o)

    def _add(self, key: int, t: torch.Tensor) -> None:
        self.refs[key], self.sizes[key] = 0, t.untyped_storage().nbytes()
        self.current += self.sizes[key]
        self.peak = max(self.peak, self.current)

    def _release(self, key: int) -> None:
        if key in self.refs:
            self.refs[key] -= 1
            if not self.refs[key]:
                del self.refs[key]
                self.current -= self.sizes.pop(key)


class MemoryMeter:
    """`with MemoryMeter(device) as m: ...` then `m.peak_bytes` (bytes above the starting level)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.mode = None if self.device.type == "cuda" else LiveBytes()

    def __enter__(self) -> MemoryMeter:
        if self.mode is None:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.mode is None:
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self.mode.__exit__(*exc)
            self.peak_bytes = self.mode.peak


def peak_bytes(device: torch.device, fn, *args) -> int:
    with MemoryMeter(device) as meter:
        fn(*args)
    return meter.peak_bytes


@dataclasses.dataclass
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
    refresh_chunk_tokens: int | None = None     # a Refresh over the token budget: its chunk and peaks
    long_refresh_peak_bytes: int = 0
    long_reuse_peak_bytes: int = 0
    long_canvas: bool = True                    # False: no canvas past the token budget is served

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def budget_from_free(free: int, resident: int, utilization: float) -> int:
    """The default GPU budget: `utilization` of the memory free before the weights (`resident`) loaded."""
    return int((free + resident) * utilization)


def weights_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def default_budget(model: DenseLM, config: EngineConfig) -> int:
    if config.memory_budget is not None:
        return config.memory_budget
    if model.device.type == "cuda":   # measured with the weights loaded: they count as free
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(model.device)
        return budget_from_free(free, weights_bytes(model), config.gpu_memory_utilization)
    raise ValueError("a memory budget is needed to profile on CPU (e.g. --memory-budget 4GiB)")


def _synthetic(runner: ModelRunner, mode: str, n: int, block: int, scratch: bool = False) -> Request:
    """A one-block canvas of `n` tokens, its KV reserved in the runner's pool (`scratch`: all at the scratch slot)."""
    model, pool, config = runner.model, runner.pool, runner.config
    params = SamplingParams(gen_length=block, steps=1, block_length=block, temperature=1.0 if config.sampling else 0.0)
    req = Request(f"profile-{n}", [0] * (n - block), params, model.config.mask_token_id, model.device, cache=mode)
    req.kv_pool, req.kv_tokens = pool, kv_need(mode, n, block, config.retention)
    req.slots = (torch.full((max(req.kv_tokens, 1),), pool.scratch, dtype=torch.long, device=model.device)
                 if scratch else pool.reserve(req.kv_tokens))
    return req


def _measure(runner: ModelRunner, mode: str, phase: Phase, shapes: list[tuple[int, int]]) -> int:
    """The peak bytes of one step of synthetic (canvas, block) `shapes`, their caches reserved outside it."""
    batch = [(_synthetic(runner, mode, n, block), phase) for n, block in shapes]
    peak = peak_bytes(runner.model.device, runner.run, batch)
    for req, _ in batch:
        runner.pool.release(req.kv_tokens, req.slots)
    return peak


def mode_peaks(model: DenseLM, config: EngineConfig, backend: str, max_model_len: int) -> dict[str, tuple]:
    """{mode: (Refresh peak, the token budget of short Reuses' peak, the largest Reuse's)}."""
    runner = _scratch_runner(model, config, backend, max_model_len)
    modes = ("dual", "sparse") if config.cache == AUTO else (config.cache,)
    return {mode: _peaks(runner, config, max_model_len, mode) for mode in modes}


def _peaks(runner: ModelRunner, config: EngineConfig, max_model_len: int, mode: str) -> tuple[int, int, int]:
    T, L = config.max_num_batched_tokens, min(max_model_len, config.max_num_batched_tokens)
    n = max(1, min(config.max_num_seqs, T // L))
    rest = T - n * L
    tail = [(rest, rest - 1)] if rest >= 2 and n < config.max_num_seqs else []
    refresh_peak = _measure(runner, mode, REFRESH_PHASE[mode], [(L, L - 1)] * n + tail)
    if mode == "none":
        return refresh_peak, 0, 0
    bl = min(32, max(1, L // 2))
    many = [(2 * bl, bl)] * max(1, min(config.max_num_seqs, T // bl))
    return (refresh_peak, _measure(runner, mode, Phase.REUSE, many),
            _measure(runner, mode, Phase.REUSE, [(L, min(bl, L - 1))]))


def _scratch_runner(model: DenseLM, config: EngineConfig, backend: str, max_model_len: int) -> ModelRunner:
    """An eager runner over an unbounded pool, its Reuse keys gathered (a fragmented pool's peak)."""
    pool = KVPool(None, model.config, model.dtype, model.device)
    runner = ModelRunner(model, dataclasses.replace(config, cuda_graphs=False), backend, pool, max_model_len)
    runner.in_place_keys = False
    return runner


def _chunked_refresh_peaks(runner: ModelRunner, req: Request, chunks: list[int]) -> dict[int, int]:
    """{chunk: peak bytes} of `req`'s chunked Refresh: its state, then each moment on the first layer."""
    model, blk, step = runner.model, runner.model.blocks[0], max(chunks)
    with MemoryMeter(model.device) as state:
        run = LongRefresh(model, req, REFRESH_PHASE[req.cache], runner.config, runner.backend)
    for a in range(0, req.length, step):
        run.kv_pass(blk, a, min(a + step, req.length))
    cache = peak_bytes(model.device, run.cache, 0, blk, runner.pool.storage)
    moments = {c: max(peak_bytes(model.device, f, blk, 0, c) for f in (run.kv_pass, run.chunk_pass)) for c in chunks}
    return {c: state.peak_bytes + max(cache, moment) for c, moment in moments.items()}


def long_canvas_peaks(runner: ModelRunner, modes: dict[str, tuple], peak: int, room: int) -> tuple[int, int, int]:
    """Canvases up to max_model_len: (the Refresh chunk chosen, its chunked Refresh's peak, a long Reuse's peak)."""
    config, T, longest = runner.config, runner.config.max_num_batched_tokens, runner.max_model_len
    powers = [c for c in (MIN_CHUNK * 2**k for k in range(32)) if c <= T] or [T]
    chunks = [config.refresh_chunk_tokens] if config.refresh_chunk_tokens else powers
    refresh, reuse = dict.fromkeys(chunks, 0), 0
    if config.cache in ("none", AUTO):
        refresh = _chunked_refresh_peaks(runner, _synthetic(runner, "none", longest, min(32, T), scratch=True), chunks)
    slots = max(0, room - max(peak, min(refresh.values()))) // runner.pool.bytes_per_token   # after none's least
    for mode in (m for m in modes if m != "none"):
        held = bisect.bisect_right(range(longest + 1), slots, key=lambda n: kv_need(mode, n, 1, config.retention)) - 1
        if held <= T:
            continue
        req = _synthetic(runner, mode, held, min(32, T), scratch=True)
        for c, p in _chunked_refresh_peaks(runner, req, chunks).items():
            refresh[c] = max(refresh[c], p)
        reuse = max(reuse, peak_bytes(runner.model.device, runner.run, [(req, Phase.REUSE)]) + modes[mode][1])
    fits = [c for c, p in refresh.items() if p <= peak]
    chunk = max(fits) if fits else max(c for c, p in refresh.items() if p <= min(refresh.values()) * NEAR_BEST)
    return chunk, refresh[chunk], reuse


@torch.no_grad()
def profile_kv_pool(model: DenseLM, config: EngineConfig, backend: str, max_model_len: int) -> MemoryProfile:
    budget, wb, bpt = default_budget(model, config), weights_bytes(model), bytes_per_token(model.config, model.dtype)
    modes = mode_peaks(model, config, backend, max_model_len)
    refresh_peak, reuse_peak = max(p[0] for p in modes.values()), max(p[1] + p[2] for p in modes.values())
    peak, guard = max(refresh_peak, reuse_peak), int(budget * config.guard_fraction)
    room = budget - wb - guard
    chunk, long_refresh, long_reuse = None, 0, 0
    if max_model_len > config.max_num_batched_tokens and serves_long(config):
        runner = _scratch_runner(model, config, backend, max_model_len)
        chunk, long_refresh, long_reuse = long_canvas_peaks(runner, modes, peak, room)
    graph_pool = cuda_graphs_on(config.cuda_graphs, model.device) and config.cache != "none"   # captured graphs' memory
    short = peak + (reuse_peak if graph_pool else 0)
    peak = max(peak, long_refresh, long_reuse) + (max(reuse_peak, long_reuse) if graph_pool else 0)
    if chunk is not None and peak > room >= short:
        chunk, long_refresh, long_reuse, peak = None, 0, 0, short
    if peak > room:
        raise ValueError(f"memory budget {budget / 2**20:.0f} MiB is too small: weights {wb / 2**20:.0f} MiB + "
                         f"activation peak {peak / 2**20:.0f} MiB + guard {guard / 2**20:.0f} MiB")
    tokens = (room - peak) // bpt
    return MemoryProfile(budget, wb, peak, refresh_peak, reuse_peak, guard, tokens * bpt, tokens, bpt,
                         config.max_num_logits, config.max_num_batched_tokens, config.max_num_seqs, config.cache,
                         config.retention, chunk, long_refresh, long_reuse, chunk is not None)
