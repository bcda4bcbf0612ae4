"""The longest canvas a system runs within the budget, found by measurement: lengths on a grid
of `resolution` tokens, doubled from the shortest until one does not fit (or the cap), then
bisected. Every probe is a whole request measured (`trace.measure`); the answer is a length
that fit whose next grid length up did not (or the cap)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dllm_bench.memory_bench.trace import Trace


@dataclass
class Search:
    system: str
    max_length: int | None            # None: not even the shortest fits
    first_failing: int | None         # the grid length above it that did not fit (None: the cap was reached)
    cap: int
    probes: list[Trace] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"system": self.system, "max_length": self.max_length, "first_failing": self.first_failing,
                "cap": self.cap, "probes": [{"length": t.length, "fits": t.fits, "peak_bytes": t.peak,
                                             "reason": t.reason, "cache": t.cache} for t in self.probes]}


def max_length(system: str, probe: Callable[[int], Trace], shortest: int, cap: int, resolution: int,
               progress: Callable[[str], None] | None = None) -> Search:
    """`probe(L)` measures a request of L canvas tokens; lengths are multiples of `resolution`
    from `shortest` (rounded up) to `cap` (rounded down). Assumes a longer canvas never needs
    less memory."""
    grid = lambda n: -(-n // resolution) * resolution       # noqa: E731  (round up to the grid)
    lo_len, top = grid(shortest), cap // resolution * resolution
    s = Search(system, None, None, cap)
    seen: dict[int, bool] = {}

    def fits(n: int) -> bool:
        if n not in seen:
            t = probe(n)
            s.probes.append(t)
            seen[n] = t.fits
            if progress:
                progress(f"{system}: {n} tokens {'fits' if t.fits else 'does not fit (' + t.reason + ')'}")
        return seen[n]

    if lo_len > top or not fits(lo_len):
        s.first_failing = lo_len if lo_len <= top else None
        return s
    lo, hi = lo_len, None
    while hi is None:
        nxt = min(2 * lo, top)
        if nxt == lo:
            break
        if fits(nxt):
            lo = nxt
        else:
            hi = nxt
    while hi is not None and hi - lo > resolution:
        mid = grid((lo + hi) // 2)
        mid = mid if lo < mid < hi else lo + resolution
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    s.max_length, s.first_failing = lo, hi
    return s
