"""Hardware profiles: measured peaks (with their sources), fitted efficiencies and per-
implementation host costs, as JSON files (dllm_bench/simulate/hardware/*.json for the built-in
GPUs; `dllm-bench calibrate` writes one for the machine it runs on).

`--hardware NAME` resolves a built-in name (for `cpu`: this machine's calibrated file in the
cache when there is one, else the committed `cpu.json`), `--hardware FILE` reads a file. A
malformed file is one UserError line.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.results import atomic_write_json
from dllm_bench.simulate.cost_model import Efficiency, HostCost
from dllm_bench.simulate.implementations import IMPLEMENTATIONS

BUILTIN_DIR = Path(__file__).resolve().parent / "hardware"
KINDS = ("cpu", "gpu")


@dataclass
class Link:
    """The link between two GPUs of the machine, as tensor parallelism's collectives use it:
    `bandwidth` bytes/s one way for a large message, `latency` seconds of a small collective."""

    kind: str                          # e.g. "pcie4-x16 (via host)", "nvlink4"
    bandwidth: float
    latency: float
    sources: list[str] = field(default_factory=list)


@dataclass
class Hardware:
    name: str
    kind: str
    peak_flops: float                 # measured FLOP/s of a large GEMM in the serving dtype
    bandwidth: float                  # measured bytes/s of a large copy
    memory_bytes: float
    efficiency: Efficiency = field(default_factory=Efficiency)
    host: dict[str, HostCost] = field(default_factory=dict)   # "impl" or "impl/system" -> HostCost
    description: str = ""
    datasheet: dict = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    fit: dict = field(default_factory=dict)                   # what calibrate measured and its errors
    impl: str = ""                    # the implementation whose code was timed: every system's default
    # [[seconds asked, median seconds late], ...]: how late a sleep returns (serve's idle wait for the
    # next arrival); measured by calibrate where requests are short, empty (0) otherwise
    sleep_overshoot: tuple[tuple[float, float], ...] = ()
    link: Link | None = None          # between two of these GPUs (None: tensor parallelism not modelled)
    # How far the profile is off a measured run: written by `simulate --fit` (dllm_bench.simulate.fit):
    # {"device", "date", "runs", "within", "leave_one_out", "cells", ...}; empty: never checked
    validation: dict = field(default_factory=dict)
    path: str = ""

    def _host_entry(self, impl: str, system: str) -> HostCost | None:
        return self.host.get(f"{impl}/{system}") or self.host.get(impl)

    def host_cost(self, impl: str, system: str) -> HostCost:
        return self._host_entry(impl, system) or HostCost()

    def host_fitted(self, impl: str, system: str) -> bool:
        return self._host_entry(impl, system) is not None

    def overshoot(self, dt: float) -> float:
        """Seconds a sleep of `dt` returns late: the measured medians interpolated in log dt, the
        nearest one outside them (a timer's wake-up latency does not vanish for short sleeps)."""
        t = self.sleep_overshoot
        if dt <= 0 or not t:
            return 0.0
        return float(np.interp(math.log(dt), [math.log(a) for a, _ in t], [y for _, y in t]))

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("path")
        return d

    def validation_label(self, short: bool = False) -> str:
        return validation_label(self.kind, self.name, self.validation, short)


def validation_label(kind: str, name: str, validation: dict | None, short: bool = False) -> str:
    """What every simulated figure on a profile says about its accuracy: how far it was off the
    measured run it was fitted or checked against, or that it never was (`short`: without the
    held-out error, for a table's title)."""
    v = validation or {}
    if not isinstance(v.get("within"), (int, float)):
        return "not validated on real hardware" if kind == "gpu" else "not validated against a measured run"
    text = f"validated on {v.get('device') or name}, {v.get('date') or 'undated'} within {v['within']:.0%}"
    if isinstance(v.get("leave_one_out"), (int, float)) and not short:
        text += f" ({v.get('how', 'fitted to')} that run; {v['leave_one_out']:.0%} with each system left out of the fit)"
    return text


def cache_dir() -> Path:
    base = os.environ.get("DLLM_BENCH_CACHE") or Path.home() / ".cache" / "dllm-bench"
    return Path(base).expanduser() / "hardware"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.json"))


def resolve_path(spec: str, flag: str = "--hardware") -> Path:
    p = Path(spec)
    if p.suffix == ".json" or p.exists():
        if not p.is_file():
            raise UserError(f"{flag}: no such file: {spec}")
        return p
    try:
        name = inputs.profile_name(spec, flag)  # joined into a path: no '/' or '..' reaches outside the cache
    except UserError:
        name = None
    for path in (cache_dir() / f"{name}.json", BUILTIN_DIR / f"{name}.json") if name else ():
        if path.is_file():
            return path
    raise UserError(f"{flag}: {spec!r} is neither a file nor a profile ({', '.join(builtin_names())})")


def _num(d: dict, key: str, where: str, positive: bool = True, default: float | None = None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0) or v < 0:
        raise UserError(f"{where}: {key!r} must be a {'positive' if positive else 'non-negative'} number, got {v!r}")
    return float(v)


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _pairs(rows, where: str, key_ok, value_ok, says: str) -> list:
    """A JSON table of [key, value] pairs, keys strictly ascending: the pairs, or one UserError
    line saying what the table must be."""
    ok = isinstance(rows, list) and all(isinstance(r, list) and len(r) == 2 and key_ok(r[0]) and value_ok(r[1])
                                        for r in rows)
    if not ok or any(a[0] >= b[0] for a, b in zip(rows, rows[1:])):
        raise UserError(f"{where} must be a list of {says}")
    return rows


def _table(rows, where: str) -> tuple[tuple[int, float], ...]:
    """[[M, u_c], ...] with M positive integers, strictly ascending, and u_c positive."""
    rows = _pairs(rows, where, lambda m: isinstance(m, int) and not isinstance(m, bool) and m > 0,
                  lambda u: _real(u) and u > 0, "[M, u_c] pairs, M ascending integers and u_c > 0")
    return tuple((int(m), float(u)) for m, u in rows)


def _overshoots(rows, where: str) -> tuple[tuple[float, float], ...]:
    """[[dt, late], ...] with dt > 0 strictly ascending and late >= 0."""
    rows = _pairs(rows, where, lambda dt: _real(dt) and dt > 0, lambda late: _real(late) and late >= 0,
                  "[seconds asked, seconds late] pairs, seconds asked ascending and > 0, seconds late >= 0")
    return tuple((float(a), float(y)) for a, y in rows)


def _impl(d: dict, where: str) -> str:
    impl = d.get("impl", "")
    if impl and impl not in IMPLEMENTATIONS:
        raise UserError(f"{where}: 'impl' must be one of {', '.join(IMPLEMENTATIONS)}, got {impl!r}")
    return impl


def _link(d, where: str) -> Link | None:
    if d is None:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("kind"), str):
        raise UserError(f"{where}: 'link' must be an object with a 'kind' string")
    return Link(d["kind"], _num(d, "bandwidth", f"{where} link"), _num(d, "latency", f"{where} link"),
                list(d.get("sources") or []))


def from_dict(d: dict, where: str) -> Hardware:
    if not isinstance(d, dict):
        raise UserError(f"{where}: expected a JSON object")
    name, kind = d.get("name"), d.get("kind")
    if not isinstance(name, str) or not name:
        raise UserError(f"{where}: 'name' must be a non-empty string")
    if kind not in KINDS:
        raise UserError(f"{where}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    e = d.get("efficiency", {})
    if not isinstance(e, dict):
        raise UserError(f"{where}: 'efficiency' must be an object")
    eff = Efficiency(u_c=_num(e, "u_c", where, default=1.0), u_m=_num(e, "u_m", where, default=1.0),
                     u_attn=_num(e, "u_attn", where, default=1.0),
                     c_op=_num(e, "c_op", where, positive=False, default=0.0),
                     c_attn=_num(e, "c_attn", where, positive=False, default=0.0),
                     u_c_by_m=_table(e.get("u_c_by_m", []), f"{where}: 'u_c_by_m'"))
    host = {}
    if not isinstance(d.get("host", {}), dict):
        raise UserError(f"{where}: 'host' must be an object")
    for k, h in d.get("host", {}).items():
        if not isinstance(h, dict):
            raise UserError(f"{where}: host[{k!r}] must be an object")
        host[k] = _host(h, f"{where} host[{k!r}]")
    if not isinstance(d.get("validation", {}), dict):
        raise UserError(f"{where}: 'validation' must be an object")
    return Hardware(name=name, kind=kind, peak_flops=_num(d, "peak_flops", where), bandwidth=_num(d, "bandwidth", where),
                    memory_bytes=_num(d, "memory_bytes", where), efficiency=eff, host=host,
                    description=str(d.get("description", "")), datasheet=dict(d.get("datasheet") or {}),
                    sources=list(d.get("sources") or []), fit=dict(d.get("fit") or {}), impl=_impl(d, where),
                    sleep_overshoot=_overshoots(d.get("sleep_overshoot", []), f"{where}: 'sleep_overshoot'"),
                    link=_link(d.get("link"), where), validation=dict(d.get("validation") or {}))


SIGNED = ("c_graph",)      # a graph replay may cost less than an eager step


def _host(h: dict, where: str) -> HostCost:
    vals = {}
    for f in fields(HostCost):
        if f.name == "wake_tau_s":
            vals[f.name] = _num(h, f.name, where, default=f.default)
        elif f.name in SIGNED:
            v = h.get(f.name, f.default)
            if not _real(v):
                raise UserError(f"{where}: {f.name!r} must be a number, got {v!r}")
            vals[f.name] = float(v)
        else:
            vals[f.name] = _num(h, f.name, where, positive=False, default=f.default)
    return HostCost(**vals)


def load(spec: str, flag: str = "--hardware") -> Hardware:
    path = resolve_path(spec, flag)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"hardware profile {path}: not a readable JSON file ({e})") from None
    hw = from_dict(d, f"hardware profile {path}")
    hw.path = str(path)
    return hw


def save(hw: Hardware, path: Path) -> None:

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, hw.to_dict())
