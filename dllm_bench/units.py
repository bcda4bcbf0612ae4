"""CLI values: comma lists (comma_list) and human-readable sizes.

Sizes: `4GiB`, `512MiB`, `2.5GB`, `1e9`, `300000000` -> bytes (int).

Binary suffixes (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (kB/KB, MB, GB, TB) powers
of 1000, as `nvidia-smi`/`df -H` and vLLM's `--kv-cache-memory` docs use them. `K`, `M`, `G`,
`T` alone (and `KB`...) are read as decimal; a bare number is bytes. Case-insensitive,
whitespace allowed between number and unit.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TypeVar

from dllm_bench.errors import UserError

T = TypeVar("T")


def comma_list(text: str | None, flag: str, parse: Callable[[str], T] = str, unique: bool = True) -> list[T]:
    """`a, b,c` -> [parse("a"), parse("b"), parse("c")] (empty items skipped); an empty list, or
    with `unique` an item given twice, is a UserError naming `flag`. `parse` raises its own."""
    out = [parse(t) for t in (t.strip() for t in str(text or "").split(",")) if t]
    if not out:
        raise UserError(f"{flag} is empty")
    if unique:
        dup = next((v for i, v in enumerate(out) if v in out[:i]), None)
        if dup is not None:
            raise UserError(f"{flag} lists {dup} twice")
    return out

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str | int | float, what: str = "size") -> int:
    """Bytes for a size string; UserError (one line) for anything else or a value <= 0."""
    if isinstance(text, bool):
        raise UserError(f"{what}: expected a size like 4GiB, 512MiB or 2.5GB, got {text!r}")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        m = _RE.match(str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise UserError(f"{what}: expected a size like 4GiB, 512MiB or 2.5GB, got {text!r}")
        value, unit = float(m.group(1)), m.group(2).lower()
    n = value * _UNITS[unit]
    if not math.isfinite(n) or n < 1:
        raise UserError(f"{what} must be at least one byte, got {text!r}")
    return int(round(n))


def format_size(n: int | None) -> str:
    """Bytes -> the largest binary unit that keeps the number >= 1 (`1.50 GiB`)."""
    if n is None:
        return "unbounded"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024:
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.2f} {unit}"
        v /= 1024
    return f"{v:.2f} TiB"
