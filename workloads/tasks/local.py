"""`--data PATH`: local JSONL(.gz) in GSM8K shape or HumanEval shape, detected from the keys.

GSM8K shape:     {"question": str, "answer": str}             (answer ends in "#### N"; synth too)
HumanEval shape: {"task_id", "prompt", "test", "entry_point"}  (+ optional "canonical_solution")
"""
from __future__ import annotations

import os

from workloads.jsonl import objects
from workloads.tasks.humaneval import REQUIRED_KEYS as HUMANEVAL_KEYS

GSM8K_KEYS = ("question", "answer")
KINDS = ("gsm8k", "humaneval")


def detect_kind(row: dict) -> str:
    for keys in (HUMANEVAL_KEYS, GSM8K_KEYS):  # the right keys, a wrong type: name the field
        if all(k in row for k in keys):
            bad = next((k for k in keys if not isinstance(row[k], str)), None)
            if bad:
                raise ValueError(f"'{bad}' must be a string, got {type(row[bad]).__name__}")
    if all(isinstance(row.get(k), str) for k in HUMANEVAL_KEYS):
        return "humaneval"
    if all(isinstance(row.get(k), str) for k in GSM8K_KEYS):
        return "gsm8k"
    raise ValueError(f"row with keys {sorted(row)} is neither GSM8K-shaped {GSM8K_KEYS} "
                     f"nor HumanEval-shaped {HUMANEVAL_KEYS}")


def load_local(path: str | os.PathLike, kind: str | None = None) -> tuple[str, list[dict]]:
    """(kind, rows) from a local JSONL(.gz); every row must have the same shape. Raises ValueError
    (naming the file and line) for a missing file, bad JSON, mixed or unknown shapes, or no rows."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not os.path.isfile(path):
        raise ValueError(f"data file not found: {path}")
    rows: list[dict] = []
    for _, where, row in objects(path):
        try:
            k = detect_kind(row)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        kind = kind or k
        if k != kind:
            raise ValueError(f"{where}: {k}-shaped row in a {kind} file")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    if kind == "gsm8k":   # keep only the fields scoring uses (plus target if present, e.g. synth)
        rows = [{k: r[k] for k in (*GSM8K_KEYS, "target") if k in r} for r in rows]
    return kind, rows
