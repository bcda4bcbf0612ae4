"""Every doctor check in order, each guarded: a check that raises is a failed row with the
exception's text, and the checks after it still run (a broken install is what doctor is for)."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from dllm_bench.doctor import checks as ck
from dllm_bench.doctor import generation, layer_timing
from dllm_bench.doctor.checks import FAIL, Check


def guarded(name: str, fn: Callable[[], Check | list[Check]]) -> list[Check]:
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001  (doctor reports, it does not crash)
        return [Check(name, FAIL, f"{type(e).__name__}: {e}".splitlines()[0])]
    return out if isinstance(out, list) else [out]


def run_checks(dev: torch.device, model_dir: Path | None,
               progress: Callable[[str], None] = lambda name: None) -> tuple[list[Check], float]:
    t0 = time.perf_counter()
    out: list[Check] = []
    checkpoint: Check | None = None

    def memory() -> Check:
        weights = checkpoint.data.get("bytes") if checkpoint is not None and checkpoint.status != FAIL else None
        return ck.memory_check(dev, weights)

    steps: list[tuple[str, Callable[[], Check | list[Check]]]] = [
        ("device", lambda: ck.device_check(dev)),
        ("torch", lambda: ck.torch_check(dev)),
        ("attention", lambda: ck.attention_check(dev)),
        ("dtypes", lambda: ck.dtype_check(dev)),
        ("checkpoint", lambda: ck.checkpoint_check(model_dir)),
        ("memory", memory),
        ("generate", lambda: generation.generation_checks(dev)),
        ("layer timing", lambda: layer_timing.layer_check(dev)),
    ]
    for name, fn in steps:
        progress(name)
        rows = guarded(name, fn)
        if name == "checkpoint":
            checkpoint = rows[0]
        out += rows
    # The table reads in the order a user fixes things: the machine, then the model on it.
    order = ["device", "torch", "attention", "dtypes", "memory", "checkpoint"]
    out.sort(key=lambda c: order.index(c.name) if c.name in order else len(order))
    return out, time.perf_counter() - t0
