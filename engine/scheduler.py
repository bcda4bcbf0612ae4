"""The scheduler: the queues, admission and KV accounting around a scheduling policy.

Who runs each step and what it is charged is the policy's (engine.schedulers: phase, request,
lookahead, chosen by `EngineConfig.scheduler`); the scheduler admits the head of the queue when
the policy asks (`admit_head`): in its cache mode (`Request.cache`: the engine's policy, or
under `cache=auto` dual, sparse or none as `engine.cache_mode` chooses), its whole-life KV
reserved and its canvas placed, so one step may mix members of every mode.

Liveness: `add_request` rejects anything that could never fit on its own (auto: nothing for its
KV; a request no cache mode can hold runs none, which needs no slots), and the oldest running
request always fits an empty step, so every admitted request finishes and the head of the queue
is admitted as soon as the running set leaves room for it.
"""
from __future__ import annotations

from collections import Counter, deque

from engine.cache_mode import AUTO, Shape, admission_mode, never_cached, preferred_mode
from engine.canvas import CanvasPool
from engine.chunking import RefreshCredit
from engine.config import EngineConfig
from engine.kv_cache import KVPool, kv_need
from engine.lookahead import Lookahead
from engine.request import Phase, Request, Status
from engine.schedulers import POLICIES, SchedulingPolicy


class Scheduler:
    def __init__(self, config: EngineConfig, pool: KVPool, canvases: CanvasPool | None = None):
        self.config, self.pool, self.canvases = config, pool, canvases
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stalled = 0            # running requests the last schedule() left out
        self.deferred = 0           # running requests the last step had wait by plan (ledger or credit)
        self.served = Counter()     # requests admitted per cache mode
        self.policy: SchedulingPolicy = POLICIES[config.scheduler](config)

    def kv_need(self, req: Request, mode: str | None = None) -> int:
        """Its whole-life KV slots in `mode` (default: its own; a waiting auto request: sparse,
        the least it can run with)."""
        c = self.config
        return kv_need(mode or req.cache or c.cache, req.length, req.params.block_length, c.retention)

    def never_cached(self, req: Request) -> bool:
        """Under `cache=auto`: no cache mode can ever hold `req`, so it will run none."""
        return self.config.cache == AUTO and never_cached(self.pool.capacity, self.kv_need(req, "sparse"))

    def admission_mode(self, req: Request) -> str | None:
        """The mode the head of the queue `req` is admitted in now, or None if the KV pool cannot
        take it (it waits). A fixed policy: its own mode if it fits; auto: `engine.cache_mode`."""
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

    def cost(self, req: Request, phase: Phase) -> int:
        """The query tokens `req` is charged for a step in `phase` (the policy's rule)."""
        return self.policy.cost(req, phase)

    @property
    def plan(self) -> Lookahead | None:
        """The look-ahead ledger (scheduler=lookahead), else None."""
        return self.policy.plan

    @property
    def credit(self) -> RefreshCredit:
        """Long Refreshes' accrued budget (empty under lookahead)."""
        return self.policy.credit

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def schedule(self, now: float) -> list[tuple[Request, Phase]]:
        """This step's batch, as the policy chooses it (admitting through `admit_head`)."""
        return self.policy.schedule(self, now)

    def admit_head(self, now: float) -> Request | None:
        """Admit the head of the queue in the cache mode it gets now, or None if the KV pool
        cannot take it (it waits)."""
        mode = self.admission_mode(self.waiting[0])
        return None if mode is None else self._admit(mode, now)

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
