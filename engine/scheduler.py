"""The scheduler: queues, admission, and the phase and look-ahead policies deciding who runs each step
(docs/SCHEDULER.md)."""
from __future__ import annotations

import functools
import itertools
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from engine.canvas import CanvasPool
from engine.config import EngineConfig
from engine.kv_cache import AUTO, KVPool, Shape, admission_mode, kv_need, preferred_mode
from engine.request import Phase, Request, Status, phase_at
from engine.step import Batch

# A long Refresh's share of a contended step (the rest is left to the requests behind it).
SHARE = 0.5


class Scheduler:
    """The waiting queue and the running set; the policy schedules them, admitting through `admit_head`."""

    def __init__(self, config: EngineConfig, pool: KVPool, canvases: CanvasPool | None = None):
        self.config, self.pool, self.canvases = config, pool, canvases
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stalled = 0            # running requests the last schedule() left out
        self.deferred = 0           # running requests the last step had wait by plan (ledger or credit)
        self.served = Counter()     # requests admitted per cache mode
        self.policy: PhasePolicy = POLICIES[config.scheduler](config)
        self.cost, self.plan, self.credit = self.policy.cost, self.policy.plan, self.policy.credit

    def kv_need(self, req: Request, mode: str | None = None) -> int:
        """Its whole-life KV slots in `mode` (default: its own; waiting under auto: sparse's, the least)."""
        c = self.config
        return kv_need(mode or req.cache or c.cache, req.length, req.params.block_length, c.retention)

    def admission_mode(self, req: Request) -> str | None:
        """The mode the head of the queue is admitted in now (auto: `engine.kv_cache`), or None: it waits."""
        c, pool = self.config, self.pool
        if c.cache != AUTO:
            return c.cache if pool.can_reserve(self.kv_need(req, c.cache)) else None
        if pool.capacity is None:
            return "dual"
        dual, sparse = self.kv_need(req, "dual"), self.kv_need(req, "sparse")
        shape = Shape(req.length, req.block_length, req.steps_per_block, c.delay_step, dual, sparse,
                      c.ridge_rows, pool.cfg.kv_per_weight, pool.cfg.pair_per_row, c.overhead_rows)
        preferred = preferred_mode(pool.capacity, c.max_num_seqs, shape)     # a full pool of requests like it
        return admission_mode(pool.capacity - pool.used, dual, sparse, preferred, pool.capacity)

    def schedule(self, now: float) -> Batch:
        return self.policy.schedule(self, now)

    def admit_head(self, now: float) -> Request | None:
        """The head of the queue admitted in the mode it gets now, or None if the KV pool cannot take it."""
        mode = self.admission_mode(self.waiting[0])
        return None if mode is None else self._admit(mode, now)

    def _admit(self, mode: str, now: float) -> Request:
        """The head of the queue runs in `mode`: its whole-life KV reserved, its canvas placed."""
        req = self.waiting.popleft()
        req.cache, req.status, req.admitted_time = mode, Status.RUNNING, now
        self.served[mode] += 1
        req.kv_tokens = self.kv_need(req)
        req.kv_bytes = req.kv_tokens * self.pool.bytes_per_token
        req.slots, req.kv_pool = self.pool.reserve(req.kv_tokens), self.pool
        if self.canvases is not None:
            self.canvases.place(req)
        self.running.append(req)
        return req

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self.credit.credit.pop(id(req), None)
        if self.plan is not None:
            self.plan.drop(req)
        self.pool.release(req.kv_tokens, req.slots)
        req.slots = None
        if self.canvases is not None:
            self.canvases.release(req)

    def abort(self, request_id: str) -> None:
        for req in [*self.waiting, *self.running]:
            if req.request_id == request_id:
                if req.status is Status.RUNNING:
                    self.finish(req)
                else:
                    self.waiting.remove(req)
                req.status = Status.ABORTED
                return


class RefreshCredit:
    """Step budget accrued toward each long Refresh (docs/MEMORY.md, "Scheduling")."""

    def __init__(self, budget: int):
        self.share = max(1, int(budget * SHARE))
        self.credit: dict[int, int] = {}        # id(request) -> budget accrued
        self.granted: dict[int, int] = {}       # this step's grants

    def grant(self, req: Request, room: int, demand_after: int) -> bool:
        """Grant `req`'s Refresh part of the `room` left (those behind ask `demand_after`); True: it runs now."""
        have = self.credit.get(id(req), 0)
        g = min(room, req.length - have, max(min(room, self.share), room - demand_after))
        self.granted[id(req)] = g
        if have + g >= req.length:
            self.credit.pop(id(req), None)
            return True
        self.credit[id(req)] = have + g
        return False


class PhasePolicy:
    """Greedy FCFS by phase cost; `whole_canvas` (scheduler=request) charges every step the whole canvas."""

    plan: Lookahead | None = None           # the ledger of a planning policy
    chunks_long_refresh = True              # admits a canvas over the token budget (RefreshCredit)
    long_refusal = ""                       # why not, if it does not

    def __init__(self, config: EngineConfig):
        self.config = config
        self.whole_canvas = config.scheduler == "request"
        self.credit = RefreshCredit(config.max_num_batched_tokens)   # stays empty under lookahead

    def accrues(self, req: Request, phase: Phase) -> bool:
        """Whether this step of `req` is charged over several steps (its cost is over the budget)."""
        return (self.whole_canvas or phase.is_refresh) and req.length > self.config.max_num_batched_tokens

    def cost(self, req: Request, phase: Phase) -> int:
        if self.accrues(req, phase):
            return self.credit.granted.get(id(req), 0)     # this step's grant toward its chunked Refresh
        return req.length if self.whole_canvas else req.query_cost(phase)

    def schedule(self, q: Scheduler, now: float) -> Batch:
        c, T = self.config, self.config.max_num_batched_tokens
        batch: Batch = []
        accruing: Batch = []                            # long Refreshes charged, not run this step
        tokens = q.stalled = 0
        self.credit.granted.clear()
        for i, req in enumerate(q.running):
            phase = req.phase(c.delay_step)
            long = self.accrues(req, phase)
            need = 1 if long else self.cost(req, phase)    # a long one needs any room at all
            if len(batch) >= c.max_num_seqs or tokens + need > T:
                q.stalled = len(q.running) - len(batch) - len(accruing)
                return self._no_idle(q, batch, accruing)   # strict FCFS: nobody overtakes a running request
            runs = not long or self.credit.grant(req, T - tokens, self._demand(q, q.running[i + 1:]))
            (batch if runs else accruing).append((req, phase))
            tokens += self.cost(req, phase)
        while q.waiting:
            req = q.waiting[0]
            long = req.length > T                       # its first step is a Refresh
            need = 1 if long else req.length
            if len(batch) + len(accruing) >= c.max_num_seqs or tokens + need > T or q.admit_head(now) is None:
                break
            phase = req.phase(c.delay_step)
            runs = not long or self.credit.grant(req, T - tokens, self._demand(q, []))
            (batch if runs else accruing).append((req, phase))
            tokens += self.cost(req, phase)
        return self._no_idle(q, batch, accruing)

    def _demand(self, q: Scheduler, behind: list[Request]) -> int:
        """What the requests `behind` a long one and the queue's head ask of this step (long ones: their share)."""
        # The head, not admitted yet, is in a Refresh (no cache mode): charged its canvas, as once admitted.
        asks = [(r, r.phase(self.config.delay_step)) for r in [*behind, *itertools.islice(q.waiting, 1)]]
        return sum(self.credit.share if self.accrues(r, p) else self.cost(r, p) for r, p in asks)

    def _no_idle(self, q: Scheduler, batch: Batch, accruing: Batch) -> Batch:
        """A step nothing else runs in runs the oldest accruing long Refresh at once."""
        if not batch and accruing:
            self.credit.credit.pop(id(accruing[0][0]), None)
            batch, accruing = accruing[:1], accruing[1:]
        q.deferred = len(accruing)
        return batch


class LookaheadPolicy(PhasePolicy):
    """The phase costs; who runs: the running requests the plan has in this step, then FCFS admission while
    the head's first step fits."""

    chunks_long_refresh = False
    long_refusal = "its ledger plans every step whole within the token budget"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.plan = Lookahead(config.max_num_batched_tokens, config.cache, config.delay_step)

    def schedule(self, q: Scheduler, now: float) -> Batch:
        c, plan = self.config, self.plan
        batch = [(r, r.phase(c.delay_step)) for r in plan.due(q.running)]
        q.stalled, q.deferred = plan.stalled, len(q.running) - len(batch) - plan.stalled
        while q.waiting:
            req = q.waiting[0]
            if len(q.running) >= c.max_num_seqs or not plan.admits(req) or q.admit_head(now) is None:
                break
            plan.admit(req)
            batch.append((req, req.phase(c.delay_step)))
        plan.tick()
        return batch


POLICIES: dict[str, type[PhasePolicy]] = {"phase": PhasePolicy, "request": PhasePolicy,
                                               "lookahead": LookaheadPolicy}


def serves_long(config: EngineConfig) -> bool:
    """Whether canvases longer than the token budget are admitted (a chunking policy, one device)."""
    return POLICIES[config.scheduler].chunks_long_refresh and config.tensor_parallel_size == 1


def long_refusal(config: EngineConfig) -> str:
    """Why this engine cannot serve a canvas longer than its token budget ("" if it can)."""
    if config.tensor_parallel_size > 1:
        return "an engine over several ranks does not refresh a canvas in chunks"
    policy = POLICIES[config.scheduler]
    return "" if policy.chunks_long_refresh else f"scheduler={config.scheduler}: {policy.long_refusal}"


def long_schedulers() -> list[str]:
    return [name for name, policy in POLICIES.items() if policy.chunks_long_refresh]


# ---------------------------------------------------------------- the look-ahead plan (the paper's §7)
def planned_block_steps(req: Request) -> int:
    """The most steps a block of `req` takes: its schedule's, else (parallel decoding) `block_length`."""
    return req.steps_per_block if req.decoding.fixed else req.block_length


@functools.lru_cache(maxsize=4096)
def block_costs(n: int, length: int, reuse: int, cache: str, delay_step: int) -> np.ndarray:
    """Query tokens of a block's `n` planned steps (a shared array: never written)."""
    costs = np.array([length if phase_at(k, cache, delay_step).is_refresh else reuse for k in range(n)],
                     dtype=np.int64)
    costs.flags.writeable = False
    return costs


def planned_costs(req: Request, cache: str, delay_step: int) -> np.ndarray:
    """Query tokens of `req`'s remaining planned steps."""
    n, i = planned_block_steps(req), req.step_in_block
    block = block_costs(n, req.length, req.query_cost(Phase.REUSE), cache, delay_step)
    # A block past its planned end (it ran long) still needs at least one more step.
    current = block[i:] if i < n else np.array([req.query_cost(phase_at(i, cache, delay_step))], dtype=np.int64)
    return np.concatenate([current, np.tile(block, req.num_blocks - req.block - 1)])


class Ledger:
    """Planned query tokens of every future step (absolute step numbers; beyond the array: none)."""

    def __init__(self, size: int = 1024):
        self.base = 0                       # the absolute step of tokens[0]
        self.tokens = np.zeros(size, dtype=np.int64)

    def _hold(self, end: int) -> None:
        """Room up to step `end`: the array at least doubles."""
        short = end - self.base - len(self.tokens)
        if short > 0:
            self.tokens = np.concatenate([self.tokens, np.zeros(max(short, len(self.tokens)), dtype=np.int64)])

    def at(self, t: int) -> int:
        i = t - self.base
        return int(self.tokens[i]) if i < len(self.tokens) else 0

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

    def place(self, costs: np.ndarray, start: int, budget: int) -> np.ndarray:
        """Each step at the earliest slot after the previous one (from `start`) where it fits the budget."""
        slots = np.empty(len(costs), dtype=np.int64)
        k, s = 0, start
        while k < len(costs):
            self._hold(s + len(costs) - k)
            window = self.tokens[s - self.base : s - self.base + len(costs) - k]
            over = np.flatnonzero(window + costs[k:] > budget)
            m = int(over[0]) if over.size else len(costs) - k
            slots[k : k + m] = np.arange(s, s + m)
            k, s = k + m, s + m
            if k < len(costs):      # the next step: the first later slot with room for it (past the array: empty)
                fits = np.flatnonzero(self.tokens[s + 1 - self.base :] <= budget - int(costs[k]))
                s = s + 1 + int(fits[0]) if fits.size else self.base + len(self.tokens)
        return slots


@dataclass(slots=True)
class Plan:
    """One request's remaining planned steps slots[i:], their costs, the cursor (`expect`) they assume."""

    slots: np.ndarray
    costs: np.ndarray
    expect: tuple[int, int]
    i: int = 0

    def ran(self, req: Request) -> None:
        """Its next planned step runs now: expect the cursor after it."""
        self.i += 1
        last = req.step_in_block + 1 >= planned_block_steps(req)
        self.expect = (req.block + 1, 0) if last else (req.block, req.step_in_block + 1)


class Lookahead:
    """The plan `LookaheadPolicy` asks who runs each step."""

    def __init__(self, budget: int, cache: str, delay_step: int):
        self.budget, self.cache, self.delay_step = budget, cache, delay_step
        self.ledger = Ledger()
        self.now = 0                        # the step being scheduled (absolute)
        self.plans: dict[int, Plan] = {}    # id(request) -> its plan
        self.stalled = 0                    # last step: requests past their plan that did not fit

    def _place(self, req: Request) -> Plan:
        costs = planned_costs(req, req.cache or self.cache, self.delay_step)
        plan = Plan(self.ledger.place(costs, self.now, self.budget), costs, (req.block, req.step_in_block))
        self.ledger.add(plan.slots, costs)
        self.plans[id(req)] = plan
        return plan

    def admits(self, req: Request) -> bool:
        """Whether its first step (a Refresh) fits this step's planned load."""
        first = req.query_cost(phase_at(req.step_in_block, req.cache or self.cache, self.delay_step))
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
            if cursor != p.expect or (p.slots[p.i] > t and self.ledger.at(t) + int(p.costs[p.i]) <= self.budget):
                # off its plan (a block ended early or late), or waiting while this step has room: re-place it
                self.drop(req)
                p = self._place(req)
            if p.slots[p.i] == t:
                out.append(req)
                p.ran(req)
            elif late:
                self.stalled += 1
        return out

    def tick(self) -> None:
        self.now += 1
        self.ledger.forget_before(self.now)
