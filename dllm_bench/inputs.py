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
import re
import tempfile
from pathlib import Path

import torch

from dllm_bench.checkpoints.load import has_tokenizer, load_config, model_dir
from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.errors import UserError
from dllm_bench.results import results_root
from dllm_bench.units import format_size

NAME_MAX = 255  # bytes in one path component on Linux/macOS filesystems
# Upper bound of a request or sample count (`--num-prompts`, `--limit`, rate x duration): the
# paper's largest trace has 2,000 requests, and building 100,000 already takes seconds, so a
# larger count is a typo rather than a benchmark (and would sit in workload generation for hours).
MAX_COUNT = 100_000
# Options checked against MAX_COUNT by dllm_bench.cli for every command that has them.
COUNT_OPTIONS = {"num_prompts": "requests per point", "limit": "samples per point"}


def _exists(p: Path, flag: str) -> bool:
    try:
        return p.exists()
    except (OSError, ValueError) as e:  # name too long, NUL byte, ...
        raise UserError(f"{flag} {p}: {e}") from None


def plain_name(value: str, flag: str, what: str = "name", suffix: str = "") -> str:
    """A name given on the command line that becomes one path component (a run directory, a
    hardware profile's NAME.json): no '/' or '\\', not '.' or '..', no control characters, so the
    file stays inside the directory it is meant for. `suffix`: what the file name adds to it."""
    if (not value.strip() or value in (".", "..") or "/" in value or "\\" in value
            or not value.isprintable()):
        raise UserError(f"{flag} must be a plain {what} (no '/', not '.' or '..'), got {value!r}")
    if len((value + suffix).encode()) > NAME_MAX:
        raise UserError(f"{flag} is longer than {NAME_MAX - len(suffix.encode())} bytes")
    return value


def run_id(value: str | None, flag: str = "--run-id") -> str | None:
    """A run directory name: results/runs/<run-id> stays inside its root (plain_name)."""
    return None if value is None else plain_name(value, flag, "directory name")


def profile_name(value: str, flag: str) -> str:
    """A hardware profile's name (`calibrate --name`, `simulate --fit --name`, `simulate --hardware
    NAME`): the file NAME.json in the profiles' cache (plain_name)."""
    return plain_name(value, flag, "profile name", ".json")


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
    _can_create(anc, p, flag)
    return p


def _can_create(d: Path, p: Path, flag: str) -> None:
    """Create and remove a file in `d`. The access check alone passes for root in pseudo
    filesystems (/proc, /sys) that hold no regular files, and on read-only mounts."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".dllm-bench-probe-", dir=d)
    except OSError as e:
        raise UserError(f"{flag} {p}: cannot create files in {d} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def count(value: int | None, flag: str, what: str = "") -> int | None:
    """A request/sample count: 1..MAX_COUNT (None = the command's default)."""
    if value is None:
        return None
    if value < 1:
        raise UserError(f"{flag} must be >= 1, got {value}")
    if value > MAX_COUNT:
        raise UserError(f"{flag} {value} is over the limit of {MAX_COUNT:,}" + (f" {what}" if what else "")
                        + " (the paper's largest trace has 2,000 requests: a larger count is a typo, not a benchmark)")
    return value


# A request or sample held by a run costs its token ids as Python ints in lists: ~40 bytes each
# (41 B per prompt token measured over a 20,000-request serve workload).
TOKEN_ID_BYTES = 40
# The share of the memory available at the start that a run's requests may take: the model, its
# KV pool and the worker processes need the rest.
MEMORY_SHARE = 0.5
# The longest a point's arrivals may span on the wall clock before its count is taken for a typo.
MAX_ARRIVAL_S = 24 * 3600


def available_memory() -> int | None:
    """Bytes a new allocation can have now (Linux MemAvailable, else the free pages), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def fits_memory(count: int, copies: int, tokens_each: int, flag: str, what: str) -> None:
    """Refuse `count` requests or samples whose token ids (`copies` of each held at once, each up to
    `tokens_each` ids) would not fit in MEMORY_SHARE of the memory available now: that run would
    swap or be killed hours in, instead of stopping here."""
    avail = available_memory()
    if avail is None:
        return
    per = max(1, tokens_each) * TOKEN_ID_BYTES * copies
    most = max(1, int(avail * MEMORY_SHARE) // per)
    if count > most:
        raise UserError(f"{flag} {count:,} is more than this machine can hold: a {what} keeps up to {tokens_each:,} "
                        f"token ids, {format_size(per)} over the {copies} copies the run holds, and half of the "
                        f"{format_size(avail)} of memory available now holds {most:,} of them")


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
    if p.exists() and not p.is_file():  # a device or pipe (/dev/null): the atomic write would replace it
        raise UserError(f"{flag} {p} exists and is not a regular file")
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


def checkpoint_dir(value: str, *, tokenizer: bool = False, why: str = "", weights: bool = True) -> Path:
    """A preset name or LLaDA checkpoint directory whose config and weights agree
    (`dllm_bench.checkpoints.load.model_dir`), with tokenizer files when `tokenizer`; with
    `weights=False` a config alone (a model simulated by its shape) is enough."""
    if not weights:
        path = resolve_model(value)
        load_config(path)
        return path
    path = model_dir(value)
    if tokenizer and not has_tokenizer(path):
        raise UserError(f"{path} has no tokenizer files" + (f": {why}" if why else ""))
    return path


def device(value: str, flag: str = "--device") -> str:
    """`cpu` or `cuda[:N]` with that GPU present: checked before a model is loaded on it."""
    m = re.fullmatch(r"cuda(?::(\d+))?", value)
    if value != "cpu" and m is None:
        raise UserError(f"{flag} must be cpu or cuda[:N], got {value!r}")
    if m is not None:
        if not torch.cuda.is_available():
            raise UserError(f"{flag} {value}: CUDA is not available here (use {flag} cpu)")
        if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
            raise UserError(f"{flag} {value}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return value
