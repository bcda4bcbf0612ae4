"""Parallel decoding per system: which systems have it (as their upstream code does), and how one
`--decoding` policy (engine.decoding: fixed, threshold:τ, factor:f, entropy:γ) reaches each.

* `engine` — every policy, per request (SamplingParams.decoding).
* a baseline — the rules its registry entry lists (`decoding_knobs`: rule -> the knob that
  switches it on): Fast-dLLM's `threshold:τ` and `factor:f` through its `threshold` / `factor`
  knobs. Any other rule (Fast-dLLM's `entropy:γ`; every rule for LLaDA, dLLM-Cache and
  Sparse-dLLM, whose upstream generation commits the linear schedule's count every step) leaves
  it at `fixed`.

A multi-system command (serve, accuracy, frontier) runs a system that lacks the rule at `fixed`
and says so (`SystemDecoding.note`); a one-system command (`generate`) refuses instead
(`require`): the user asked that system for something it cannot do.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dllm_bench.errors import UserError
from dllm_bench.systems.spec import ENGINE, baseline_registry
from engine.decoding import FIXED, KINDS, Decoding


def knobs_of(system: str) -> dict[str, str]:
    """A baseline's knob for each parallel-decoding rule it has upstream ({} for the engine,
    whose requests carry their policy, and for a baseline without parallel decoding)."""
    return {} if system == ENGINE else dict(baseline_registry()[system].decoding_knobs)


def rules(system: str) -> tuple[str, ...]:
    """The rules `system` has (every system has `fixed`)."""
    return KINDS if system == ENGINE else (FIXED, *knobs_of(system))


def parse(spec: str | None, flag: str = "--decoding") -> Decoding:
    """A policy from the command line; a bad one is one `error:` line."""
    try:
        return Decoding.parse(FIXED if spec is None else spec)
    except ValueError as e:
        raise UserError(f"{flag}: {e}") from None


def parse_list(spec: str, flag: str = "--decoding") -> list[Decoding]:
    """A comma list of policies (`fixed,threshold:0.9,factor:1`), duplicates dropped, in order."""
    out = [parse(s.strip(), flag) for s in spec.split(",") if s.strip()]
    if not out:
        raise UserError(f"{flag} is empty")
    return list(dict.fromkeys(out))


def supports(system: str, decoding: Decoding) -> bool:
    return decoding.kind in rules(system)


@dataclass(frozen=True)
class SystemDecoding:
    """What a system runs for a requested policy: `decoding` (what its requests are decoded with), the baseline `knobs` that switch it on, and a `note` when the system
    runs `fixed` in place of the requested policy."""
    decoding: Decoding = Decoding()
    knobs: dict = field(default_factory=dict)
    note: str | None = None

    @property
    def parallel(self) -> bool:
        return not self.decoding.fixed


def resolve(system: str, d: Decoding, knobs: Mapping[str, Any] | None = None) -> SystemDecoding:
    """Policy `d` for `system`. `knobs`: the variant's own knobs, which win (e.g.
    `fast-dllm:threshold=0.8` decodes at threshold 0.8 whatever --decoding says)."""
    own, rule_knobs = dict(knobs or {}), knobs_of(system)
    for kind, knob in rule_knobs.items():
        if own.get(knob) is not None:
            return SystemDecoding(Decoding(kind, float(own[knob])))
    if d.fixed:
        return SystemDecoding()
    if not supports(system, d):
        why = (f"{system} has no {d.kind} rule upstream" if rule_knobs
               else f"{system} has no parallel decoding upstream")
        return SystemDecoding(note=f"{d} requested; {why}: runs fixed")
    if d.kind in rule_knobs:
        return SystemDecoding(d, {rule_knobs[d.kind]: d.value})
    return SystemDecoding(d)


def require(system: str, decoding: Decoding) -> SystemDecoding:
    """`resolve` for a command that runs one system: an unsupported policy is an error."""
    if not supports(system, decoding):
        have = ", ".join(rules(system))
        others = " or ".join(f"{n} ({', '.join(knobs_of(n))})" for n in baseline_registry() if knobs_of(n))
        raise UserError(f"--decoding {decoding}: {system} decodes with {have} only (its upstream code); "
                        f"parallel decoding: --system engine (every policy) or {others}")
    return resolve(system, decoding)
