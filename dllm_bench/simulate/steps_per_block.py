"""Parallel decoding in the simulator: how many forwards each block of each request takes.

A cost model commits no tokens, so it cannot know when a block whose policy reads confidences
(threshold, factor, entropy) is complete. `--steps-per-block` gives it that, per request
(engine.request.Request.planned_steps; Fast-dLLM's static batch ends a block when its slowest
row's plan does, as its rows ride along): declared values (`4`, or `2,3,4` drawn per block), or
the recorded `steps_per_block` of a serve, simulate or frontier run, each request drawing one
recorded request's whole list so its blocks stay as correlated as they were measured. Draws are
seeded by the run's seed and the request id: every system of a run, and a rerun, replays the
same plan for the same request. Spec forms: `parse`; the option: docs/SIMULATE.md.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dllm_bench import results
from dllm_bench.errors import UserError
from workloads.jsonl import objects


@dataclass(frozen=True)
class StepsPlan:
    source: str                          # what was given (for config.json)
    lists: tuple[tuple[int, ...], ...]   # recorded: one per request; declared: one list of values
    declared: bool

    def draw(self, request_id: str, num_blocks: int, seed: int = 0) -> list[int]:
        """The forwards each of a request's blocks takes."""
        rng = np.random.default_rng([seed, zlib.crc32(str(request_id).encode())])
        if self.declared:
            return [int(v) for v in rng.choice(self.lists[0], size=num_blocks)]
        return list(self.lists[int(rng.integers(len(self.lists)))])

    def check(self, block_length: int) -> None:
        """A block takes at least one forward and at most one per token (every policy commits one)."""
        worst = max(max(x) for x in self.lists)
        if worst > block_length:
            raise UserError(f"--steps-per-block {self.source}: {worst} forwards for a block of {block_length} tokens; "
                            "parallel decoding commits at least one token per forward")

    def describe(self) -> dict:
        vals = [v for x in self.lists for v in x]
        return {"source": self.source, "declared": self.declared, "requests": None if self.declared else len(self.lists),
                "mean_steps_per_block": float(np.mean(vals)), "min": int(min(vals)), "max": int(max(vals))}


def parse(spec: str, root: Path | None = None) -> StepsPlan:
    """`--steps-per-block N[,M...] | FILE | DIR | RUN_ID`: `4` (every block takes 4 forwards) or
    `2,3,4` (each block of each request draws one of the values, uniformly); else a recorded plan
    (`recorded`): a `requests.jsonl` of a serve, simulate or frontier run, a directory holding one
    (a run, or a frontier point `points/<configuration>/`), or a run id under the results root."""
    text = spec.strip()
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = None
    if values is not None:
        if not values or min(values) < 1:
            raise UserError(f"--steps-per-block takes forwards >= 1 per block, got {spec!r}")
        return StepsPlan(text, (tuple(values),), True)
    return recorded(text, root)


def recorded(spec: str, root: Path | None = None) -> StepsPlan:
    path = Path(spec).expanduser()
    if not path.exists() and "/" not in spec and "\\" not in spec:
        path = results.results_root(root) / spec
    if path.is_dir():
        path = path / "requests.jsonl"
    if not path.is_file():
        raise UserError(f"--steps-per-block {spec}: no requests.jsonl there (a number, a requests.jsonl, a run "
                        "directory or id, or a frontier point's points/<configuration>/)")
    found = []
    try:
        for _, where, r in objects(path):
            spb = r.get("steps_per_block")
            if r.get("status", "finished") != "finished" or not spb:
                continue
            if not isinstance(spb, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                    for v in spb):
                raise ValueError(f"{where}: steps_per_block must be a list of integers >= 1, got {spb!r}")
            found.append(tuple(spb))
    except ValueError as e:
        raise UserError(str(e)) from None
    lists = tuple(found)
    if not lists:
        raise UserError(f"--steps-per-block {spec}: {path} records no steps_per_block (runs record them since "
                        "--decoding; a frontier run keeps one file per configuration: points/<configuration>/)")
    return StepsPlan(str(path), lists, False)
