"""The fit itself: each measured point's evidence as linear observables of the step terms, solved
by bounded least squares with a weak pull towards the base profile.

Given a replay (its forwards in order, when each busy period began), a time the run measured is
linear in the terms: a step's wall time is φ(step)·θ; the moment a block was committed is the
start of its busy period (an arrival: fixed) plus φ·θ summed over the forwards since; the point's
duration and mean E2EL are such sums too. Every row is divided by the point's duration (a block
segment, a step) or by its own value (the totals), so each point weighs by its relative error.
Rows `lam / scale` pull each term towards its prior (the operators as calibrated, no host time):
a direction the runs do not determine stays where the base profile puts it.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dllm_bench.simulate.cost_model import CostModel
from dllm_bench.simulate.fit.replay import Replay
from dllm_bench.simulate.fit.terms import ENGINE, HOST_TERMS, SCALES, Terms, family, host_features

LAMBDA = 0.1
ENGINE_ONLY = ("c_graph", "c_capture", "c_start")
STEP_MATCH = 0.95          # a steps.jsonl is used when this share of its steps matches the replay's


@dataclass
class Rows:
    A: np.ndarray              # [n, columns]
    b: np.ndarray              # measured - constant, [n]
    w: np.ndarray              # weight of each row, [n]
    evidence: str


def columns_for(replays: list[Replay]) -> list[str]:
    """`device`, then every host term of a family some replayed forward exercises."""
    used: dict[str, set[str]] = defaultdict(set)
    for r in replays:
        fam = family(r.point.system)
        for fw in r.forwards:
            used[fam] |= {t for t, v in host_features(fw).items() if v}
    cols = ["device"]
    for fam in sorted(used):
        cols += [f"{fam}.{t}" for t in HOST_TERMS if t in used[fam] and (fam == ENGINE or t not in ENGINE_ONLY)]
    return cols


def features(rep: Replay, device: CostModel, columns: list[str]) -> np.ndarray:
    fam = family(rep.point.system)
    out = np.zeros((len(rep.forwards), len(columns)))
    for i, fw in enumerate(rep.forwards):
        h = host_features(fw)
        for j, c in enumerate(columns):
            if c == "device":
                out[i, j] = device.step(fw).t_device
            elif c.split(".")[0] == fam:
                out[i, j] = h[c.split(".")[1]]
    return out


def _aligned(rep: Replay) -> bool:
    """Whether the point's recorded steps are the replay's, step for step."""
    steps = rep.point.steps or []
    if len(steps) != len(rep.forwards):
        return False
    same = sum(int(s.get("requests", fw.n_seq)) == fw.n_seq and int(s.get("logit_rows", fw.rows)) == fw.rows
               for s, fw in zip(steps, rep.forwards))
    return same >= STEP_MATCH * len(steps)


def observe(rep: Replay, phi: np.ndarray, evidence: str = "auto") -> Rows:
    """The point's observables: its steps, else its block segments, and always its totals.
    `evidence` forces a coarser kind ("blocks", "totals")."""
    p = rep.point
    n = len(rep.forwards)
    start = rep.busy_start()
    prefix = np.vstack([np.zeros(phi.shape[1]), np.cumsum(phi, axis=0)])

    def upto(e: int) -> tuple[np.ndarray, float]:      # (Σ φ over e's busy period up to e, its start time)
        a = start[e]
        return prefix[e + 1] - prefix[a], rep.starts[a]

    A, b, w = [], [], []
    kind = "totals"
    if evidence in ("auto", "steps") and p.steps and _aligned(rep):
        kind = "steps"
        for i, s in enumerate(p.steps):
            A.append(phi[i])
            b.append(float(s["wall_ms"]) / 1e3)
            w.append(1.0 / p.duration)
    elif evidence in ("auto", "steps", "blocks") and p.block_times:
        kind = "blocks"
        at: dict[int, list[float]] = defaultdict(list)
        for rid, times in p.block_times.items():
            for e, t in zip(rep.blocks.get(rid, []), times):
                at[e].append(t)
        prev_v, prev_c, prev_t = np.zeros(phi.shape[1]), 0.0, 0.0
        for e in sorted(at):
            v, c = upto(e)
            t = float(np.median(at[e]))
            A.append(v - prev_v)
            b.append(t - prev_t - (c - prev_c))
            w.append(1.0 / p.duration)
            prev_v, prev_c, prev_t = v, c, t
    # totals: the point's duration and mean E2EL
    v, c = upto(n - 1)
    A.append(v)
    b.append(p.duration - c)
    w.append(1.0 / p.duration)
    e2e, const = np.zeros(phi.shape[1]), 0.0
    for rid, blocks in rep.blocks.items():
        v, c = upto(blocks[-1])
        e2e += v
        const += c - p.arrivals.get(rid, 0.0)
    m = max(1, len(rep.blocks))
    A.append(e2e / m)
    b.append(p.mean_e2el - const / m)
    w.append(1.0 / max(p.mean_e2el, 1e-9))
    return Rows(np.array(A), np.array(b), np.array(w), kind)


def solve(rows: list[Rows], columns: list[str], prior: Terms | None = None, lam: float = LAMBDA) -> Terms:
    """Bounded least squares (scaled columns; every term >= 0 but c_graph; the scale k > 0)."""
    from scipy.optimize import lsq_linear  # scipy costs ~0.5 s to import: only a fit solves

    prior = prior or Terms()
    scale = np.array([SCALES[c.split(".")[-1]] for c in columns])
    A = np.vstack([r.A * r.w[:, None] for r in rows]) * scale
    b = np.concatenate([r.b * r.w for r in rows])
    if lam > 0:
        A = np.vstack([A, lam * np.eye(len(columns))])
        b = np.concatenate([b, lam * np.array(prior.vector(columns)) / scale])
    lo = np.array([1e-3 if c == "device" else -np.inf if c.endswith("c_graph") else 0.0 for c in columns])
    res = lsq_linear(A, b, bounds=(lo, np.full(len(columns), np.inf)))
    z = np.where(np.abs(res.x) < 1e-6, 0.0, res.x)      # a term the solver drove to its bound is 0, not 1e-29
    return Terms.from_vector(columns, z * scale)
