"""Scheduling policies: who runs each step, chosen once by name (`POLICIES[config.scheduler]`).

`Scheduler` keeps the queues, admission (cache mode, KV reservation) and the counters; a policy
decides which running requests a step takes, what each is charged, and when the head of the
queue may be admitted (`Queues.admit_head`). As with the cache policies (engine.cache_policy),
a new policy is one class here and one registry entry.

* phase (§4.4): FCFS within `max_num_batched_tokens`, each request charged by its phase (a
  Refresh its canvas, a Reuse its block); a Refresh longer than the budget accrues credit over
  several steps (engine.chunking.RefreshCredit).
* request (the ablation's "off"): the same loop, every step charged the whole canvas (credit too).
* lookahead (§7): every running request's remaining steps planned on a ledger of future steps
  (engine.lookahead, docs/SCHEDULER.md); planned waits instead of stalls. It plans each step
  whole within the budget, so it refuses a canvas longer than the budget.
"""
from __future__ import annotations

from collections import deque
from typing import Protocol

from engine.chunking import RefreshCredit, is_long
from engine.config import EngineConfig
from engine.lookahead import Lookahead
from engine.request import Phase, Request

Batch = list[tuple[Request, Phase]]


class Queues(Protocol):
    """What a policy sees of the `Scheduler`: its queues, its counters, and admission."""

    waiting: deque[Request]
    running: list[Request]
    stalled: int        # running requests the last step left out
    deferred: int       # running requests the last step had wait by plan (credit or ledger)

    def admit_head(self, now: float) -> Request | None: ...


class SchedulingPolicy:
    plan: Lookahead | None = None           # the ledger of a planning policy
    # Admits a canvas longer than the token budget, its Refresh charged over several steps
    # (engine.chunking.RefreshCredit): what `serves_long` asks.
    chunks_long_refresh: bool = False
    # Why a policy that does not cannot (the engine's error for such a canvas says it first).
    long_refusal: str = ""

    def __init__(self, config: EngineConfig):
        self.config = config
        # Long Refreshes' accrued budget: charged by the greedy policies; empty under one that
        # never admits a canvas longer than the budget (lookahead).
        self.credit = RefreshCredit(config.max_num_batched_tokens)

    def cost(self, req: Request, phase: Phase) -> int:
        """The query tokens `req` is charged for a step in `phase`."""
        return req.query_cost(phase)

    def accrues(self, req: Request, phase: Phase) -> bool:
        """Whether this step of `req` is charged over several steps (its cost is over the budget)."""
        return False

    def schedule(self, q: Queues, now: float) -> Batch:
        raise NotImplementedError

    def finished(self, req: Request) -> None:
        """`req` left the running set (finished or aborted)."""
        self.credit.drop(req)


class PhasePolicy(SchedulingPolicy):
    """Greedy FCFS: running requests keep their place and are charged by phase, then waiting
    requests are admitted while the step fits; nobody overtakes a running request."""

    chunks_long_refresh = True

    def accrues(self, req: Request, phase: Phase) -> bool:
        return is_long(req, phase, self.config.max_num_batched_tokens)

    def cost(self, req: Request, phase: Phase) -> int:
        if self.accrues(req, phase):
            return self.credit.cost(req)               # this step's grant toward its chunked Refresh
        return req.query_cost(phase)

    def admission_cost(self, req: Request) -> int:
        """What the request's first step costs (a Refresh, whatever the policy)."""
        return req.length

    def schedule(self, q: Queues, now: float) -> Batch:
        c = self.config
        T = c.max_num_batched_tokens
        batch: Batch = []
        accruing: Batch = []                            # long Refreshes charged, not run this step
        tokens = 0
        q.stalled = 0
        self.credit.begin()
        for i, req in enumerate(q.running):
            phase = req.phase(c.delay_step)
            if self.accrues(req, phase):
                if len(batch) >= c.max_num_seqs or tokens >= T:
                    q.stalled = len(q.running) - len(batch) - len(accruing)
                    return self._no_idle(q, batch, accruing)
                runs = self.credit.grant(req, T - tokens, self._demand_after(q, i))
                tokens += self.credit.cost(req)
                (batch if runs else accruing).append((req, phase))
                continue
            cost = self.cost(req, phase)
            if len(batch) >= c.max_num_seqs or tokens + cost > T:
                q.stalled = len(q.running) - len(batch) - len(accruing)
                return self._no_idle(q, batch, accruing)   # strict FCFS: nobody overtakes a running request
            batch.append((req, phase))
            tokens += cost
        while q.waiting:
            req = q.waiting[0]
            long = req.length > T                       # its first step is a Refresh
            cost = 1 if long else self.admission_cost(req)    # a long one needs any room at all
            if len(batch) + len(accruing) >= c.max_num_seqs or tokens + cost > T:
                break
            if q.admit_head(now) is None:
                break
            phase = req.phase(c.delay_step)
            if long:
                runs = self.credit.grant(req, T - tokens, self._demand_after(q, -1, waiting=True))
                tokens += self.credit.cost(req)
                (batch if runs else accruing).append((req, phase))
            else:
                batch.append((req, phase))
                tokens += cost
        return self._no_idle(q, batch, accruing)

    def _demand_after(self, q: Queues, i: int, waiting: bool = False) -> int:
        """What the requests behind the i-th running one (`waiting`: the i-th waiting one) ask of
        this step, the head of the queue included (long ones: their share)."""
        c, T = self.config, self.config.max_num_batched_tokens
        demand = 0
        for req in ([] if waiting else q.running[i + 1:]):
            phase = req.phase(c.delay_step)
            demand += self.credit.share if self.accrues(req, phase) else self.cost(req, phase)
        nxt = i + 1 if waiting else 0
        if nxt < len(q.waiting):
            head = q.waiting[nxt]
            demand += self.credit.share if head.length > T else self.admission_cost(head)
        return demand

    def _no_idle(self, q: Queues, batch: Batch, accruing: Batch) -> Batch:
        """A step nothing else runs in runs the oldest accruing long Refresh at once."""
        if not batch and accruing:
            self.credit.run_now(accruing[0][0])
            batch, accruing = accruing[:1], accruing[1:]
        q.deferred = len(accruing)
        return batch


class RequestPolicy(PhasePolicy):
    """A phase-unaware, request-level system: every step charged the whole canvas (a canvas over
    the budget accrues credit for each of its steps, Reuse steps too)."""

    def accrues(self, req: Request, phase: Phase) -> bool:
        return req.length > self.config.max_num_batched_tokens

    def cost(self, req: Request, phase: Phase) -> int:
        return self.credit.cost(req) if self.accrues(req, phase) else req.length


class LookaheadPolicy(SchedulingPolicy):
    """The running requests the plan has in this step, then FCFS admission while the head's
    first step fits the planned load (its later steps are placed around it)."""

    long_refusal = "its ledger plans every step whole within the token budget"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.plan = Lookahead(config.max_num_batched_tokens, config.cache, config.delay_step)

    def schedule(self, q: Queues, now: float) -> Batch:
        c, plan = self.config, self.plan
        batch = [(r, r.phase(c.delay_step)) for r in plan.due(q.running)]
        q.stalled, q.deferred = plan.stalled, len(q.running) - len(batch) - plan.stalled
        while q.waiting:
            req = q.waiting[0]
            if len(q.running) >= c.max_num_seqs or not plan.admits(req):
                break
            if q.admit_head(now) is None:
                break
            plan.admit(req)
            batch.append((req, req.phase(c.delay_step)))
        plan.tick()
        return batch

    def finished(self, req: Request) -> None:
        super().finished(req)
        self.plan.drop(req)


POLICIES: dict[str, type[SchedulingPolicy]] = {"phase": PhasePolicy, "request": RequestPolicy,
                                               "lookahead": LookaheadPolicy}


def serves_long(config: EngineConfig) -> bool:
    """Whether canvases longer than the token budget (up to `max_model_len`) are admitted: under
    a policy that charges such a Refresh over several steps (`chunks_long_refresh`), on one
    device (the profiler then reserves its chunked Refresh, `engine.profiler`)."""
    return POLICIES[config.scheduler].chunks_long_refresh and config.tensor_parallel_size == 1


def long_refusal(config: EngineConfig) -> str:
    """Why this engine cannot serve a canvas longer than its token budget ("" if it can)."""
    if config.tensor_parallel_size > 1:
        return "an engine over several ranks does not refresh a canvas in chunks"
    policy = POLICIES[config.scheduler]
    return "" if policy.chunks_long_refresh else f"scheduler={config.scheduler}: {policy.long_refusal}"


def long_schedulers() -> list[str]:
    """The scheduler names whose policy admits a canvas longer than the token budget."""
    return [name for name, policy in POLICIES.items() if policy.chunks_long_refresh]
