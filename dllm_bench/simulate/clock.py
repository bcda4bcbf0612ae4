"""The virtual clock and the wrapper that puts a serving system on it.

`dllm_bench.serve.loadgen.run_open_loop` takes its clock and sleep as arguments: the simulator
passes `VirtualClock.now` and `VirtualClock.sleep`, so arrivals, idling and deadlines are
serve's own loop, in simulated seconds. A step advances the clock by its cost (the cost
runner/policy charges it). The systems stamp requests with `time.perf_counter()`;
`VirtualTimed` restamps each output with the virtual times at which the request was admitted,
finished its first block, each block, and finished, and charges the step that ends an idle gap the profile's
wake cost and each request handed over its add cost. An idle sleep returns as late as the
profile's machine returns from one (`Hardware.overshoot`): serve's loop hands a request over
only when it wakes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


class VirtualClock:
    def __init__(self, overshoot: Callable[[float], float] | None = None) -> None:
        self.t, self.overshoot = 0.0, overshoot

    def now(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        dt = max(0.0, dt)
        self.t += dt + (self.overshoot(dt) if self.overshoot is not None and dt > 0 else 0.0)

    def advance(self, dt: float) -> None:
        self.t += dt


class VirtualTimed:
    """A serving system (engine or static batch) whose step() the cost model times. `members`
    returns the requests the step just ran (the cost runner/policy records them)."""

    def __init__(self, system: Any, clock: VirtualClock, members: Callable[[], list],
                 wake: Callable[[float], float] | None = None, add_cost: float = 0.0):
        self.system, self.clock, self.members, self.wake, self.add_cost = system, clock, members, wake, add_cost
        self.times: dict[str, list] = {}       # request id -> [admitted, first_token, finished, block ends]
        self.last_end = 0.0                    # a point starts right after serve's warm-up

    def add_request(self, *args, **kwargs) -> str:
        self.clock.advance(self.add_cost)
        return self.system.add_request(*args, **kwargs)

    def has_unfinished(self) -> bool:
        return self.system.has_unfinished()

    def abort(self, request_id: str) -> None:
        self.system.abort(request_id)

    def stats(self) -> dict:
        return self.system.stats()

    def step(self) -> list:
        start = self.clock.now()
        if self.wake is not None:
            self.clock.advance(self.wake(start - self.last_end))
        outs = self.system.step()
        end = self.last_end = self.clock.now()
        for req in self.members():
            t = self.times.setdefault(req.request_id, [start, None, None, []])
            if t[1] is None and req.first_token_time is not None:
                t[1] = end
            t[3] += [end] * (len(req.block_times) - len(t[3]))   # blocks this step committed
        for o in outs:
            t = self.times.pop(o.request_id, [start, end, end, []])
            o.admitted_time, o.first_token_time, o.finished_time = t[0], t[1] if t[1] is not None else end, end
            o.block_times = t[3] + [end] * (len(o.block_times) - len(t[3]))
        return outs
