"""The phase-multiplexed scheduler.

Each step: running requests keep their place (FCFS) and are charged by phase — a Refresh step
its whole canvas, a Reuse step only its block — then waiting requests are admitted FCFS while
the step stays within `max_num_batched_tokens` and `max_num_seqs` and the KV pool can reserve
their whole-life need. Because each request refreshes at its own block boundaries, cheap Reuse
steps of many requests fill the budget around the few expensive Refresh steps.

The `request` policy (the ablation's "off") is what a phase-unaware, request-level system
does: every request is charged its whole canvas every step, whatever its phase.

The `lookahead` policy (the paper's §7 future work; engine.lookahead, docs/SCHEDULER.md) plans
every running request's remaining steps on a ledger of future steps, so Refreshes that would
coincide are staggered when a request is admitted instead of stalling at the collision: who
runs each step is what the plan says, admission is FCFS when the head's first step fits the
planned load.

Cache modes: every request is charged, reserved and phased by its own mode (`Request.cache`):
the engine's policy, or under `cache=auto` dual or sparse as `engine.cache_mode` chooses when
it is admitted, so one step may mix dual and sparse members.

Liveness: `add_request` rejects anything that could never fit on its own (auto: in its sparse
mode, the smaller), and the oldest running request always fits an empty step, so every
admitted request finishes and the head of the queue is admitted as soon as the running set
leaves room for it.

A Refresh longer than the token budget (`phase` only) is charged over several steps and runs
chunked once its credit covers its canvas (engine.chunking.RefreshCredit; waits are deferred).
"""
from __future__ import annotations

from collections import Counter, deque
from itertools import islice

from engine.cache_mode import AUTO, admission_mode
from engine.canvas import CanvasPool
from engine.chunking import RefreshCredit, is_long
from engine.config import EngineConfig
from engine.kv_cache import KVPool, kv_need
from engine.lookahead import Lookahead
from engine.request import Phase, Request, Status


class Scheduler:
    def __init__(self, config: EngineConfig, pool: KVPool, canvases: CanvasPool | None = None):
        self.config, self.pool, self.canvases = config, pool, canvases
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stalled = 0            # running requests the last schedule() left out
        self.deferred = 0           # lookahead: running requests the last step's plan had wait
        self.served = Counter()     # requests admitted per cache mode
        self.plan = (Lookahead(config.max_num_batched_tokens, config.cache, config.delay_step)
                     if config.scheduler == "lookahead" else None)
        self.credit = RefreshCredit(config.max_num_batched_tokens)    # Refreshes longer than the budget

    def kv_need(self, req: Request, mode: str | None = None) -> int:
        """Its whole-life KV slots in `mode` (default: its own; a waiting auto request: sparse,
        the least it can run with)."""
        c = self.config
        return kv_need(mode or req.cache or c.cache, req.length, req.params.block_length, c.retention)

    def admission_mode(self, req: Request) -> str | None:
        """The mode the head of the queue `req` is admitted in now, or None if the KV pool cannot
        take it (it waits). A fixed policy: its own mode if it fits; auto: `engine.cache_mode`."""
        c, pool = self.config, self.pool
        if c.cache != AUTO:
            return c.cache if pool.can_reserve(self.kv_need(req, c.cache)) else None
        free = None if pool.capacity is None else pool.capacity - pool.used
        room = max(0, c.max_num_seqs - len(self.running) - 1)       # who could be admitted with it
        behind = (self.kv_need(r, "sparse") for r in islice(self.waiting, 1, 1 + room))
        return admission_mode(free, self.kv_need(req, "dual"), self.kv_need(req, "sparse"), behind)

    def cost(self, req: Request, phase: Phase) -> int:
        if self.config.scheduler == "request":
            return req.length
        if is_long(req, phase, self.config.max_num_batched_tokens):
            return self.credit.cost(req)               # this step's grant toward its chunked Refresh
        return req.query_cost(phase)

    def admission_cost(self, req: Request) -> int:
        """What the request's first step costs (a Refresh, whatever the policy)."""
        return req.length

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def schedule(self, now: float) -> list[tuple[Request, Phase]]:
        if self.plan is not None:
            return self._schedule_planned(now)
        c = self.config
        T = c.max_num_batched_tokens
        batch: list[tuple[Request, Phase]] = []
        accruing: list[tuple[Request, Phase]] = []      # long Refreshes charged, not run this step
        tokens = 0
        self.stalled = 0
        self.credit.begin()
        for i, req in enumerate(self.running):
            phase = req.phase(c.delay_step)
            if is_long(req, phase, T):
                if len(batch) >= c.max_num_seqs or tokens >= T:
                    self.stalled = len(self.running) - len(batch) - len(accruing)
                    return self._no_idle(batch, accruing)
                runs = self.credit.grant(req, T - tokens, self._demand_after(i))
                tokens += self.credit.cost(req)
                (batch if runs else accruing).append((req, phase))
                continue
            cost = self.cost(req, phase)
            if len(batch) >= c.max_num_seqs or tokens + cost > T:
                self.stalled = len(self.running) - len(batch) - len(accruing)
                return self._no_idle(batch, accruing)   # strict FCFS: nobody overtakes a running request
            batch.append((req, phase))
            tokens += cost
        while self.waiting:
            req = self.waiting[0]
            long = req.length > T                       # its first step is a Refresh
            cost = 1 if long else self.admission_cost(req)    # a long one needs any room at all
            if len(batch) + len(accruing) >= c.max_num_seqs or tokens + cost > T:
                break
            mode = self.admission_mode(req)
            if mode is None:
                break
            self._admit(mode, now)
            phase = req.phase(c.delay_step)
            if long:
                runs = self.credit.grant(req, T - tokens, self._demand_after(-1, waiting=True))
                tokens += self.credit.cost(req)
                (batch if runs else accruing).append((req, phase))
            else:
                batch.append((req, phase))
                tokens += cost
        return self._no_idle(batch, accruing)

    def _demand_after(self, i: int, waiting: bool = False) -> int:
        """What the requests behind the i-th running one (`waiting`: the i-th waiting one) ask of
        this step, the head of the queue included (long ones: their share)."""
        c, T = self.config, self.config.max_num_batched_tokens
        demand = 0
        for req in ([] if waiting else self.running[i + 1:]):
            phase = req.phase(c.delay_step)
            demand += self.credit.share if is_long(req, phase, T) else self.cost(req, phase)
        nxt = i + 1 if waiting else 0
        if nxt < len(self.waiting):
            head = self.waiting[nxt]
            demand += self.credit.share if head.length > T else self.admission_cost(head)
        return demand

    def _no_idle(self, batch: list, accruing: list) -> list[tuple[Request, Phase]]:
        """A step nothing else runs in runs the oldest accruing long Refresh at once."""
        if not batch and accruing:
            self.credit.run_now(accruing[0][0])
            batch, accruing = accruing[:1], accruing[1:]
        self.deferred = len(accruing)
        return batch

    def _schedule_planned(self, now: float) -> list[tuple[Request, Phase]]:
        """lookahead: the running requests the plan has in this step, then FCFS admission while
        the head's first step fits the planned load (its later steps are placed around it)."""
        c, plan = self.config, self.plan
        batch = [(r, r.phase(c.delay_step)) for r in plan.due(self.running)]
        self.stalled, self.deferred = plan.stalled, len(self.running) - len(batch) - plan.stalled
        while self.waiting:
            req = self.waiting[0]
            if len(self.running) >= c.max_num_seqs or not plan.admits(req):
                break
            mode = self.admission_mode(req)
            if mode is None:
                break
            self._admit(mode, now)
            plan.admit(req)
            batch.append((req, req.phase(c.delay_step)))
        plan.tick()
        return batch

    def _admit(self, mode: str, now: float) -> Request:
        """The head of the queue starts running in cache mode `mode`: its whole-life KV reserved,
        its canvas placed."""
        req = self.waiting.popleft()
        req.cache = mode
        self.served[mode] += 1
        need = self.kv_need(req)
        req.slots, req.kv_pool = self.pool.reserve(need), self.pool
        if self.canvases is not None:
            self.canvases.place(req)
        req.kv_tokens = need
        req.kv_bytes = need * self.pool.bytes_per_token
        req.status = Status.RUNNING
        req.admitted_time = now
        self.running.append(req)
        return req

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self.credit.drop(req)
        if self.plan is not None:
            self.plan.drop(req)
        self.pool.release(req.kv_tokens, req.slots)
        req.slots = None
        if self.canvases is not None:
            self.canvases.release(req)

    def abort(self, request_id: str) -> Request | None:
        for req in list(self.waiting):
            if req.request_id == request_id:
                self.waiting.remove(req)
                req.status = Status.ABORTED
                return req
        for req in self.running:
            if req.request_id == request_id:
                self.finish(req)
                req.status = Status.ABORTED
                return req
        return None
