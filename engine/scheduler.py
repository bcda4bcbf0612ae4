"""The scheduler: queues, admission, and the policies deciding who runs each step (docs/SCHEDULER.md)."""
from __future__ import annotations

import itertools
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from engine.config import EngineConfig
from engine.kv_cache import AUTO, KVPool, Shape, admission_mode, kv_need, per_weight, preferred_mode
from engine.request import CanvasPool, Phase, Request, Status, phase_at
from engine.step import Batch


class Scheduler:
    """The waiting queue and the running set; the policy schedules them, admitting through `admit_head`."""

    def __init__(self, config: EngineConfig, pool: KVPool, canvases: CanvasPool):
        self.config, self.pool, self.canvases = config, pool, canvases
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stalled = self.deferred = 0    # running requests the last step left out: over budget, by plan
        self.served = Counter()
        self.policy: PhasePolicy = POLICIES[config.scheduler](config)

    def schedule(self, now: float) -> Batch:
        return self.policy.schedule(self, now)

    def admit_head(self, now: float) -> Request | None:
        """The head of the queue admitted in the mode it gets now (auto: `engine.kv_cache`), or None: it waits."""
        c, pool, req = self.config, self.pool, self.waiting[0]
        if c.cache != AUTO:
            mode = c.cache if pool.can_reserve(kv_need(c.cache, req.length, req.block_length, c.retention)) else None
        elif pool.capacity is None:
            mode = "dual"
        else:
            dual, sparse = (kv_need(m, req.length, req.block_length, c.retention) for m in ("dual", "sparse"))
            shape = Shape(req.length, req.block_length, req.steps_per_block, c.delay_step, dual, sparse,
                          c.ridge_rows, *per_weight(pool.cfg), c.overhead_rows)
            preferred = preferred_mode(pool.capacity, c.max_num_seqs, shape)     # a full pool of requests like it
            mode = admission_mode(pool.capacity - pool.used, dual, sparse, preferred, pool.capacity)
        return None if mode is None else self._admit(mode, now)

    def _admit(self, mode: str, now: float) -> Request:
        req = self.waiting.popleft()
        req.cache, req.status, req.admitted_time = mode, Status.RUNNING, now
        self.served[mode] += 1
        req.kv_tokens = kv_need(mode, req.length, req.block_length, self.config.retention)
        req.kv_bytes = req.kv_tokens * self.pool.bytes_per_token
        req.slots, req.kv_pool = self.pool.reserve(req.kv_tokens), self.pool
        self.canvases.place(req)
        self.running.append(req)
        return req

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self.policy.credit.pop(id(req), None)
        if self.policy.plan is not None:
            self.policy.plan.drop(req)
        self.pool.release(req.kv_tokens, req.slots)
        req.slots = None
        self.canvases.release(req)


class PhasePolicy:
    """Greedy FCFS by phase cost; `whole_canvas` (scheduler=request) charges every step the whole canvas."""

    chunks_long_refresh = True              # admits a canvas over the token budget (its Refresh on credit)
    long_refusal = ""                       # why not, if it does not

    def __init__(self, config: EngineConfig):
        self.config = config
        self.whole_canvas = config.scheduler == "request"
        lookahead = config.scheduler == "lookahead"
        self.plan = Lookahead(config.max_num_batched_tokens, config.cache, config.delay_step) if lookahead else None
        self.share = max(1, config.max_num_batched_tokens // 2)     # a long Refresh's share of a contended step
        self.credit: dict[int, int] = {}        # id(request) -> budget accrued toward its long Refresh
        self.granted: dict[int, int] = {}       # this step's grants

    def grant(self, req: Request, room: int, demand_after: int) -> bool:
        """Grant `req`'s long Refresh part of the `room` left (those behind ask `demand_after`); True: it runs now."""
        have = self.credit.pop(id(req), 0)
        # its share of the room, or all that those behind leave, up to what it still needs
        part = min(req.length - have, max(min(room, self.share), room - demand_after))
        self.granted[id(req)] = part
        if have + part < req.length:
            self.credit[id(req)] = have + part
        return have + part >= req.length

    def accrues(self, req: Request, phase: Phase) -> bool:
        """Whether this step of `req` is charged over several steps (its cost is over the budget)."""
        return (self.whole_canvas or phase.is_refresh) and req.length > self.config.max_num_batched_tokens

    def cost(self, req: Request, phase: Phase) -> int:
        if self.accrues(req, phase):
            return self.granted.get(id(req), 0)     # this step's grant toward its chunked Refresh
        return req.length if self.whole_canvas else req.query_cost(phase)

    def schedule(self, q: Scheduler, now: float) -> Batch:
        """The running requests in FCFS order, then the queue's head while they fit; nobody overtakes."""
        c, T = self.config, self.config.max_num_batched_tokens
        batch, accruing, tokens = [], [], 0             # accruing: long Refreshes charged, not run this step
        self.granted.clear()
        while len(batch) + len(accruing) < len(q.running) or q.waiting:
            i = len(batch) + len(accruing)              # the next request's place in the running set
            req = q.running[i] if i < len(q.running) else q.waiting[0]
            phase = req.phase(c.delay_step)
            long = self.accrues(req, phase)
            need = 1 if long else self.cost(req, phase)    # a long one needs any room at all
            if i >= c.max_num_seqs or tokens + need > T or (req.status is Status.WAITING and q.admit_head(now) is None):
                break
            phase = req.phase(c.delay_step)             # (if admitted just now: in its cache mode)
            runs = not long or self.grant(req, T - tokens, self._demand(q, i))
            (batch if runs else accruing).append((req, phase))
            tokens += self.cost(req, phase)
        q.stalled = len(q.running) - len(batch) - len(accruing)
        if not batch and accruing:                      # a step nothing else runs in runs the oldest at once
            self.credit.pop(id(accruing[0][0]), None)
            batch, accruing = accruing[:1], accruing[1:]
        q.deferred = len(accruing)
        return batch

    def _demand(self, q: Scheduler, i: int) -> int:
        """What those behind running request `i` and the queue's head (a Refresh) ask (long ones: their share)."""
        asks = [(r, r.phase(self.config.delay_step)) for r in [*q.running[i + 1:], *itertools.islice(q.waiting, 1)]]
        return sum(self.share if self.accrues(r, p) else self.cost(r, p) for r, p in asks)


class LookaheadPolicy(PhasePolicy):
    """The phase costs; who runs: those the plan has in this step, then FCFS admission while the head fits."""

    chunks_long_refresh = False
    long_refusal = "its ledger plans every step whole within the token budget"

    def schedule(self, q: Scheduler, now: float) -> Batch:
        c, plan = self.config, self.plan
        batch = [(r, r.phase(c.delay_step)) for r in plan.due(q.running)]
        q.stalled, q.deferred = plan.stalled, len(q.running) - len(batch) - plan.stalled
        while q.waiting and len(q.running) < c.max_num_seqs and plan.admits(q.waiting[0]):
            req = q.admit_head(now)
            if req is None:
                break
            plan.admit(req)
            batch.append((req, req.phase(c.delay_step)))
        plan.tick()
        return batch


POLICIES: dict[str, type[PhasePolicy]] = {"phase": PhasePolicy, "request": PhasePolicy, "lookahead": LookaheadPolicy}


def long_refusal(config: EngineConfig) -> str:
    """Why this engine cannot serve a canvas longer than its token budget ("" if it can)."""
    if config.tensor_parallel_size > 1:
        return "an engine over several ranks does not refresh a canvas in chunks"
    policy = POLICIES[config.scheduler]
    return "" if policy.chunks_long_refresh else f"scheduler={config.scheduler}: {policy.long_refusal}"


def serves_long(config: EngineConfig) -> bool:
    return not long_refusal(config)


def long_schedulers() -> list[str]:
    return [name for name, policy in POLICIES.items() if policy.chunks_long_refresh]


def planned_costs(req: Request, cache: str, delay_step: int) -> np.ndarray:
    """Query tokens of `req`'s remaining planned steps, each block at its longest (docs/SCHEDULER.md)."""
    n = req.steps_per_block if req.decoding.fixed else req.block_length     # a block's most steps
    i = req.step_in_block
    block = np.array([req.query_cost(phase_at(k, cache, delay_step)) for k in range(max(n, i + 1))], dtype=np.int64)
    return np.concatenate([block[i:], np.tile(block[:n], req.num_blocks - req.block - 1)])


@dataclass(slots=True)
class Plan:
    """One request's planned steps (slots[i:] still to run), their costs, the cursor (`expect`) they assume."""

    slots: np.ndarray
    costs: np.ndarray
    expect: tuple[int, int]
    i: int = 0


class Lookahead:
    """The plans `LookaheadPolicy` asks who runs each step, and their sum: the ledger."""

    def __init__(self, budget: int, cache: str, delay_step: int):
        self.budget, self.cache, self.delay_step = budget, cache, delay_step
        self.ledger: Counter[int] = Counter()      # step (absolute, from `now` on) -> planned query tokens
        self.now = 0                        # the step being scheduled
        self.plans: dict[int, Plan] = {}    # id(request) -> its plan
        self.stalled = 0                    # last step: requests past their plan that did not fit

    def _place(self, req: Request) -> Plan:
        """Each remaining step at the earliest slot after the previous one (from now) where it fits the budget."""
        costs = planned_costs(req, req.cache or self.cache, self.delay_step)
        slots, s = np.empty(len(costs), dtype=np.int64), self.now
        for k, cost in enumerate(costs.tolist()):
            while self.ledger[s] + cost > self.budget:
                s += 1
            slots[k] = s
            self.ledger[s] += cost
            s += 1
        self.plans[id(req)] = Plan(slots, costs, (req.block, req.step_in_block))
        return self.plans[id(req)]

    def _ran(self, p: Plan, req: Request) -> None:
        p.i += 1
        last = req.step_in_block + 1 >= (req.steps_per_block if req.decoding.fixed else req.block_length)
        p.expect = (req.block + 1, 0) if last else (req.block, req.step_in_block + 1)

    def admits(self, req: Request) -> bool:
        """Whether its first step (a Refresh of its canvas) fits this step's planned load."""
        return self.ledger[self.now] + req.length <= self.budget

    def admit(self, req: Request) -> None:
        self._ran(self._place(req), req)

    def drop(self, req: Request) -> None:
        p = self.plans.pop(id(req), None)
        if p is not None:
            self.ledger.subtract(dict(zip(p.slots[p.i :].tolist(), p.costs[p.i :].tolist())))

    def due(self, running: list[Request]) -> list[Request]:
        t, out, self.stalled = self.now, [], 0
        for req in running:
            p = self.plans[id(req)]
            cursor = (req.block, req.step_in_block)
            late = cursor[0] < p.expect[0]          # still in a block its plan had ended
            if cursor != p.expect or (p.slots[p.i] > t and self.ledger[t] + int(p.costs[p.i]) <= self.budget):
                # off its plan (a block ended early or late), or waiting while this step has room: re-place it
                self.drop(req)
                p = self._place(req)
            if p.slots[p.i] == t:
                out.append(req)
                self._ran(p, req)
            elif late:
                self.stalled += 1
        return out

    def tick(self) -> None:
        del self.ledger[self.now]
        self.now += 1
