"""Arrival-time generators for the serving benchmark.

Every generator returns a float64 numpy array of absolute arrival offsets in seconds,
non-decreasing, with the first request at t = 0 (as `vllm bench serve` sends the first request at
once, then sleeps one sampled gap per request). Runs are bounded by `num_prompts` (count),
`duration` (keep arrivals with offset < duration) or both (whichever bound is hit first); rps =
inf puts every request at t = 0. Rates and burstiness follow vLLM's `--request-rate` /
`--burstiness` (`gamma_arrivals`). Randomness comes from `np.random.default_rng([seed,
_ARRIVAL_STREAM])`, a stream separate from the dataset code's length and prompt streams, so a
seed gives the same arrival times for every dataset (handy when comparing datasets at one rate).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

ARRIVAL_KINDS = ("poisson", "gamma", "trace")
_ARRIVAL_STREAM = 0
# Gaps are drawn in fixed-size chunks whatever the bound, so a duration-bounded run and a
# count-bounded run with the same seed share the same prefix of arrivals.
_CHUNK = 4096


def _check_rate(rps: float) -> float:
    try:
        rps = float(rps)
    except (TypeError, ValueError):
        raise ValueError(f"rps must be a number > 0 (or inf), got {rps!r}") from None
    if math.isnan(rps) or rps <= 0:
        raise ValueError(f"rps must be > 0 (or inf for all requests at t=0), got {rps}")
    return rps


def _check_bounds(num_prompts: int | None, duration: float | None) -> tuple[int | None, float | None]:
    """Validate the run bounds and return them normalized (int count, float seconds)."""
    if num_prompts is None and duration is None:
        raise ValueError("give num_prompts or duration to bound the arrivals")
    if num_prompts is not None:
        ok = (not isinstance(num_prompts, bool) and isinstance(num_prompts, (int, float, np.integer))
              and float(num_prompts).is_integer() and num_prompts >= 1)
        if not ok:
            raise ValueError(f"num_prompts must be an integer >= 1, got {num_prompts!r}")
        num_prompts = int(num_prompts)
    if duration is not None:
        ok = (not isinstance(duration, bool) and isinstance(duration, (int, float, np.number))
              and math.isfinite(duration) and duration > 0)
        if not ok:
            raise ValueError(f"duration must be a finite number of seconds > 0, got {duration!r}")
        duration = float(duration)
    return num_prompts, duration


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def _renewal(draw: Callable[[int], np.ndarray], num_prompts: int | None,
             duration: float | None) -> np.ndarray:
    """Cumulate gaps from `draw(chunk)` after a first arrival at 0 until a bound is reached."""
    limit = num_prompts if num_prompts is not None else math.inf
    times = [np.zeros(1)]
    count, t = 1, 0.0
    while count < limit:
        chunk = t + np.cumsum(draw(_CHUNK))
        if duration is not None:
            chunk = chunk[chunk < duration]
        if num_prompts is not None:
            chunk = chunk[: num_prompts - count]
        times.append(chunk)
        count += len(chunk)
        if len(chunk) < _CHUNK:  # a bound cut this chunk short: done
            break
        t = float(chunk[-1])
    return np.concatenate(times)


def _all_at_zero(num_prompts: int | None) -> np.ndarray:
    if num_prompts is None:
        raise ValueError("rps=inf sends every request at t=0, so it needs num_prompts, not duration")
    return np.zeros(int(num_prompts))


def poisson_arrivals(rps: float, *, num_prompts: int | None = None, duration: float | None = None,
                     seed: int = 0) -> np.ndarray:
    """Poisson process at `rps` requests/s: exponential gaps with mean 1/rps."""
    rps = _check_rate(rps)
    num_prompts, duration = _check_bounds(num_prompts, duration)
    _check_seed(seed)
    if math.isinf(rps):
        return _all_at_zero(num_prompts)
    rng = np.random.default_rng([seed, _ARRIVAL_STREAM])
    return _renewal(lambda n: rng.exponential(1.0 / rps, size=n), num_prompts, duration)


def gamma_arrivals(rps: float, burstiness: float = 1.0, *, num_prompts: int | None = None,
                   duration: float | None = None, seed: int = 0) -> np.ndarray:
    """Gamma renewal process (vLLM's definition, vllm-project/vllm@def9ce85ba1079af970a58ed3d42dd861ae35d58
    vllm/benchmarks/serve.py): gaps ~ Gamma(shape=k, scale=1/(rps*k)) with k = burstiness, so the
    mean gap is 1/rps for every k and the coefficient of variation 1/sqrt(k): k = 1 is Poisson,
    k < 1 burstier, k = inf constant gaps 1/rps. vLLM's rescaling of the cumulated delays to land
    the last arrival on num_prompts/rps is not applied: the statistical tests check the raw
    renewal process."""
    rps = _check_rate(rps)
    try:
        k = float(burstiness)
    except (TypeError, ValueError):
        raise ValueError(f"burstiness must be a number > 0, got {burstiness!r}") from None
    if math.isnan(k) or k <= 0:
        raise ValueError(f"burstiness must be > 0 (1 = Poisson, < 1 burstier), got {burstiness}")
    num_prompts, duration = _check_bounds(num_prompts, duration)
    _check_seed(seed)
    if math.isinf(rps):
        return _all_at_zero(num_prompts)
    if math.isinf(k):  # the k -> inf limit of Gamma(k, 1/(rps k)) is a constant gap
        return _renewal(lambda n: np.full(n, 1.0 / rps), num_prompts, duration)
    rng = np.random.default_rng([seed, _ARRIVAL_STREAM])
    return _renewal(lambda n: rng.gamma(k, 1.0 / (rps * k), size=n), num_prompts, duration)


def trace_arrivals(timestamps: Sequence[float] | np.ndarray, *, time_scale: float = 1.0,
                   num_prompts: int | None = None, duration: float | None = None) -> np.ndarray:
    """Replay recorded timestamps: shift so the first is 0, divide by `time_scale`.

    time_scale > 1 replays faster (e.g. 60 turns a minute of trace into a second). Timestamps must
    be finite and non-decreasing (the caller sorts rows, not this function, so that arrival i still
    belongs to row i). With no bound the whole trace is replayed.
    """
    try:
        ts = np.asarray(timestamps, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError("trace timestamps must be numbers") from None
    if ts.size == 0:
        raise ValueError("trace has no timestamps")
    if not np.all(np.isfinite(ts)):
        raise ValueError("trace timestamps must be finite numbers")
    if np.any(np.diff(ts) < 0):
        i = int(np.argmax(np.diff(ts) < 0)) + 1
        raise ValueError(f"trace timestamps must be non-decreasing (index {i}: {ts[i]} < {ts[i - 1]})")
    try:
        ok = float(time_scale) > 0 and math.isfinite(float(time_scale))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
    if num_prompts is not None or duration is not None:
        num_prompts, duration = _check_bounds(num_prompts, duration)
    out = (ts - ts[0]) / float(time_scale)
    if duration is not None:
        out = out[out < duration]
    if num_prompts is not None:
        out = out[: int(num_prompts)]
    return out


def generate_arrivals(kind: str, rps: float = math.inf, *, burstiness: float = 1.0,
                      num_prompts: int | None = None, duration: float | None = None, seed: int = 0,
                      timestamps: Sequence[float] | np.ndarray | None = None,
                      time_scale: float = 1.0) -> np.ndarray:
    """Dispatch on `kind` in ARRIVAL_KINDS ('poisson' | 'gamma' | 'trace')."""
    if kind == "poisson":
        # Refuse rather than silently ignore a burstiness the user asked for.
        if float(burstiness) != 1.0:
            raise ValueError(f"burstiness={burstiness} only applies to gamma arrivals "
                             "(poisson is gamma with burstiness 1)")
        return poisson_arrivals(rps, num_prompts=num_prompts, duration=duration, seed=seed)
    if kind == "gamma":
        return gamma_arrivals(rps, burstiness, num_prompts=num_prompts, duration=duration, seed=seed)
    if kind == "trace":
        if timestamps is None:
            raise ValueError("trace arrivals need timestamps (a dataset file with a timestamp column)")
        return trace_arrivals(timestamps, time_scale=time_scale, num_prompts=num_prompts,
                              duration=duration)
    raise ValueError(f"unknown arrival process {kind!r}; choose one of {', '.join(ARRIVAL_KINDS)}")
