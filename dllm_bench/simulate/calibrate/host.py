"""Each system's host time: its real code's timed steps on this machine, each paired with the
Forward the simulator would charge for it, and the fit of what the operators do not explain
(`fit_host`) as c_step + c_seq·n_seq + c_row·rows per system.

The engine runs with a recording `CostRunner` around its real ModelRunner (so the Forward is
read off exactly the batch the Scheduler built); a baseline runs its real policy under a
recording wrapper. Each system runs `sizes` concurrent requests (all at t = 0) after one
warm-up request, as serve's worker warms up before it measures.
"""
from __future__ import annotations

import gc
import time
from dataclasses import replace

import numpy as np
import torch

from baselines import make_policy
from baselines.static_batch import Batch, Delegating, Policy, StaticBatchSystem, StepResult
from dllm_bench.simulate.calibrate.mode import CPU, Mode
from dllm_bench.simulate.clock import VirtualClock
from dllm_bench.simulate.cost_model import CostModel, Forward, HostCost, ModelShape
from dllm_bench.simulate.runners import CostRunner
from dllm_bench.simulate.work import baseline_forward
from dllm_bench.timing import device_sync
from engine.config import cuda_graphs_on
from engine.engine import LLMEngine


class RecordingPolicy(Delegating):
    """The real policy, with the Forward of each of its steps recorded."""

    def __init__(self, real: Policy, shape: ModelShape):
        super().__init__(real)
        self.shape = shape
        self.forwards: list[Forward] = []

    def step(self, batch: Batch) -> StepResult:
        self.forwards.append(baseline_forward(self.name, self.knobs, batch, self.shape)[0])
        return self.real.step(batch)


def _timed_steps(system, forwards: list, prompts, params, device, max_steps: int | None = None
                 ) -> list[tuple[Forward, float]]:
    """Each step's (Forward, wall seconds) over `prompts` run at once; after `max_steps` steps the
    requests are aborted (a GPU's steps repeat their shapes: a block's worth tells what 256 would)."""
    wait = device_sync(device) or (lambda: None)
    ids = [system.add_request(p, params) for p in prompts]
    out = []
    while system.has_unfinished():
        if max_steps is not None and len(out) >= max_steps:
            for rid in ids:
                system.abort(rid)
            break
        n = len(forwards)
        wait()
        t0 = time.perf_counter()
        system.step()
        wait()
        dt = time.perf_counter() - t0
        if len(forwards) > n:
            out.append((forwards[-1], dt))
    return out


def _warm_then_time(system, forwards: list, prompts, params, device, mode: Mode) -> list[tuple[Forward, float]]:
    """The CPU's warm-up is one request; a GPU's is the batch itself for `mode.warm_steps` steps
    (its shapes' kernels chosen, its memory allocated, its CUDA graphs captured), aborted."""
    if mode.warm_steps is None:
        _timed_steps(system, forwards, prompts[:1], params, device)
    else:
        _timed_steps(system, forwards, prompts, params, device, mode.warm_steps)
    return _timed_steps(system, forwards, prompts, params, device, mode.timed_steps)


def engine_steps(model, config, shape: ModelShape, prompts, params, mode: Mode = CPU) -> list[tuple[Forward, float]]:
    fws: list[Forward] = []
    eng = plain_engine(model, config)
    try:
        # the Forward of a step replayed through a CUDA graph is padded to its bucket, a capture marked
        eng.runner = CostRunner(model.config, config, shape, lambda fw: fws.append(fw) or 0.0, VirtualClock(),
                                model.dtype, inner=eng.runner, graphs=cuda_graphs_on(config.cuda_graphs, model.device))
        return _warm_then_time(eng, fws, prompts, params, model.device, mode)
    finally:
        del eng
        release(model.device)


def baseline_steps(model, name: str, knobs: dict, shape: ModelShape, prompts, params,
                   mode: Mode = CPU) -> list[tuple[Forward, float]]:
    pol = RecordingPolicy(make_policy(name, model, **knobs), shape)
    system = StaticBatchSystem(model, pol, max_batch_size=len(prompts))
    try:
        return _warm_then_time(system, pol.forwards, prompts, params, model.device, mode)
    finally:
        del system, pol
        release(model.device)


def release(device) -> None:
    """Free what a finished system held before the next one is built. The engine profiles its KV
    pool from the free memory CUDA reports, and neither a system kept alive by a reference cycle
    nor the blocks PyTorch's allocator caches count as free: without this each batch size's
    engine would get a smaller pool than the last, and a baseline's batch could run out of memory."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def plain_engine(model, config):
    return LLMEngine(config, model=model)


def plain_baseline(model, name: str, knobs: dict):
    return StaticBatchSystem(model, make_policy(name, model, **knobs), max_batch_size=1)


ROWS_SPLIT, REWEIGHTS = 64, 5


def fit_host(steps: list[tuple[Forward, float]], device: CostModel, per_row: bool = True,
             relative: bool = True) -> tuple[HostCost, dict]:
    """c_step + c_seq·n_seq + c_row·query rows (all >= 0) fitted by least squares to the step time
    the device model leaves. A squared loss on time (not log time) fits the *mean* step: on a shared
    machine that includes the time the process waits for a core, which serving on it pays too.
    The row term carries what grows with a forward's tokens but not with its operators' FLOPs and
    bytes (per-token host work; small operators slower than their isolated timings); without it
    that time lands on c_seq and a lone request's block steps are charged for the canvases of a
    batch (`per_row=False`: the two-term fit, kept for comparison).

    `relative`: each step's residual is divided by the step's fitted time (iteratively
    reweighted; the weights come from the fit, not from the noisy measurement, so a fast outlier
    does not pull the fit down). A step's noise is a share of its length, and three terms cannot
    follow every batch size exactly: unweighted, the few long steps of the largest batch decide
    where the misfit goes, and it went to the many short steps of a lone request, the batch a
    static-batch baseline serves at low load.

    A step that captured a CUDA graph (the first of its bucket) is left out of the fit: its
    excess over what the fit charges, the median over those steps, is the capture's cost
    (c_capture). A term the fit put at its bound (0) is listed as `unresolved`: the steps timed
    cannot tell it from the others, which is not the same as costing nothing."""
    from scipy.optimize import nnls  # scipy costs ~0.5 s to import: only a calibration fits

    captures = [(fw, t) for fw, t in steps if fw.capture]
    steps = [(fw, t) for fw, t in steps if not fw.capture] or steps
    cols = [[1.0, fw.n_seq] + ([fw.query_tokens] if per_row else []) for fw, _ in steps]
    A = np.array(cols, dtype=float)
    dev = np.array([device.step(fw).t_device for fw, _ in steps])
    meas = np.array([t for _, t in steps])
    x, _ = nnls(A, meas - dev)
    for _ in range(REWEIGHTS if relative else 0):
        fitted = dev + A @ x
        x, _ = nnls(A / fitted[:, None], (meas - dev) / fitted)
    # a term whose part of the mean step is nil sits at its bound: unresolved (and exactly 0)
    nil = x * A.mean(axis=0) <= 1e-6 * meas.mean()
    x = np.where(nil, 0.0, x)
    unresolved = [name for name, z in zip(("c_step", "c_seq", "c_row"), nil) if z]
    host = HostCost(c_step=float(x[0]), c_seq=float(x[1]), c_row=float(x[2]) if per_row else 0.0)
    if captures:
        extra = [t - device.step(fw).t_device - host.time(fw.n_seq, device.m.layers, fw.query_tokens) for fw, t in captures]
        host = replace(host, c_capture=max(0.0, float(np.median(extra))))
    pred = dev + A @ x
    signed = (pred - meas) / meas
    rel = np.abs(signed)
    # Signed error by the forward's query rows: a cost model that is right overall but wrong per
    # GEMM size shows up as opposite signs for small (block, window) and large (canvas) forwards.
    rows = np.array([fw.query_tokens for fw, _ in steps])
    by_rows = {f"<= {ROWS_SPLIT}": signed[rows <= ROWS_SPLIT], f"> {ROWS_SPLIT}": signed[rows > ROWS_SPLIT]}
    n_seq = A[:, 1].astype(int)
    sizes = sorted(set(n_seq))
    return host, {"steps": len(steps), "captures": len(captures), "unresolved": unresolved,
                  "median_rel_err": float(np.median(rel)), "max_rel_err": float(rel.max()),
                  "mean_step_s": float(meas.mean()),
                  "median_err_by_rows": {k: float(np.median(v)) for k, v in by_rows.items() if v.size},
                  "median_err_by_seqs": {str(n): float(np.median(signed[n_seq == n])) for n in sizes},
                  # what a request of n sequences is charged in all, over what its steps took
                  "total_err_by_seqs": {str(n): float(pred[n_seq == n].sum() / meas[n_seq == n].sum() - 1) for n in sizes},
                  "mean_rows_by_seqs": {str(n): float(rows[n_seq == n].mean()) for n in sizes}}
