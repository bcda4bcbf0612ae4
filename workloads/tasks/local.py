"""`--data PATH`: a local JSONL(.gz) file or a Hugging Face `datasets` directory (what
`save_to_disk` writes, e.g. `load_dataset("openai/gsm8k", "main").save_to_disk(DIR)` on a
machine with network access), in GSM8K shape or HumanEval shape, detected from the keys.

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


def _jsonl_rows(path: str | os.PathLike):
    """(where, row) per non-empty line of a JSONL(.gz) file."""
    for _, where, row in objects(path):
        yield where, row


def _dataset_rows(path: str | os.PathLike):
    """(where, row) per row of a `datasets` directory: a Dataset, or a DatasetDict's `test` split
    (GSM8K's and HumanEval's evaluation split; the only split when there is one)."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"{path}: not a datasets directory ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if "test" not in ds and len(ds) != 1:
            raise ValueError(f"{path}: a DatasetDict without a 'test' split (splits: {', '.join(ds)})")
        ds = ds["test"] if "test" in ds else next(iter(ds.values()))
    for i, row in enumerate(ds):
        yield f"{path}[{i}]", dict(row)


def load_local(path: str | os.PathLike, kind: str | None = None) -> tuple[str, list[dict]]:
    """(kind, rows) from a local JSONL(.gz) or `datasets` directory; every row must have the same
    shape. Raises ValueError (naming the file and line or row) for a missing path, bad JSON, mixed
    or unknown shapes, or no rows."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not os.path.exists(path):
        raise ValueError(f"data file not found: {path}")
    rows: list[dict] = []
    for where, row in (_dataset_rows(path) if os.path.isdir(path) else _jsonl_rows(path)):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object")
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
