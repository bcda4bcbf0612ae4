"""The largest static batch a baseline can run within a memory budget, measured: the paper's
"max-fit" scenario for request-level systems (`profile_max_batch`, `measure_run`)."""
from __future__ import annotations

import gc
from collections.abc import Callable

import torch

from baselines.registry import make_system
from engine.models import DenseLM
from engine.profiler import MemoryMeter, weights_bytes
from engine.sampling import SamplingParams


def profile_max_batch(model: DenseLM, memory_budget_bytes: int, prompt_len: int, gen_length: int,
                      block_length: int = 32, steps: int | None = None, system: str = "llada",
                      knobs: dict | None = None, measure: Callable[[int], int] | None = None,
                      max_batch: int = 4096, run_steps: int | None = None) -> tuple[int, int]:
    """Largest static batch B whose measured peak (activations incl. full-sequence logits +
    caches, weights excluded) fits `memory_budget_bytes - weights`. Returns (B, measured peak at B).

    `measure(B) -> peak bytes` defaults to running `system` at batch B under engine.profiler's
    MemoryMeter for `run_steps` steps (None: the first block plus one step, which visits every
    phase of every policy with its caches held; pass a large number for a whole generation).
    The search assumes the peak grows with B: it starts at the affine prediction from B = 1 and
    2, then doubles or bisects. A B the device runs out of memory at (CUDA OOM: the budget is
    more than the device can give, or fragmentation) does not fit either."""
    avail = memory_budget_bytes - weights_bytes(model)
    if measure is None:
        measure = lambda B: measure_run(model, B, prompt_len, gen_length, block_length, steps, system, knobs, run_steps)  # noqa: E731
    cache: dict[int, int] = {}
    oom: set[int] = set()

    def fits(B: int) -> bool:
        if B in oom:
            return False
        if B not in cache:
            try:
                cache[B] = measure(B)
            except torch.OutOfMemoryError:
                oom.add(B)
            if B in oom:  # outside the handler: the failed run's tensors are unreferenced by now
                gc.collect()
                torch.cuda.empty_cache()
                return False
        return cache[B] <= avail

    if not fits(1):
        if 1 in oom:
            raise ValueError(f"batch 1 ran out of device memory (the budget leaves {avail} bytes beyond the weights)")
        raise ValueError(f"batch 1 needs {cache[1]} bytes beyond the weights but the budget leaves {avail}")
    # A static batch's peak is affine in B (per-request activations, logits and caches), so B = 1
    # and 2 predict the boundary and the search starts there: each measurement at a large B
    # costs B requests' forwards, and doubling from 1 measured ~3x the requests. The answer is
    # the same largest fitting B; the prediction only chooses where the measurements begin.
    lo, hi = 1, 2
    if max_batch >= 2 and fits(2):
        lo, hi, slope = 2, 3, cache[2] - cache[1]
        guess = max_batch if slope <= 0 else min(max_batch, 1 + (avail - cache[1]) // slope)
        if guess > lo:
            lo, hi = (guess, guess + 1) if fits(guess) else (lo, guess)
        if hi == lo + 1:                   # lo fits, hi is unmeasured: double until one does not
            while hi <= max_batch and fits(hi):
                lo, hi = hi, hi * 2
    hi = min(hi, max_batch + 1)
    while hi - lo > 1:                     # invariant: lo fits, hi does not (or is past max_batch)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, cache[lo]


def measure_run(model: DenseLM, batch_size: int, prompt_len: int, gen_length: int, block_length: int = 32,
                steps: int | None = None, system: str = "llada", knobs: dict | None = None,
                run_steps: int | None = None) -> int:
    """Peak bytes (beyond what was live before) of a static batch of `batch_size` synthetic requests."""
    params = SamplingParams(gen_length=gen_length, steps=steps or gen_length, block_length=block_length)
    sysm = make_system(system, model, max_batch_size=batch_size, **(knobs or {}))
    g = torch.Generator().manual_seed(0)
    hi = min(model.config.mask_token_id, model.config.padded_vocab)
    for _ in range(batch_size):
        sysm.add_request(torch.randint(0, hi, (prompt_len,), generator=g).tolist(), params)
    n = run_steps if run_steps is not None else params.steps_per_block + 1
    with MemoryMeter(model.device) as meter:
        for _ in range(n):
            if not sysm.has_unfinished():
                break
            sysm.step()
        sysm.batch = None
    return int(meter.peak_bytes)
