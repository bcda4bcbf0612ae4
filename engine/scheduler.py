"""The scheduler: queues, admission, and the policies deciding who runs each step (docs/SCHEDULER.md)."""
from __future__ import annotations

from collections import Counter, deque

from engine.canvas import CanvasPool
from engine.config import EngineConfig
from engine.kv_cache import AUTO, KVPool, Shape, admission_mode, kv_need, never_cached, preferred_mode
from engine.lookahead import Lookahead
from engine.request import Phase, Request, Status
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
        self.policy: SchedulingPolicy = POLICIES[config.scheduler](config)
        self.cost, self.plan, self.credit = self.policy.cost, self.policy.plan, self.policy.credit

    def kv_need(self, req: Request, mode: str | None = None) -> int:
        """Its whole-life KV slots in `mode` (default: its own; waiting under auto: sparse's, the least)."""
        c = self.config
        return kv_need(mode or req.cache or c.cache, req.length, req.params.block_length, c.retention)

    def never_cached(self, req: Request) -> bool:
        """Under `cache=auto`: no cache mode can ever hold `req`, so it will run none."""
        return self.config.cache == AUTO and never_cached(self.pool.capacity, self.kv_need(req, "sparse"))

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

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def schedule(self, now: float) -> Batch:
        return self.policy.schedule(self, now)

    def admit_head(self, now: float) -> Request | None:
        """The head of the queue admitted in the mode it gets now, or None if the KV pool cannot take it."""
        mode = self.admission_mode(self.waiting[0])
        return None if mode is None else self._admit(mode, now)

    def _admit(self, mode: str, now: float) -> Request:
        """The head of the queue runs in `mode`: its whole-life KV reserved, its canvas placed."""
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
        self.policy.finished(req)
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


class RefreshCredit:
    """Step budget accrued toward each long Refresh (docs/MEMORY.md, "Scheduling")."""

    def __init__(self, budget: int):
        self.share = max(1, int(budget * SHARE))
        self.credit: dict[int, int] = {}
        self.granted: dict[int, int] = {}      # this step's grants

    def begin(self) -> None:
        self.granted.clear()

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

    def cost(self, req: Request) -> int:
        return self.granted.get(id(req), 0)

    def drop(self, req: Request) -> None:
        self.credit.pop(id(req), None)


class SchedulingPolicy:
    """Which running requests a step takes, what each is charged, when the head is admitted."""

    plan: Lookahead | None = None           # the ledger of a planning policy
    chunks_long_refresh: bool = False       # admits a canvas over the token budget (RefreshCredit)
    long_refusal: str = ""                  # why not, if it does not

    def __init__(self, config: EngineConfig):
        self.config = config
        self.credit = RefreshCredit(config.max_num_batched_tokens)   # stays empty under lookahead

    def cost(self, req: Request, phase: Phase) -> int:
        return req.query_cost(phase)

    def accrues(self, req: Request, phase: Phase) -> bool:
        """Whether this step of `req` is charged over several steps (its cost is over the budget)."""
        return False

    def schedule(self, q: Scheduler, now: float) -> Batch:
        raise NotImplementedError

    def finished(self, req: Request) -> None:
        self.credit.drop(req)


class PhasePolicy(SchedulingPolicy):
    """Greedy FCFS by phase cost; `whole_canvas` (scheduler=request) charges every step the whole canvas."""

    chunks_long_refresh = True

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.whole_canvas = config.scheduler == "request"

    def accrues(self, req: Request, phase: Phase) -> bool:
        return (self.whole_canvas or phase.is_refresh) and req.length > self.config.max_num_batched_tokens

    def cost(self, req: Request, phase: Phase) -> int:
        if self.accrues(req, phase):
            return self.credit.cost(req)               # this step's grant toward its chunked Refresh
        return req.length if self.whole_canvas else req.query_cost(phase)

    def schedule(self, q: Scheduler, now: float) -> Batch:
        c, T = self.config, self.config.max_num_batched_tokens
        batch: Batch = []
        accruing: Batch = []                            # long Refreshes charged, not run this step
        tokens = q.stalled = 0
        self.credit.begin()
        for i, req in enumerate(q.running):
            phase = req.phase(c.delay_step)
            long = self.accrues(req, phase)
            cost = 1 if long else self.cost(req, phase)    # a long one needs any room at all
            if len(batch) >= c.max_num_seqs or tokens + cost > T:
                q.stalled = len(q.running) - len(batch) - len(accruing)
                return self._no_idle(q, batch, accruing)   # strict FCFS: nobody overtakes a running request
            runs = not long or self.credit.grant(req, T - tokens, self._demand(q, q.running[i + 1:]))
            (batch if runs else accruing).append((req, phase))
            tokens += self.credit.cost(req) if long else cost
        while q.waiting:
            req = q.waiting[0]
            long = req.length > T                       # its first step is a Refresh
            cost = 1 if long else req.length
            if len(batch) + len(accruing) >= c.max_num_seqs or tokens + cost > T or q.admit_head(now) is None:
                break
            phase = req.phase(c.delay_step)
            runs = not long or self.credit.grant(req, T - tokens, self._demand(q, []))
            (batch if runs else accruing).append((req, phase))
            tokens += self.credit.cost(req) if long else cost
        return self._no_idle(q, batch, accruing)

    def _demand(self, q: Scheduler, behind: list[Request]) -> int:
        """What the requests `behind` a long one and the queue's head ask of this step (long ones: their share)."""
        share, demand = self.credit.share, 0
        for req in behind:
            phase = req.phase(self.config.delay_step)
            demand += share if self.accrues(req, phase) else self.cost(req, phase)
        if q.waiting:
            head = q.waiting[0]
            demand += share if head.length > self.config.max_num_batched_tokens else head.length
        return demand

    def _no_idle(self, q: Scheduler, batch: Batch, accruing: Batch) -> Batch:
        """A step nothing else runs in runs the oldest accruing long Refresh at once."""
        if not batch and accruing:
            self.credit.drop(accruing[0][0])
            batch, accruing = accruing[:1], accruing[1:]
        q.deferred = len(accruing)
        return batch


class LookaheadPolicy(SchedulingPolicy):
    """The running requests the plan has in this step, then FCFS admission while the head's first step fits."""

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

    def finished(self, req: Request) -> None:
        super().finished(req)
        self.plan.drop(req)


POLICIES: dict[str, type[SchedulingPolicy]] = {"phase": PhasePolicy, "request": PhasePolicy,
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
