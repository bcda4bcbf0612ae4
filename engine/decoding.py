"""Decoding policies: how many still-masked positions a request commits per step, on the device (docs/FRONTIER.md)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

FIXED = "fixed"
KINDS = (FIXED, "threshold", "factor", "entropy")
_VALUES = {"threshold": ("0.9", "0 < τ ≤ 1", lambda v: 0 < v <= 1), "factor": ("1.0", "f > 0", lambda v: v > 0),
           "entropy": ("0.5", "γ ≥ 0", lambda v: v >= 0)}


@dataclass(frozen=True)
class Decoding:
    kind: str = FIXED
    value: float = 0.0

    @classmethod
    def parse(cls, spec: str | Decoding) -> Decoding:
        """'fixed' | 'threshold:0.9' | 'factor:1.0' | 'entropy:0.5' -> Decoding (ValueError if not)."""
        if isinstance(spec, Decoding):
            return spec
        kind, _, arg = str(spec).strip().lower().partition(":")
        if kind == FIXED and not arg:
            return cls()
        if kind not in _VALUES:
            raise ValueError(f"decoding 'fixed' takes no value, got {spec!r}" if kind == FIXED else
                             f"decoding must be one of fixed, threshold:τ, factor:f, entropy:γ; got {spec!r}")
        example, valid, ok = _VALUES[kind]
        try:
            v = float(arg)
        except ValueError:
            raise ValueError(f"decoding {kind} needs a number, e.g. {kind}:{example}; got {spec!r}") from None
        if not ok(v) or not np.isfinite(v):
            raise ValueError(f"decoding {kind} must satisfy {valid}, got {v}")
        return cls(kind, v)

    @property
    def fixed(self) -> bool:
        return self.kind == FIXED

    def __str__(self) -> str:
        return FIXED if self.fixed else f"{self.kind}:{self.value:g}"


def policy_columns(policies: list[Decoding]) -> tuple[np.ndarray, np.ndarray]:
    """Per request (kind code, value as float64 bits in an int64): host columns the step stages."""
    kinds = np.array([KINDS.index(p.kind) for p in policies], dtype=np.int64)
    return kinds, np.array([p.value for p in policies], dtype=np.float64).view(np.int64)


def commit_mask(conf: torch.Tensor, entropy: torch.Tensor | None, counts: torch.Tensor, k: torch.Tensor,
                kinds: torch.Tensor | None, values: torch.Tensor | None) -> torch.Tensor:
    """Which ranks each request commits -> bool [B, W], a prefix of each row: conf [B, W] sorted descending
    (non-candidates last), entropy alike (or None), counts [B] candidates, k [B] the fixed count (`fixed`)."""
    r = torch.arange(conf.shape[1], device=conf.device).expand_as(conf)
    take = r < torch.minimum(k, counts)[:, None]
    if kinds is None:
        return take
    real, first, kind = r < counts[:, None], r == 0, kinds[:, None]
    v = values.view(torch.float64).to(conf.dtype)[:, None]
    take = torch.where(kind == KINDS.index("threshold"), first | (conf >= v), take)
    passed = (first | (conf >= 1 - v / (r + 2).to(conf.dtype))) & real
    lead = passed.to(torch.int64).cumprod(1).sum(1)
    take = torch.where(kind == KINDS.index("factor"), r < torch.where(lead >= counts - 1, counts, lead)[:, None], take)
    if entropy is not None:
        within = (first | (entropy.masked_fill(~real, 0).cumsum(1) <= v)).to(torch.int64).cumprod(1).bool()
        take = torch.where(kind == KINDS.index("entropy"), within, take)
    return take & real
