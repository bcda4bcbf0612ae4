"""Run directories under results/runs/<run-id>/ and crash-safe writes.

One layout for single runs and sweeps (a single `serve` is a sweep of one rps): config.json at
creation; per point (dataset, system, rps; repeat i > 0 as `<point>__r<i>`, workload seed + i)
its requests.jsonl and then its summary.json, written LAST so that its presence means "point
finished" (--resume); the run's summary.json (with `aggregate`: median, min-max over repeats),
metrics.csv, requests.jsonl and plots/. The full layout: docs/CONTRACTS.md ("A serving run's
directory"). Every file is written atomically (temp file in the same dir, fsync, os.replace), so
a crash or Ctrl-C leaves either the old file or the new one, never a truncated one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import IO, Any, NamedTuple

import pandas as pd
import torch

from dllm_bench.errors import UserError
from dllm_bench.repeats import aggregate_points

# The benchmark scripts' kinds (benchmarks/bench_*.py) hold one summary.json each (write_result).
KINDS = ("serve", "accuracy", "ablate", "sweep", "simulate", "frontier", "memory", "bench-mechanisms", "bench-engine",
         "bench-server")
RESULTS_ENV = "DLLM_BENCH_RESULTS_DIR"


def results_root(root: str | os.PathLike | None = None) -> Path:
    """results/runs relative to the working directory, unless given or set in the env."""
    return Path(root or os.environ.get(RESULTS_ENV) or Path("results") / "runs")


# ---------------------------------------------------------------- atomic writes
@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temp file next to `path`; on clean exit fsync and os.replace it onto `path`, on
    an exception delete it. Same directory so the rename never crosses filesystems."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt too: never leave temp files behind
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # fsync the directory so the rename itself survives a power loss (POSIX only).
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if isinstance(o, (Path, set, tuple)):
        return str(o) if isinstance(o, Path) else list(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    return repr(o)


def _clean(o: Any) -> Any:
    """NaN/inf are not JSON: NaN -> null, inf -> "inf" (vLLM writes request_rate "inf")."""
    if isinstance(o, float) and not math.isfinite(o):
        return None if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, Mapping):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_open(path) as f:
        json.dump(_clean(obj), f, indent=2, default=_default, allow_nan=False)
        f.write("\n")


def print_json(obj: Any) -> None:
    """A command's one --json document on stdout (its progress and tables go to stderr)."""
    sys.stdout.write(json.dumps(_clean(obj), default=_default, allow_nan=False) + "\n")
    sys.stdout.flush()


def atomic_write_jsonl(path: str | os.PathLike, rows: Iterable[Mapping]) -> None:
    with atomic_open(path) as f:
        for r in rows:
            f.write(json.dumps(_clean(r), default=_default, allow_nan=False) + "\n")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_csv(path: str | os.PathLike, df: pd.DataFrame) -> None:
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    with atomic_open(path) as f:
        f.write(buf.getvalue())


def read_json(path: str | os.PathLike) -> dict:
    """A run's JSON document (config.json, summary.json, calibrate.json, ...): a missing, damaged
    or non-object file is one UserError naming it, wherever a run directory is read."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable JSON file ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """A run's JSON-lines file (requests.jsonl, steps.jsonl): a damaged line is one UserError
    naming the file and line."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise UserError(f"{path}:{i}: not a JSON line ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable JSON-lines file ({getattr(e, 'strerror', None) or e})") from None
    return out


# ---------------------------------------------------------------- environment
def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_sha() -> str | None:
    repo = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        # Committed results being remade (results/: `report --keep`, `regress-update`) are not a
        # change to the code that measures, so the next run of a `make docs-*` target is not dirty.
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "-uno", "--", ".",
                                ":(exclude)results"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def environment_info() -> dict:
    """Versions and machine facts a number depends on (wall-clock results are per machine)."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "dllm_bench": _version("dllm-bench"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "git_sha": _git_sha(),
        "torch_threads": None, "cuda_device": None, "cuda_version": None,
    }
    try:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["cuda_device"] = torch.cuda.get_device_name(0)
            info["cuda_version"] = torch.version.cuda
    except Exception:  # noqa: BLE001 - a broken CUDA query must not lose a benchmark result
        pass
    return info


# ---------------------------------------------------------------- run directories
def make_run_id(name: str = "", now: dt.datetime | None = None) -> str:
    """UTC timestamp (sorts chronologically) + short sanitized name: 20250101T120000Z-serve."""
    now = now or dt.datetime.now(dt.timezone.utc)
    stamp = now.astimezone(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:48]
    return f"{stamp}-{slug}" if slug else stamp


class RunExistsError(UserError, FileExistsError):
    """--run-id names a run directory that exists (and --resume was not given)."""


def create_run(kind: str, config: Mapping[str, Any], *, name: str = "", run_id: str | None = None,
               root: str | os.PathLike | None = None, resume: bool = False) -> Path:
    """Make results/runs/<run-id>/ and write config.json (kind + knobs + environment).

    With resume=True an existing run dir is reused (its config.json keeps the original knobs
    and gains a `resumed_utc` entry); without it an existing dir is an error, never clobbered.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    base = results_root(root)
    run_dir = base / (run_id or make_run_id(name or kind))
    if run_dir.resolve().parent != base.resolve():  # the CLI checks --run-id; this guards callers
        raise UserError(f"run id {run_id!r} is not a plain directory name under {base}")
    cfg_path = run_dir / "config.json"
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    if cfg_path.exists():
        if not resume:
            raise RunExistsError(f"run directory {run_dir} exists (use --resume or another --run-id)")
        cfg = read_json(cfg_path)
        cfg.setdefault("resumed_utc", []).append(now)
    else:
        cfg = {"kind": kind, "run_id": run_dir.name, "created_utc": now,
               "config": dict(config), "environment": environment_info()}
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(cfg_path, cfg)
    return run_dir


def write_result(kind: str, config: Mapping[str, Any], summary: Mapping[str, Any], *, run_id: str | None = None,
                 root: str | os.PathLike | None = None) -> Path:
    """A run directory whose result is one document (a benchmark script's): config.json, then
    summary.json (written last: its presence means "finished")."""
    run_dir = create_run(kind, config, name=kind, run_id=run_id, root=root)
    atomic_write_json(run_dir / "summary.json", summary)
    return run_dir


def load_config(run_dir: str | os.PathLike) -> dict:
    return read_json(Path(run_dir) / "config.json")


def latest_run(kind: str, root: str | os.PathLike | None = None) -> Path | None:
    """Newest run dir of `kind` (by created_utc, then name), or None."""
    base = results_root(root)
    found = []
    for cfg in base.glob("*/config.json") if base.is_dir() else ():
        try:
            c = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # a foreign or broken dir is not a run
        if c.get("kind") == kind:
            found.append((c.get("created_utc", ""), cfg.parent.name, cfg.parent))
    return max(found)[2] if found else None


# ---------------------------------------------------------------- points (sweeps, resume)
class PointKey(NamedTuple):
    system: str
    rps: float  # math.inf = all requests at t=0 (vLLM's --request-rate inf)
    dataset: str = ""
    repeat: int = 0  # the i-th run of the point (workload seed = run seed + i; dllm_bench.repeats)

    @classmethod
    def of(cls, summary: Mapping[str, Any]) -> PointKey:
        """The key of a stored point summary."""
        return cls(summary["system"], float(_rps_from_json(summary["rps"])), summary.get("dataset", ""),
                   int(summary.get("repeat", 0) or 0))


def fmt_rps(rps: float) -> str:
    """A request rate for labels and file names: inf, or the shortest decimal (0.5, 1, 2.25)."""
    return "inf" if math.isinf(rps) else format(float(rps), "g")


def point_name(key: PointKey) -> str:
    parts = ([key.dataset] if key.dataset else []) + [key.system, f"rps{fmt_rps(key.rps)}"]
    if key.repeat:  # repeat 0 keeps the unrepeated name: a run resumed with more repeats keeps it
        parts.append(f"r{key.repeat}")
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", "__".join(parts))


def point_dir(run_dir: str | os.PathLike, key: PointKey) -> Path:
    return Path(run_dir) / "points" / point_name(key)


def write_point(run_dir: str | os.PathLike, key: PointKey, summary: Mapping[str, Any],
                requests: Iterable[Mapping], extra: Mapping[str, Any] | None = None) -> Path:
    """Persist one finished point, then rebuild the run-level tables. summary.json goes last:
    its existence is the "done" marker that finished_points() and --resume rely on."""
    pdir = point_dir(run_dir, key)
    atomic_write_jsonl(pdir / "requests.jsonl", requests)
    head = {"system": key.system, "rps": key.rps, "dataset": key.dataset, "repeat": key.repeat}
    atomic_write_json(pdir / "summary.json", {**head, **dict(extra or {}), **dict(summary)})
    write_run_tables(run_dir)
    return pdir


def _rps_from_json(v: Any) -> float:
    return math.inf if v == "inf" else float(v)


def load_points(run_dir: str | os.PathLike) -> list[dict]:
    """Summaries of all finished points, in directory-name order."""
    out = []
    for p in sorted((Path(run_dir) / "points").glob("*/summary.json")):
        s = read_json(p)
        try:
            s["rps"] = _rps_from_json(s["rps"])
        except (KeyError, TypeError, ValueError):
            s["rps"] = None
        if s["rps"] is None or not isinstance(s.get("system"), str):
            raise UserError(f"{p}: not a point summary (needs a 'system' string and a numeric 'rps')")
        s["_point"] = p.parent.name
        out.append(s)
    return out


def finished_points(run_dir: str | os.PathLike) -> set[PointKey]:
    """Points already finished in run_dir (to skip with --resume). Interrupted points are not
    "finished": a partial measurement must be re-run, not mixed into a sweep."""
    return {PointKey.of(s) for s in load_points(run_dir) if not s.get("interrupted")}


def metrics_frame(run_dir: str | os.PathLike, aggregate: bool = False) -> pd.DataFrame:
    """One row per finished point and repeat (scalar columns only), as in metrics.csv; with
    `aggregate` one row per point: the median over its repeats with `<metric>_min`/`_max`."""
    points = load_points(run_dir)
    if aggregate:
        points = aggregate_points(points)
    rows = [{k: v for k, v in s.items() if not isinstance(v, (dict, list))} for s in points]
    df = pd.DataFrame(rows)
    if not df.empty:
        lead = [c for c in ("dataset", "system", "rps", "repeat") if c in df.columns]
        df = df[lead + [c for c in df.columns if c not in lead and c != "_point"]]
        df = df.sort_values(lead, kind="stable").reset_index(drop=True)
    return df


def write_run_tables(run_dir: str | os.PathLike) -> None:
    """Rebuild summary.json (every repeat of every point, and `aggregate`: one row per point,
    median and min-max over its repeats), metrics.csv and requests.jsonl at the run level."""
    run_dir = Path(run_dir)
    points = load_points(run_dir)
    atomic_write_json(run_dir / "summary.json", {"run_id": run_dir.name, "points": [
        {k: v for k, v in s.items() if k != "_point"} for s in points], "aggregate": aggregate_points(points)})
    atomic_write_csv(run_dir / "metrics.csv", metrics_frame(run_dir))

    def all_requests():
        for s in points:
            tag = {"system": s["system"], "rps": s["rps"], "dataset": s.get("dataset", ""),
                   "repeat": s.get("repeat", 0)}
            f = run_dir / "points" / s["_point"] / "requests.jsonl"
            for r in read_jsonl(f) if f.exists() else ():
                yield {**tag, **r}
    atomic_write_jsonl(run_dir / "requests.jsonl", all_requests())


if __name__ == "__main__":  # pragma: no cover - quick look at what config.json will record
    json.dump(environment_info(), sys.stdout, indent=2)
