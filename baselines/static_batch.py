"""Request-level static batching: the serving wrapper every baseline runs under. When idle, take
up to `max_batch_size` waiting requests FCFS and run them together, in lock step, to completion;
one `step()` is one batched forward, whose computation, caching and commits a decoding policy
(baselines.llada, fast_dllm, dllm_cache, sparse_dllm) decides. How it differs from upstream
(one shape per batch, left padding masked, per-row RoPE positions): StaticBatchSystem.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.engine import StepCounters, run_to_completion
from engine.kv_cache import bytes_per_token
from engine.models import DenseLM
from engine.request import Request, RequestOutput, Status
from engine.sampling import SamplingParams
from engine.unmask import transfer_schedule


@dataclass
class StepResult:
    query_tokens: int     # input positions of the forward (all rows, pads included)
    logits_rows: int      # logits rows materialized per batch row
    refresh: bool         # a full (refresh) forward, vs a cache-reusing one
    key_tokens: int | None = None   # keys attended, all rows (pads included); None: each row its whole canvas


class Batch:
    """The lock-step state of one static batch: a left-padded [B, L] canvas and its cursor."""

    def __init__(self, reqs: list[Request], pad_id: int, device, block_length: int | None = None):
        self.reqs, self.params = reqs, reqs[0].params
        # the policy's block: the request's, or the whole generation for a sampler without blocks
        self.block_length = block_length or self.params.block_length
        self.pads = [0] * len(reqs)
        self.prompt_len = max(r.prompt_len for r in reqs)          # padded prompt length
        L = self.prompt_len + self.params.gen_length
        self.x = torch.full((len(reqs), L), pad_id, dtype=torch.long, device=device)
        cols = torch.arange(L, device=device)
        pos, valid = [], []
        for i, r in enumerate(reqs):
            self.pads[i] = self.prompt_len - r.prompt_len
            self.x[i, self.pads[i]:] = r.canvas
            pos.append((cols - self.pads[i]).clamp(min=0))
            valid.append(cols >= self.pads[i])
        self.pos = torch.stack(pos)                                 # each row's own RoPE positions
        self.valid = torch.stack(valid)
        self.key_mask = self.valid if any(self.pads) else None      # None: attend unmasked
        self.block = self.step_in_block = self.forwards = 0
        self.new_block_schedules()

    size = property(lambda self: len(self.reqs))
    length = property(lambda self: self.x.shape[1])
    num_blocks = property(lambda self: self.params.gen_length // self.block_length)
    steps_per_block = property(lambda self: self.params.steps // self.num_blocks)

    @property
    def block_range(self) -> tuple[int, int]:
        s = self.prompt_len + self.block * self.block_length
        return s, s + self.block_length

    def row_length(self, i: int) -> int:
        return self.length - self.pads[i]

    def block_masked(self) -> torch.Tensor:
        """[B] bool: does the row still have MASKs in the current block?"""
        s, e = self.block_range
        return (self.x[:, s:e] == self.reqs[0].mask_id).any(1)

    def new_block_schedules(self) -> None:
        s, e = self.block_range
        n = (self.x[:, s:e] == self.reqs[0].mask_id).sum(1).tolist()
        self.schedules = [transfer_schedule(int(k), self.steps_per_block) for k in n]

    def schedule_at(self, step: int) -> list[int]:
        return [sch[step] if step < len(sch) else 0 for sch in self.schedules]


class Policy:
    """A decoding policy over the shared model code. Subclasses implement `step`."""

    name = "policy"
    knobs: dict = {}

    def __init__(self, model: DenseLM):
        self.model = model

    def block_length(self, params: SamplingParams) -> int:
        """The block a batch of these requests runs (a sampler without blocks: gen_length)."""
        return params.block_length

    def check_request(self, params: SamplingParams) -> None:
        """Refuse (ValueError) a request this policy's upstream code cannot run on this model."""

    def begin(self, batch: Batch) -> None:
        """A new batch starts: drop every cache."""

    def step(self, batch: Batch) -> StepResult:
        raise NotImplementedError

    def block_done(self, batch: Batch) -> bool:
        """Checked after each step (step_in_block already advanced). LLaDA's loop: S steps."""
        return batch.step_in_block >= self.fixed_forwards(batch)

    def fixed_forwards(self, batch: Batch) -> int:
        """The forwards the current block takes under fixed-step decoding, from counts alone (what a
        cost model reads: it commits no tokens). LLaDA's loop: S."""
        return batch.steps_per_block

    def kv_row_tokens(self, batch: Batch) -> list[int]:
        """Each row's own tokens currently held in the cache."""
        return [0] * batch.size

    def kv_token_bytes(self) -> int:
        """Bytes one cached token costs over all layers (K and V by default)."""
        return bytes_per_token(self.model.config, self.model.dtype)

    def cache_tensors(self) -> list[torch.Tensor]:
        return []

    def cache_bytes(self) -> int:
        """Bytes really held by the cache: unique storages, since cached slices may be views."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self.cache_tensors()}
        return sum(storages.values())


class Delegating(Policy):
    """Every hook of another policy (`real`): the base of a wrapper that charges, times or records
    its forwards while the batching, block ends and caches stay the real policy's."""

    def __init__(self, real: Policy):
        super().__init__(real.model)
        self.real, self.name, self.knobs = real, real.name, dict(real.knobs)

    def block_length(self, params: SamplingParams) -> int:
        return self.real.block_length(params)

    def check_request(self, params: SamplingParams) -> None:
        self.real.check_request(params)

    def begin(self, batch: Batch) -> None:
        self.real.begin(batch)

    def step(self, batch: Batch) -> StepResult:
        return self.real.step(batch)

    def block_done(self, batch: Batch) -> bool:
        return self.real.block_done(batch)

    def fixed_forwards(self, batch: Batch) -> int:
        return self.real.fixed_forwards(batch)

    def kv_row_tokens(self, batch: Batch) -> list[int]:
        return self.real.kv_row_tokens(batch)

    def kv_token_bytes(self) -> int:
        return self.real.kv_token_bytes()

    def cache_tensors(self) -> list[torch.Tensor]:
        return self.real.cache_tensors()

    def cache_bytes(self) -> int:
        return self.real.cache_bytes()


class StaticBatchSystem:
    """The serving-system interface (docs/CONTRACTS.md) over one decoding policy.

    A batch takes only *consecutive* FCFS requests of one (gen_length, policy block, steps), so
    every row shares the block cursor (upstream takes one shape per call); temperature, remasking
    and seed may differ per row. Mixed prompt lengths are left-padded as upstream's tokenizer
    does, but padded keys are masked and each row's RoPE positions are its own (upstream's cached
    paths ignore the mask and count the pads), so a request gets exactly its solo tokens (float64;
    bf16 near-ties may flip); a batch without padding attends unmasked, upstream's path. An
    aborted running request keeps its row until the batch ends. Counters mirror LLMEngine's;
    query tokens and logit rows include the pads (the static batch's cost)."""

    def __init__(self, model: DenseLM, policy: Policy, max_batch_size: int = 8, max_model_len: int | None = None):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model, self.policy, self.max_batch_size = model, policy, max_batch_size
        self.cfg = model.config
        self.max_model_len = max_model_len or self.cfg.max_sequence_length
        self.waiting: deque[Request] = deque()
        self.batch: Batch | None = None
        self._ids = itertools.count()
        self.counters = StepCounters()
        self.batch_sizes, self.step_log = self.counters.batch_sizes, self.counters.step_log
        self.peak_kv_tokens = self.peak_kv_bytes = 0

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        prompt_ids = [int(t) for t in prompt_ids]
        mask, vocab = self.cfg.mask_token_id, self.cfg.padded_vocab
        if not prompt_ids:
            raise ValueError("empty prompt")
        if mask in prompt_ids:
            raise ValueError(f"prompt contains the mask token id {mask}")
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")
        if params.cfg_scale > 0:
            raise ValueError("the baselines do not implement classifier-free guidance")
        if len(prompt_ids) + params.gen_length > self.max_model_len:
            raise ValueError(f"prompt + gen_length = {len(prompt_ids) + params.gen_length} exceeds the model's length "
                             f"of {self.max_model_len} tokens (max_model_len)")
        self.policy.check_request(params)
        req = Request(request_id or f"req-{next(self._ids)}", prompt_ids, params, mask, self.model.device,
                      time.perf_counter() if arrival_time is None else arrival_time)
        self.waiting.append(req)
        return req.request_id

    def abort(self, request_id: str) -> None:
        for r in [*self.waiting, *(self.batch.reqs if self.batch else [])]:
            if r.request_id == request_id:
                r.status = Status.ABORTED
        self.waiting = deque(r for r in self.waiting if r.status is not Status.ABORTED)
        if self.batch is not None and all(r.status is Status.ABORTED for r in self.batch.reqs):
            self.batch = None

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or self.batch is not None

    def _admit(self) -> None:
        first = self.waiting.popleft()
        shape = lambda r: (r.params.gen_length, self.policy.block_length(r.params), r.params.steps)  # noqa: E731
        reqs = [first]
        while self.waiting and len(reqs) < self.max_batch_size and shape(self.waiting[0]) == shape(first):
            reqs.append(self.waiting.popleft())
        now = time.perf_counter()
        for r in reqs:
            r.status, r.admitted_time = Status.RUNNING, now
        self.batch = Batch(reqs, self.cfg.pad_token_id, self.model.device, self.policy.block_length(first.params))
        self.policy.begin(self.batch)

    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        started = time.perf_counter()
        if self.batch is None:
            if not self.waiting:
                return []
            self._admit()
        b = self.batch
        res = self.policy.step(b)
        done = self._after_forward(b, res)
        rows = res.logits_rows * b.size
        keys = b.size * b.length if res.key_tokens is None else res.key_tokens
        self.counters.record(b.size, res.query_tokens, rows, rows, b.size if res.refresh else 0,
                             0 if res.refresh else b.size, started=started, key_tokens=keys)
        return done

    def _after_forward(self, b: Batch, res: StepResult) -> list[RequestOutput]:
        """Cursors, cache peaks and per-request counters after one forward; the requests that
        finished with it."""
        b.forwards += 1
        b.step_in_block += 1
        kv_rows = self.policy.kv_row_tokens(b)
        self.peak_kv_tokens = max(self.peak_kv_tokens, sum(kv_rows))
        self.peak_kv_bytes = max(self.peak_kv_bytes, self.policy.cache_bytes())
        for r, kv in zip(b.reqs, kv_rows, strict=True):
            r.nfe += 1
            r.logits_rows += res.logits_rows
            r.kv_tokens = max(r.kv_tokens, kv)
            r.kv_bytes = r.kv_tokens * self.policy.kv_token_bytes()
        if not self.policy.block_done(b):
            return []
        now = time.perf_counter()
        for r in b.reqs:   # a row whose block finished early rode along: its block took the batch's steps
            r.block_steps.append(b.step_in_block)
            r.block_times.append(now)
        b.block, b.step_in_block = b.block + 1, 0
        for r in b.reqs:
            r.first_token_time = r.first_token_time or now
        if b.block < b.num_blocks:
            b.new_block_schedules()
            return []
        self.batch = None
        done = []
        host = b.x.cpu().numpy()                    # one readback per finished batch
        for i, r in enumerate(b.reqs):
            r.canvas = b.x[i, b.pads[i]:].clone()
            r.host_canvas = host[i, b.pads[i]:].copy()
            if r.status is Status.ABORTED:
                continue
            r.status, r.finished_time = Status.FINISHED, now
            r.block = b.block
            done.append(r.output())
        return done

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams],
                 progress: Callable[[int, int], None] | None = None) -> list[RequestOutput]:
        """Run all prompts to completion; outputs in input order."""
        return run_to_completion(self, prompts, params, progress)

    def stats(self) -> dict:
        c = self.counters.stats()
        c.update(
            system=self.policy.name, knobs=dict(self.policy.knobs), max_batch_size=self.max_batch_size,
            kv_pool_tokens=None, kv_pool_bytes=None,   # no pool: caches live and die with the batch
            peak_kv_tokens=self.peak_kv_tokens, peak_kv_bytes=self.peak_kv_bytes,
        )
        return c

    def close(self) -> None:
        """Nothing to stop (the engine's interface: an engine over several ranks stops them)."""

    def __enter__(self) -> StaticBatchSystem:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
