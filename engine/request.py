"""A request (canvas of prompt + MASKs, block cursor, phase, times, counters); the pool of running canvases."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.kv_cache import SlotRanges
from engine.sampling import SamplingParams
from engine.unmask import RequestGenerators, origin_moves, timesteps


class Phase(enum.Enum):
    REFRESH = "refresh"                  # whole canvas is the query set, nothing cached
    REFRESH_STORE = "refresh_store"      # + store every position's K/V (dual cache, block start)
    REFRESH_SELECT = "refresh_select"    # + select and pack the retained K/V (sparse, delay step)
    REUSE = "reuse"                      # only the current block is queried, against the cache

    @property
    def is_refresh(self) -> bool:
        return self is not Phase.REUSE


def phase_at(step_in_block: int, cache: str, delay_step: int) -> Phase:
    if cache == "dual":
        return Phase.REFRESH_STORE if step_in_block == 0 else Phase.REUSE
    if cache == "sparse" and step_in_block >= delay_step:
        return Phase.REFRESH_SELECT if step_in_block == delay_step else Phase.REUSE
    return Phase.REFRESH


Status = enum.Enum("Status", ["WAITING", "RUNNING", "FINISHED", "ABORTED"])


@dataclass
class RequestOutput:
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    nfe: int
    arrival_time: float
    admitted_time: float | None
    first_token_time: float | None
    finished_time: float | None
    logits_rows: int = 0
    kv_tokens: int = 0
    kv_bytes: int = 0
    finished: bool = True
    steps_per_block: list[int] = field(default_factory=list)
    block_times: list[float] = field(default_factory=list)
    cache: str | None = None

    @property
    def tokens_per_forward(self) -> float:
        return len(self.token_ids) / self.nfe if self.nfe else 0.0


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    mask_id: int
    device: torch.device | str = "cpu"
    arrival_time: float = field(default_factory=time.perf_counter)
    cache: str | None = None    # none | dual | sparse for its life (cache=auto: None until admitted)
    shift: int = 0              # the model's prediction shift: a Reuse step also queries that many rows

    def __post_init__(self) -> None:
        p = self.params
        self.prompt_len = len(self.prompt_ids)
        self.length = self.prompt_len + p.gen_length
        self.block_length, self.steps_per_block, self.num_blocks = p.block_length, p.steps_per_block, p.num_blocks
        self.host_canvas = np.full(self.length, self.mask_id, dtype=np.int64)
        self.host_canvas[: self.prompt_len] = self.prompt_ids
        self.canvas = torch.from_numpy(self.host_canvas.copy()).to(self.device)
        self.status = Status.WAITING
        self.block = self.step_in_block = 0
        self.decoding = p.decoding
        self.block_commits = p.block_counts(p.block_length)
        self.time_grid = timesteps(self.steps_per_block, p.eps) if p.remasking == "origin" else None
        self.block_steps, self.block_times = [], []
        self.planned_steps = self._moves = None     # forwards per block where none commit; `moves` at a cursor
        self.gens = RequestGenerators(p.seed, self.device)
        self.admitted_time = self.first_token_time = self.finished_time = None
        self.nfe = self.logits_rows = self.kv_tokens = self.kv_bytes = 0
        self.slots = self.kv_pool = self.canvas_offset = self.canvas_pool = None     # set when admitted

    @property
    def block_range(self) -> tuple[int, int]:
        s = self.prompt_len + self.block * self.block_length
        return s, s + self.block_length

    def phase(self, delay_step: int) -> Phase:
        return phase_at(self.step_in_block, self.cache, delay_step)

    def query_cost(self, phase: Phase) -> int:
        return self.length if phase.is_refresh else self.block_length + self.shift

    @property
    def commit_count(self) -> int:
        """Tokens the fixed schedule commits now (parallel policies: 0, decided on the device)."""
        if not self.decoding.fixed:
            return 0
        moves = self.moves()
        return self.block_commits[self.step_in_block] if moves is None else int(moves.sum())

    def masked(self) -> int:
        s, e = self.block_range
        return int((self.host_canvas[s:e] == self.mask_id).sum())

    def moves(self) -> np.ndarray | None:
        """`origin`: which of the block's masked positions this step commits (engine.unmask.origin_moves)."""
        if self.time_grid is None:
            return None
        at = (self.block, self.step_in_block)
        if self._moves is None or self._moves[0] != at:
            self._moves = at, origin_moves(self.masked(), self.time_grid, self.step_in_block, self.gens.remask).numpy()
        return self._moves[1]

    def advance(self, now: float, committed: bool = True) -> None:
        """One step done: the block ends at the fixed schedule's last step, else once no mask is left (uncommitted
        steps: as planned); move the cursor, record a block's times."""
        if committed and not self.decoding.fixed:
            done = self.masked() == 0
        else:
            plan = None if self.decoding.fixed else self.planned_steps
            done = self.step_in_block + 1 >= (self.steps_per_block if plan is None else plan[self.block % len(plan)])
        self.step_in_block += 1
        if done:
            self.block_steps.append(self.step_in_block)
            self.block_times.append(now)
            self.step_in_block, self.block = 0, self.block + 1
            if self.first_token_time is None:
                self.first_token_time = now
            if self.block >= self.num_blocks:
                self.finished_time = now
                self.status = Status.FINISHED
            else:
                self.block_commits = self.params.block_counts(self.masked())

    def output(self) -> RequestOutput:
        return RequestOutput(
            self.request_id, list(self.prompt_ids), self.host_canvas[self.prompt_len:].tolist(), self.nfe,
            self.arrival_time, self.admitted_time, self.first_token_time, self.finished_time, self.logits_rows,
            self.kv_tokens, self.kv_bytes, self.status is Status.FINISHED, steps_per_block=list(self.block_steps),
            block_times=list(self.block_times), cache=self.cache)


class CanvasPool:
    """Every running request's canvas in one token tensor mirrored on the host (`req.canvas` views a range)."""

    def __init__(self, device):
        self.tokens = torch.empty(0, dtype=torch.long, device=device)
        self.host = np.empty(0, dtype=np.int64)
        self.ranges = SlotRanges(0)
        self.placed: dict[int, Request] = {}
        self.trash = self._take(1)                  # a cell no canvas owns: writes that commit nothing

    def place(self, req: Request) -> None:
        off = self._take(req.length)
        self.tokens[off : off + req.length] = req.canvas
        self.host[off : off + req.length] = req.host_canvas
        self.placed[off] = req
        req.canvas, req.host_canvas = self.tokens[off : off + req.length], self.host[off : off + req.length]
        req.canvas_offset, req.canvas_pool = off, self

    def _take(self, n: int) -> int:
        """A contiguous range of n cells (growing both arrays if needed) -> its offset."""
        got = self.ranges.take(n, contiguous=True)
        if got is None:
            added = max(len(self.host), n, 1024 - len(self.host))   # to twice the size, room for n, 1024 at least
            self.tokens = torch.cat([self.tokens, self.tokens.new_zeros(added)])    # zeros: a valid id
            self.host = np.concatenate([self.host, np.zeros(added, dtype=np.int64)])
            self.ranges.grow(len(self.host))
            for off, r in self.placed.items():     # re-point the views at the new storage
                r.canvas, r.host_canvas = self.tokens[off : off + r.length], self.host[off : off + r.length]
            got = self.ranges.take(n, contiguous=True)
        return got[0][0]

    def release(self, req: Request) -> None:
        del self.placed[req.canvas_offset]
        self.ranges.put([(req.canvas_offset, req.canvas_offset + req.length)])
        req.canvas, req.host_canvas = req.canvas.clone(), req.host_canvas.copy()
        req.canvas_offset = req.canvas_pool = None
