"""Decoding policies: how many of a block's still-masked positions a request commits per step,
chosen per row on the device in one pass (`commit_mask`; docs/FRONTIER.md)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

FIXED = "fixed"
KINDS = (FIXED, "threshold", "factor", "entropy")
CODE = {k: i for i, k in enumerate(KINDS)}
# kind -> (an example value, the valid range, its test)
_VALUES = {"threshold": ("0.9", "0 < τ ≤ 1", lambda v: 0 < v <= 1), "factor": ("1.0", "f > 0", lambda v: v > 0),
           "entropy": ("0.5", "γ ≥ 0", lambda v: v >= 0)}


@dataclass(frozen=True)
class Decoding:
    """A policy: fixed | threshold:τ | factor:f | entropy:γ, each taking at least one (rules: docs/FRONTIER.md)."""

    kind: str = FIXED
    value: float = 0.0

    @classmethod
    def parse(cls, spec: str | Decoding) -> Decoding:
        """'fixed' | 'threshold:0.9' | 'factor:1.0' | 'entropy:0.5' -> Decoding (ValueError if not)."""
        if isinstance(spec, Decoding):
            return spec
        kind, _, arg = str(spec).strip().lower().partition(":")
        if kind not in KINDS:
            raise ValueError(f"decoding must be one of fixed, threshold:τ, factor:f, entropy:γ; got {spec!r}")
        if kind == FIXED and arg:
            raise ValueError(f"decoding 'fixed' takes no value, got {spec!r}")
        if kind == FIXED:
            return cls()
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
    kinds = np.fromiter((CODE[p.kind] for p in policies), dtype=np.int64, count=len(policies))
    values = np.fromiter((p.value for p in policies), dtype=np.float64, count=len(policies)).view(np.int64)
    return kinds, values


def commit_mask(conf: torch.Tensor, entropy: torch.Tensor | None, counts: torch.Tensor, k: torch.Tensor,
                kinds: torch.Tensor | None, values: torch.Tensor | None) -> torch.Tensor:
    """Which ranks each request commits -> bool [B, W], a prefix of each row: conf [B, W] sorted descending
    (non-candidates last), entropy alike (None: unused), counts [B] candidates, k [B] the fixed count, kinds /
    values [B] (`policy_columns`; None: all `fixed`)."""
    B, W = conf.shape
    r = torch.arange(W, device=conf.device).expand(B, W)
    take = r < torch.minimum(k, counts)[:, None]                                     # fixed
    if kinds is None:
        return take
    real = r < counts[:, None]
    first = r == 0
    v = values.view(torch.float64).to(conf.dtype)[:, None]
    take = torch.where(kinds[:, None] == CODE["threshold"], first | (conf >= v), take)
    # factor: leading ranks that pass 1 - f/(i+2) (the first always passes); upstream's quirk is
    # kept: when only the last candidate fails, all are taken
    passed = (first | (conf >= 1 - v / (r + 2).to(conf.dtype))) & real
    lead = passed.to(torch.int64).cumprod(1).sum(1)
    kf = torch.where(lead >= counts - 1, counts, lead)
    take = torch.where(kinds[:, None] == CODE["factor"], r < kf[:, None], take)
    if entropy is not None:
        within = (first | (entropy.masked_fill(~real, 0).cumsum(1) <= v)).to(torch.int64).cumprod(1).bool()
        take = torch.where(kinds[:, None] == CODE["entropy"], within, take)
    return take & real
