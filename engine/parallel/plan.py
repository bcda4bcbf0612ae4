"""A step's plan: the host data the driver sends every worker to run the same step over its shard."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.logits import RowSegment
from engine.runner import ModelRunner, PackedStep, row_segments
from engine.staging import Staging
from engine.step import StepMeta


@dataclass
class StepPlan:
    meta: StepMeta                      # what the forward runs (padded members included)
    ids: np.ndarray
    rows: np.ndarray                    # [R] the candidates' hidden rows
    # (start, count, T, gumbel state, Dream's params or None), as `engine.runner.row_segments`
    segments: list[tuple[int, int, float, torch.Tensor, object]]
    entropy: bool                       # the decode also computes entropies
    n_slots: int                        # the driver's KV storage slots (an unbounded pool grows)


class RecordingStaging(Staging):
    """A `Staging` remembering the host array behind each tensor it handed out this step."""

    def begin(self) -> RecordingStaging:
        self.host_arrays: dict[int, np.ndarray] = {}
        return super().begin()

    def put(self, a: np.ndarray) -> torch.Tensor:
        t = super().put(a)
        self.host_arrays[id(t)] = np.asarray(a)
        return t

    def host_of(self, t: torch.Tensor) -> np.ndarray:
        return self.host_arrays[id(t)]


def plan_of(p: PackedStep, batch, staging: RecordingStaging, n_slots: int) -> StepPlan:
    """The plan of the step the driver's runner just prepared (`p`, staged by `staging`)."""
    c = p.plan
    segments = [(s.start, s.count, s.temperature, s.gen.get_state(), s.dream)
                for s in row_segments([r for r, _ in batch], c)]
    return StepPlan(p.padded_meta, staging.host_of(p.ids), staging.host_of(c.rows), segments,
                    bool(getattr(c, "entropy", False)), n_slots)


def execute(runner: ModelRunner, plan: StepPlan) -> None:
    """A worker's share of the driver's step: the forward and the decode, nothing committed."""
    pool = runner.pool
    if pool.storage.shape[2] != plan.n_slots:
        pool.grow_to(plan.n_slots)
    fwd = runner.staging.begin()
    p = runner.packed(plan.meta, plan.meta, fwd, ids=plan.ids)
    rows = fwd.put(plan.rows)
    fwd.flush()
    hidden = runner.forward(p)
    segments = [RowSegment(a, n, t, _generator(state, runner.device), dream) for a, n, t, state, dream in plan.segments]
    kw = {"entropy": True} if plan.entropy else {}
    runner.decode_rows(runner.model.lm_head, hidden, rows, segments, runner.config.max_num_logits,
                       runner.model_config.mask_token_id, **kw)


def _generator(state: torch.Tensor, device: torch.device) -> torch.Generator:
    """A generator in the driver's request generator's state (on this rank's device type)."""
    gen = torch.Generator(device=device if device.type == "cuda" else "cpu")
    gen.set_state(state)
    return gen
