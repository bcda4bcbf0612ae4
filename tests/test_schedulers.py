"""The scheduling-policy registry: every name EngineConfig accepts has a policy, and the
Scheduler holds the one its config names, `request` being the phase policy with its whole-canvas
cost flag (the behaviour is tested in test_scheduler_properties, test_lookahead, test_chunked_refresh)."""
from __future__ import annotations

from engine.config import SCHEDULERS, EngineConfig
from engine.scheduler import POLICIES, Lookahead, LookaheadPolicy, PhasePolicy, Scheduler


def test_every_scheduler_name_has_a_policy():
    assert tuple(POLICIES) == SCHEDULERS


def test_the_scheduler_holds_the_named_policy():
    kinds = {"phase": PhasePolicy, "request": PhasePolicy, "lookahead": LookaheadPolicy}
    for name in SCHEDULERS:
        s = Scheduler(EngineConfig(scheduler=name), pool=None, canvases=None)
        assert type(s.policy) is kinds[name]
        assert getattr(s.policy, "whole_canvas", False) == (name == "request")
        assert isinstance(s.policy.plan, Lookahead) == (name == "lookahead")
        assert not s.policy.credit and not s.policy.granted
