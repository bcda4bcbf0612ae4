"""`dllm-bench simulate --fit RUNS --hardware BASE --name NAME`: a hardware profile fitted to
measured serve runs, written in the format `simulate --hardware NAME` reads, with how far it is
off each measured cell (fitted, and with each system left out of the fit) as its validation.

Rounds: replay every point on the current profile, fit the terms on the replays (solve.py), make
the profile (terms.py); again while a replay's schedule changed (a point at a finite rate
schedules by the clock; at `--rps inf` one round is exact).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.results import fmt_rps
from dllm_bench.simulate import hardware
from dllm_bench.simulate.fit import measured as measured_mod
from dllm_bench.simulate.fit.replay import Replay, replay, setup_for
from dllm_bench.simulate.fit.solve import LAMBDA, columns_for, features, observe, solve
from dllm_bench.simulate.fit.terms import HOST_TERMS, Terms, device_model, profile
from dllm_bench.simulate.hardware import Hardware

ROUNDS = 3
EVIDENCE_TEXT = {"steps": "per-step times (steps.jsonl)", "blocks": "block-completion times (requests.jsonl)",
                 "totals": "totals (duration, mean E2EL)"}
METRICS = (("output_throughput", "tok/s", 1.0), ("mean_e2el_ms", "mean E2E s", 1e-3))


@dataclass
class Fit:
    terms: Terms
    profile: Hardware
    columns: list[str]
    evidence: dict[str, str]                           # point -> what it was fitted on
    cells: list[dict] = field(default_factory=list)    # the fitted profile against each point
    held_out: list[dict] = field(default_factory=list)  # each system predicted with it left out


def fit(points: list[measured_mod.MeasuredPoint], base: Hardware, name: str, evidence: str = "auto",
        lam: float = LAMBDA) -> Fit:
    prof = base
    reps = [replay(p, prof) for p in points]
    for _ in range(ROUNDS):
        cols = columns_for(reps)
        rows = []
        for r in reps:
            dev = device_model(base, setup_for(r.point, base).shape)
            rows.append(observe(r, features(r, dev, cols), evidence))
        terms = solve(rows, cols, lam=lam)
        prof = profile(base, terms, sorted({p.system for p in points}), name)
        new = [replay(p, prof) for p in points]
        same = all(len(a.forwards) == len(b.forwards) and a.blocks == b.blocks for a, b in zip(reps, new))
        reps = new
        if same:
            break
    return Fit(terms, prof, cols, {r.point.key: rows[i].evidence for i, r in enumerate(reps)},
               cells=[_cell(r) for r in reps])


def _cell(r: Replay) -> dict:
    p = r.point
    meas = {"output_throughput": p.tokens / p.duration, "mean_e2el_ms": p.mean_e2el * 1e3}
    out = {"system": p.label, "dataset": p.dataset, "rps": p.rps, "point": p.key}
    for m, _, _ in METRICS:
        sim = float(r.summary.get(m) or 0.0)
        out.update({f"{m}_meas": meas[m], f"{m}_sim": sim, f"{m}_err": sim / meas[m] - 1})
    return out


def leave_one_out(points: list[measured_mod.MeasuredPoint], base: Hardware, name: str, evidence: str = "auto",
                  lam: float = LAMBDA) -> list[dict]:
    """Each system's points predicted by a fit to every other system's (what a run of a system the
    profile was not fitted to can expect)."""
    out = []
    labels = list(dict.fromkeys(p.label for p in points))
    if len(labels) < 2:
        return out
    for label in labels:
        rest = [p for p in points if p.label != label]
        f = fit(rest, base, name, evidence, lam)
        out += [_cell(replay(p, f.profile)) for p in points if p.label == label]
    return out


def worst(cells: list[dict]) -> float:
    return max((abs(c[f"{m}_err"]) for c in cells for m, _, _ in METRICS), default=0.0)


def table(cells: list[dict], title: str, held_out: list[dict] = ()) -> str:
    """The cells as Markdown; with `held_out` (the same points, each predicted with its system
    left out of the fit) beside them, two more columns per metric."""
    left = {c["point"]: c for c in held_out}
    more = " | left out | err" if left else ""
    head = "| system | dataset | rps | " + " | ".join(f"{n} meas | sim | err{more}" for _, n, _ in METRICS) + " |"
    lines = [f"{title}\n", head, "|---|---|---|" + ("---:|" * (5 if left else 3)) * len(METRICS)]
    for c in cells:
        h = left.get(c["point"])
        vals = " | ".join(f"{c[m + '_meas'] * k:.4g} | {c[m + '_sim'] * k:.4g} | {c[m + '_err']:+.1%}"
                          + ("" if not left else " | - | -" if h is None else
                             f" | {h[m + '_sim'] * k:.4g} | {h[m + '_err']:+.1%}")
                          for m, _, k in METRICS)
        lines.append(f"| {c['system']} | {c['dataset']} | {fmt_rps(c['rps'])} | {vals} |")
    return "\n".join(lines)


def terms_table(f: Fit) -> str:
    lines = ["| term | family | value |", "|---|---|---:|",
             f"| operator time × k (k: operators inside a served step over the base profile's) | all | {f.terms.device:.3f} |"]
    units = {"c_logit": (1e6, "us"), "c_capture": (1.0, "s"), "c_start": (1.0, "s")}
    for fam, h in sorted(f.terms.host.items()):
        for t in HOST_TERMS:
            if f"{fam}.{t}" not in f.columns:
                continue
            k, unit = units.get(t, (1e3, "ms"))
            lines.append(f"| {t} | {fam} | {getattr(h, t) * k:.3g} {unit} |")
    return "\n".join(lines)


def validation(f: Fit, points: list[measured_mod.MeasuredPoint], runs: list[Path]) -> dict:
    """The provenance the profile carries (Hardware.validation_label reads it)."""
    devices = sorted({p.device for p in points if p.device})
    dates = sorted({p.date for p in points if p.date})
    v = {"how": "fitted to", "device": ", ".join(devices) or "the measured machine", "date": ", ".join(dates),
         "runs": [str(r) for r in runs], "within": worst(f.cells), "metrics": [m for m, _, _ in METRICS],
         "cells": f.cells, "evidence": f.evidence}
    if f.held_out:
        v.update(leave_one_out=worst(f.held_out), held_out_cells=f.held_out)
    return v


def fit_command(runs: list[Path], base_spec: str, name: str, out: Path | None, evidence: str, held_out: bool,
                console) -> Path:
    if evidence not in ("auto", *measured_mod.EVIDENCE):
        raise UserError(f"--fit-evidence must be auto, {', '.join(measured_mod.EVIDENCE)}; got {evidence!r}")
    base = hardware.load(base_spec)
    points = measured_mod.load(runs, console)
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    say(f"fitting {name!r} to {len(points)} measured points, from the operators of {base.name} ({base.description})")
    f = fit(points, base, name, evidence)
    for p in points:
        say(f"  {p.label} @ {fmt_rps(p.rps)} rps ({p.dataset}): fitted on its {EVIDENCE_TEXT[f.evidence[p.key]]}")
    say("\n" + terms_table(f) + "\n")
    say(table(f.cells, "The fitted profile against every measured point (each replayed as it ran):") + "\n")
    if held_out:
        f.held_out = leave_one_out(points, base, name, evidence)
        if f.held_out:
            say(table(f.held_out, "Each system predicted by a fit to the others (left out in turn):") + "\n")
    prof = f.profile
    prof.validation = validation(f, points, runs)
    prof.sources = [*base.sources, f"operators: {base.name} ({base.path or 'built-in'}); step terms fitted by "
                    f"`dllm-bench simulate --fit` to {', '.join(r.name for r in runs)}"]
    path = out or hardware.cache_dir() / f"{inputs.profile_name(name, '--name')}.json"
    hardware.save(prof, path)
    say(f"{prof.validation_label()}\nprofile: {path}")
    return path


