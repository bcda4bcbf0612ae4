"""Parallel decoding per system: which systems have it (as their upstream code does), and how one
`--decoding` policy (engine.decoding: fixed, threshold:τ, factor:f, entropy:γ) reaches each.

* `engine` — every policy, per request (SamplingParams.decoding).
* `fast-dllm` — `threshold:τ` and `factor:f`, upstream's two rules (NVlabs/Fast-dLLM
  llada/generate.py, `get_transfer_index` / `get_transfer_index_dynamic`), through the baseline's
  `threshold` / `factor` knobs; it has no entropy rule, so `entropy:γ` leaves it at `fixed`.
* `llada`, `dllm-cache`, `sparse-dllm` — their upstream generation commits the linear schedule's
  count every step (no parallel decoding), so they stay at `fixed`.

A multi-system command (serve, accuracy, frontier) runs a system that lacks the rule at `fixed`
and says so (`SystemDecoding.note`); a one-system command (`generate`) refuses instead
(`require`): the user asked that system for something it cannot do.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dllm_bench.errors import UserError
from engine.decoding import Decoding

# The rules each system has upstream (every system has `fixed`).
RULES: dict[str, tuple[str, ...]] = {
    "engine": ("fixed", "threshold", "factor", "entropy"),
    "fast-dllm": ("fixed", "threshold", "factor"),
}
# Fast-dLLM's knob for each of its rules.
FAST_DLLM_KNOB = {"threshold": "threshold", "factor": "factor"}


def parse(spec: str | None, flag: str = "--decoding") -> Decoding:
    """A policy from the command line; a bad one is one `error:` line."""
    try:
        return Decoding.parse("fixed" if spec is None else spec)
    except ValueError as e:
        raise UserError(f"{flag}: {e}") from None


def parse_list(spec: str, flag: str = "--decoding") -> list[Decoding]:
    """A comma list of policies (`fixed,threshold:0.9,factor:1`), duplicates dropped, in order."""
    out = [parse(s.strip(), flag) for s in spec.split(",") if s.strip()]
    if not out:
        raise UserError(f"{flag} is empty")
    return list(dict.fromkeys(out))


def supports(system: str, decoding: Decoding) -> bool:
    return decoding.kind in RULES.get(system, ("fixed",))


@dataclass(frozen=True)
class SystemDecoding:
    """What a system runs for a requested policy: `decoding` (canonical text, what its requests
    are decoded with), the baseline `knobs` that switch it on, and a `note` when the system
    runs `fixed` in place of the requested policy."""
    decoding: str = "fixed"
    knobs: dict = field(default_factory=dict)
    note: str | None = None

    @property
    def parallel(self) -> bool:
        return self.decoding != "fixed"


def resolve(system: str, decoding: Decoding | str, knobs: Mapping[str, Any] | None = None) -> SystemDecoding:
    """`decoding` for `system`. `knobs`: the variant's own knobs, which win (e.g.
    `fast-dllm:threshold=0.8` decodes at threshold 0.8 whatever --decoding says)."""
    d = Decoding.parse(decoding)
    own = dict(knobs or {})
    if system == "fast-dllm":
        for kind, knob in FAST_DLLM_KNOB.items():
            if own.get(knob) is not None:
                return SystemDecoding(str(Decoding(kind, float(own[knob]))))
    if d.fixed:
        return SystemDecoding()
    if not supports(system, d):
        why = ("Fast-dLLM has no entropy rule upstream" if system == "fast-dllm"
               else f"{system} has no parallel decoding upstream")
        return SystemDecoding(note=f"{d} requested; {why}: runs fixed")
    if system == "fast-dllm":
        return SystemDecoding(str(d), {FAST_DLLM_KNOB[d.kind]: d.value})
    return SystemDecoding(str(d))


def require(system: str, decoding: Decoding) -> SystemDecoding:
    """`resolve` for a command that runs one system: an unsupported policy is an error."""
    if not supports(system, decoding):
        have = ", ".join(RULES.get(system, ("fixed",)))
        raise UserError(f"--decoding {decoding}: {system} decodes with {have} only (its upstream code); "
                        "parallel decoding: --system engine (every policy) or fast-dllm (threshold, factor)")
    return resolve(system, decoding)
