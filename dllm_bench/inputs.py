"""The input boundary: every path or name a command takes from its options is checked here, at
option-parsing time, before any work starts and before a run directory exists. Each problem is
one `UserError` line (exit 2 from `dllm_bench.cli.main`), never a traceback, and no check lets a
result land outside the run directory it was meant for.

Line-level checks of input files (JSONL workloads and task data, BurstGPT CSV) live with their
readers (`workloads.jsonl.objects`, `workloads.burstgpt.load_burstgpt_csv`), which name
file:line and the field; `input_file` here only makes sure there is a regular file to read.
"""
from __future__ import annotations

import os
from pathlib import Path

from dllm_bench.checkpoints.load import has_tokenizer, model_dir
from dllm_bench.errors import UserError
from dllm_bench.results import results_root

NAME_MAX = 255  # bytes in one path component on Linux/macOS filesystems


def _exists(p: Path, flag: str) -> bool:
    try:
        return p.exists()
    except (OSError, ValueError) as e:  # name too long, NUL byte, ...
        raise UserError(f"{flag} {p}: {e}") from None


def run_id(value: str | None, flag: str = "--run-id") -> str | None:
    """A run directory name: one plain path component, so results/runs/<run-id> stays inside its
    root (no '/', '..', absolute paths, control characters)."""
    if value is None:
        return None
    if (not value.strip() or value in (".", "..") or "/" in value or "\\" in value
            or not value.isprintable()):
        raise UserError(f"{flag} must be a plain directory name (no '/', not '.' or '..'), got {value!r}")
    if len(value.encode()) > NAME_MAX:
        raise UserError(f"{flag} is longer than {NAME_MAX} bytes")
    return value


def writable_dir(value: str | os.PathLike, flag: str) -> Path:
    """A directory we may create or write into: not an existing file, and its nearest existing
    ancestor a directory we can write to (so mkdir/atomic writes later cannot fail)."""
    p = Path(value)
    if not str(value).strip():
        raise UserError(f"{flag} is empty")
    if _exists(p, flag) and not p.is_dir():
        raise UserError(f"{flag} {p} exists and is not a directory")
    anc = p.absolute()
    while not _exists(anc, flag):
        anc = anc.parent
    if not anc.is_dir():
        raise UserError(f"{flag} {p}: {anc} is a file, not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {p}: {anc} is not writable")
    return p


def result_dir(value: str | os.PathLike | None, flag: str = "--result-dir") -> Path:
    """The runs root (`--result-dir`, else $DLLM_BENCH_RESULTS_DIR, else results/runs), writable."""
    root = results_root(value)
    writable_dir(root, flag if value is not None else f"{flag} (default {root})")
    return root


def out_file(value: str | os.PathLike, flag: str = "--out") -> Path:
    """A file to (over)write: not a directory, in a directory we can create or write to."""
    p = Path(value)
    if not str(value).strip():
        raise UserError(f"{flag} is empty")
    if _exists(p, flag) and p.is_dir():
        raise UserError(f"{flag} {p} is a directory")
    writable_dir(p.absolute().parent, flag)
    return p


def input_file(value: str | os.PathLike | None, flag: str) -> Path | None:
    """An existing, readable regular file (not a directory)."""
    if value is None:
        return None
    p = Path(value)
    if not str(value).strip():
        raise UserError(f"{flag} is empty")
    if not _exists(p, flag):
        raise UserError(f"{flag}: no such file: {p}")
    if not p.is_file():
        raise UserError(f"{flag}: {p} is not a regular file")
    if not os.access(p, os.R_OK):
        raise UserError(f"{flag}: {p} is not readable")
    return p


def checkpoint_dir(value: str, *, tokenizer: bool = False, why: str = "") -> Path:
    """A preset name or LLaDA checkpoint directory whose config and weights agree
    (`dllm_bench.checkpoints.load.model_dir`), with tokenizer files when `tokenizer`."""
    path = model_dir(value)
    if tokenizer and not has_tokenizer(path):
        raise UserError(f"{path} has no tokenizer files" + (f": {why}" if why else ""))
    return path
