"""The look-ahead plan of `scheduler=lookahead` (the paper's §7; docs/SCHEDULER.md)."""
from __future__ import annotations

import numpy as np

from engine.request import Request, phase_at


def planned_block_steps(req: Request) -> int:
    """The most steps a block of `req` takes: its schedule's, else (parallel decoding) `block_length`."""
    return req.steps_per_block if req.decoding.fixed else req.block_length


def planned_costs(req: Request, cache: str, delay_step: int, blocks: dict | None = None) -> np.ndarray:
    """Query tokens of `req`'s remaining planned steps (`blocks`: a memo of one block's costs)."""
    n, i = planned_block_steps(req), req.step_in_block

    def cost(k: int) -> int:
        return req.query_cost(phase_at(k, cache, delay_step))

    key = (n, req.length, req.block_length, cache)
    block = blocks.get(key) if blocks is not None else None
    if block is None:
        block = np.array([cost(k) for k in range(n)], dtype=np.int64)
        if blocks is not None:
            blocks[key] = block
    # A block past its planned end (it ran long) still needs at least one more step.
    current = block[i:] if i < n else np.array([cost(i)], dtype=np.int64)
    return np.concatenate([current, np.tile(block, req.num_blocks - req.block - 1)])


class Ledger:
    """Planned query tokens of every future step (absolute step numbers; beyond the array: none)."""

    def __init__(self, size: int = 1024):
        self.base = 0                       # the absolute step of tokens[0]
        self.tokens = np.zeros(size, dtype=np.int64)

    def _hold(self, end: int) -> None:
        n = end - self.base
        if n > len(self.tokens):
            self.tokens = np.concatenate([self.tokens, np.zeros(max(n, 2 * len(self.tokens)) - len(self.tokens),
                                                                dtype=np.int64)])

    def at(self, t: int) -> int:
        i = t - self.base
        return int(self.tokens[i]) if i < len(self.tokens) else 0

    def window(self, start: int, n: int) -> np.ndarray:
        self._hold(start + n)
        return self.tokens[start - self.base : start - self.base + n]

    def add(self, slots: np.ndarray, costs: np.ndarray, sign: int = 1) -> None:
        if len(slots):
            self._hold(int(slots[-1]) + 1)
            self.tokens[slots - self.base] += sign * costs

    def forget_before(self, t: int) -> None:
        """Steps before t are history: drop them once they are half the array (amortised O(1))."""
        k = t - self.base
        if k >= len(self.tokens) // 2:
            self.tokens = np.concatenate([self.tokens[k:], np.zeros(k, dtype=np.int64)])
            self.base = t

    def first_fit(self, start: int, room: int) -> int:
        """The first step >= start whose planned load is <= room (room >= 0: an empty step)."""
        i = max(start - self.base, 0)
        hits = np.flatnonzero(self.tokens[i:] <= room)
        return start + int(hits[0]) if hits.size else self.base + max(len(self.tokens), i)

    def place(self, costs: np.ndarray, start: int, budget: int) -> np.ndarray:
        """Each step at the earliest slot after the previous one (from `start`) where it fits the budget."""
        slots = np.empty(len(costs), dtype=np.int64)
        k, s = 0, start
        while k < len(costs):
            over = np.flatnonzero(self.window(s, len(costs) - k) + costs[k:] > budget)
            m = int(over[0]) if over.size else len(costs) - k
            slots[k : k + m] = np.arange(s, s + m)
            k, s = k + m, s + m
            if k < len(costs):
                s = self.first_fit(s + 1, budget - int(costs[k]))
        return slots


class Plan:
    """One request's remaining planned steps slots[i:], their costs, the cursor (`expect`) they assume."""

    __slots__ = ("slots", "costs", "i", "expect")

    def __init__(self, slots: np.ndarray, costs: np.ndarray, expect: tuple[int, int]):
        self.slots, self.costs, self.i, self.expect = slots, costs, 0, expect

    @property
    def next_slot(self) -> int:
        return int(self.slots[self.i])

    def ran(self, req: Request) -> None:
        """Its next planned step runs now: expect the cursor after it."""
        self.i += 1
        last = req.step_in_block + 1 >= planned_block_steps(req)
        self.expect = (req.block + 1, 0) if last else (req.block, req.step_in_block + 1)


class Lookahead:
    """The plan `engine.scheduler.LookaheadPolicy` asks who runs each step."""

    def __init__(self, budget: int, cache: str, delay_step: int):
        self.budget, self.cache, self.delay_step = budget, cache, delay_step
        self.ledger = Ledger()
        self.now = 0                        # the step being scheduled (absolute)
        self.plans: dict[int, Plan] = {}    # id(request) -> its plan
        self.stalled = 0                    # last step: requests past their plan that did not fit
        self._blocks: dict = {}             # planned_costs' memo

    def _mode(self, req: Request) -> str:
        return req.cache or self.cache

    def _place(self, req: Request) -> Plan:
        costs = planned_costs(req, self._mode(req), self.delay_step, self._blocks)
        plan = Plan(self.ledger.place(costs, self.now, self.budget), costs, (req.block, req.step_in_block))
        self.ledger.add(plan.slots, costs)
        self.plans[id(req)] = plan
        return plan

    def admits(self, req: Request) -> bool:
        """Whether its first step (a Refresh) fits this step's planned load."""
        first = req.query_cost(phase_at(req.step_in_block, self._mode(req), self.delay_step))
        return self.ledger.at(self.now) + first <= self.budget

    def admit(self, req: Request) -> None:
        """Plan an admitted request (its first step lands in this step: `admits` said so)."""
        self._place(req).ran(req)

    def drop(self, req: Request) -> None:
        """It left: free its remaining planned steps."""
        p = self.plans.pop(id(req), None)
        if p is not None:
            self.ledger.add(p.slots[p.i :], p.costs[p.i :], -1)

    def due(self, running: list[Request]) -> list[Request]:
        """The running requests that run this step, in running (FCFS) order."""
        t, out = self.now, []
        self.stalled = 0
        for req in running:
            p = self.plans[id(req)]
            cursor = (req.block, req.step_in_block)
            late = cursor[0] < p.expect[0]          # still in a block its plan had ended
            if cursor != p.expect or (p.next_slot > t and self.ledger.at(t) + int(p.costs[p.i]) <= self.budget):
                # off its plan (a block ended early or late), or waiting while this step has room: re-place it
                self.drop(req)
                p = self._place(req)
            if p.next_slot == t:
                out.append(req)
                p.ran(req)
            elif late:
                self.stalled += 1
        return out

    def tick(self) -> None:
        self.now += 1
        self.ledger.forget_before(self.now)
