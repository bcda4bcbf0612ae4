"""LLMEngine: continuous batching of diffusion requests (add_request / step / generate / abort); its step counters."""
from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence

import numpy as np
import torch

from engine.attention import choose_backend
from engine.config import DTYPES, EngineConfig, resolve_device
from engine.graphs import StepGraphs
from engine.kv_cache import AUTO, KVPool, kv_need, never_cached
from engine.models import DenseLM, load_model
from engine.profiler import profile_kv_pool
from engine.request import CanvasPool, Request, RequestOutput, Status
from engine.runner import ModelRunner
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler, long_refusal, long_schedulers
from engine.step import Batch, Runner, StepDecisions

STEP_HISTORY = 4096      # per-step entries kept (the aggregates are exact whatever the number of steps)


class StepCounters(Counter):
    """Cumulative counters, the last steps' `batch_sizes` and `step_log`, and the batch-size suffix maxima."""

    def __init__(self) -> None:
        super().__init__(steps=0, forwards=0, query_tokens=0, logits_rows=0, max_logits_rows_in_step=0,
                         refresh_steps=0, reuse_steps=0, stalled_steps=0, stalled_requests=0,
                         deferred_steps=0, deferred_requests=0, batched_requests=0)
        self.batch_sizes: deque[int] = deque(maxlen=STEP_HISTORY)
        self.step_log: deque[tuple[int, int, int]] = deque(maxlen=STEP_HISTORY)
        self.maxima: list[tuple[int, int]] = []  # (step, batch size) of every step no later step matched or beat
        self.sink: Callable | None = None        # a step trace's: called with each forward's fields

    def record(self, batch_size: int, query_tokens: int, logits_rows: int, max_logits_rows: int,
               refresh: int, reuse: int, stalled: int = 0, deferred: int = 0, *, started: float | None = None,
               key_tokens: int = 0, padded: int | None = None, graph: bool = False, cache: dict | None = None) -> None:
        """One forward (`stalled`: left out by the budget, `deferred`: by the plan; `started`: sink it)."""
        if self.sink is not None and started is not None:
            self.sink(started, time.perf_counter(), batch_size, batch_size if padded is None else padded,
                      refresh, reuse, query_tokens, key_tokens, logits_rows, graph, cache)
        self.update(steps=1, forwards=1, query_tokens=query_tokens, logits_rows=logits_rows, refresh_steps=refresh,
                    reuse_steps=reuse, stalled_steps=int(stalled > 0), stalled_requests=stalled,
                    deferred_steps=int(deferred > 0), deferred_requests=deferred, batched_requests=batch_size)
        self["max_logits_rows_in_step"] = max(self["max_logits_rows_in_step"], max_logits_rows)
        self.batch_sizes.append(batch_size)
        self.step_log.append((refresh, reuse, query_tokens))
        while self.maxima and self.maxima[-1][1] <= batch_size:
            self.maxima.pop()
        self.maxima.append((self["steps"], batch_size))

    def stats(self) -> dict:
        return dict(self, batch_sizes=list(self.batch_sizes), step_composition=[list(s) for s in self.step_log],
                    batch_size_maxima=[list(m) for m in self.maxima])


def run_to_completion(system, prompts, params, progress=None) -> list[RequestOutput]:
    """Add every prompt to a serving system and step it until all finish; outputs in input order."""
    plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    ids = [system.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
    out: dict[str, RequestOutput] = {}
    while system.has_unfinished():
        for o in system.step():
            out[o.request_id] = o
            if progress:
                progress(len(out), len(ids))
    return [out[i] for i in ids]


class LLMEngine(contextlib.AbstractContextManager):
    """One device's engine; `runner`: any `engine.step.Runner` (without a model: `kv_pool_tokens`)."""

    def __init__(self, config: EngineConfig, model: DenseLM | None = None, runner: Runner | None = None):
        self.config = config
        if config.tensor_parallel_size > 1 and runner is None:
            raise ValueError("tensor_parallel_size > 1 is an engine over several ranks: build it with "
                             "engine.open(config)")
        if model is None and runner is None:
            model = load_model(config.model, DTYPES[config.dtype], resolve_device(config.device))
        self.model = model if model is not None else getattr(runner, "model", None)
        source = runner if runner is not None else model
        self.device, self.dtype = source.device, source.dtype
        self.model_config = runner.model_config if runner is not None else model.config
        self.max_model_len = config.max_model_len or self.model_config.max_sequence_length
        self.attention = choose_backend(config.attention_backend, self.device, self.dtype)
        self.profile, capacity = None, config.kv_pool_tokens
        if capacity is None and (config.memory_budget is not None or self.device.type == "cuda"):
            if self.model is None:
                raise ValueError("an injected runner without a model cannot be profiled: set kv_pool_tokens")
            self.profile = profile_kv_pool(self.model, config, self.attention.name, self.max_model_len)
            capacity = self.profile.kv_pool_tokens
            if not self.profile.long_canvas:
                self.max_model_len = min(self.max_model_len, config.max_num_batched_tokens)
        self.pool = KVPool(capacity, self.model_config, self.dtype, self.device)
        self.canvases = CanvasPool(self.device)
        self.scheduler = Scheduler(config, self.pool, self.canvases)
        chunk = config.refresh_chunk_tokens or (self.profile.refresh_chunk_tokens if self.profile else None)
        self.runner = runner if runner is not None else ModelRunner(self.model, config, self.attention.name,
                                                                    self.pool, self.max_model_len, chunk)
        self._ids = itertools.count()
        self.counters = StepCounters()
        self.batch_sizes, self.step_log = self.counters.batch_sizes, self.counters.step_log

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None = None,
                    arrival_time: float | None = None) -> str:
        """Queue a request; raise ValueError if it could never run (it must not block the queue)."""
        prompt_ids = [int(t) for t in prompt_ids]
        c, mc, budget = self.config, self.model_config, self.config.max_num_batched_tokens
        if not prompt_ids:
            raise ValueError("empty prompt")
        if mc.mask_token_id in prompt_ids:
            raise ValueError(f"prompt contains the mask token id {mc.mask_token_id}")
        if min(prompt_ids) < 0 or max(prompt_ids) >= mc.padded_vocab:
            raise ValueError(f"prompt token ids must lie in [0, {mc.padded_vocab})")
        if params.temperature > 0 and not c.sampling:
            raise ValueError("this engine was configured (and profiled) for greedy decoding: temperature must be 0")
        if params.cfg_scale > 0:
            raise ValueError("the engine does not implement classifier-free guidance (use the reference sampler)")
        length, trained = len(prompt_ids) + params.gen_length, mc.max_sequence_length
        if length > self.max_model_len:
            what = (f"the model's length of {trained} tokens (max_model_len)" if self.max_model_len == trained else
                    f"max_model_len {self.max_model_len} (the model's length: {trained} tokens)")
            raise ValueError(f"prompt + gen_length = {length} exceeds {what}")
        refusal = long_refusal(c)
        if length > budget and refusal:
            raise ValueError(f"{refusal}, so a canvas longer than the token budget cannot be served: "
                             f"prompt + gen_length = {length} exceeds max_num_batched_tokens {budget} (such a canvas "
                             f"is refreshed in chunks under scheduler={' | '.join(long_schedulers())} on one device)")
        req = Request(request_id or f"req-{next(self._ids)}", prompt_ids, params, mc.mask_token_id, self.device,
                      time.perf_counter() if arrival_time is None else arrival_time, shift=mc.shift)
        need = kv_need(c.cache, length, params.block_length, c.retention)     # under auto: sparse's, the least
        uncached = c.cache == "none" or (c.cache == AUTO and never_cached(self.pool.capacity, need))
        if params.block_length + mc.shift > budget and not uncached:
            edge = f" + {mc.shift} edge row" if mc.shift else ""
            raise ValueError(f"block_length {params.block_length}{edge} exceeds max_num_batched_tokens "
                             f"{budget}: its Reuse steps could never be scheduled")
        if not uncached and not self.pool.can_ever_fit(need):
            raise ValueError(f"request needs {need} KV token slots but the pool holds {self.pool.capacity}")
        self.scheduler.waiting.append(req)
        return req.request_id

    def abort(self, request_id: str) -> None:
        for req in [*self.scheduler.waiting, *self.scheduler.running]:
            if req.request_id == request_id:
                if req.status is Status.RUNNING:
                    self.scheduler.finish(req)
                else:
                    self.scheduler.waiting.remove(req)
                req.status = Status.ABORTED
                return

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def capture_graphs(self, block_length: int, prompt_len: int = 1, max_batch: int | None = None) -> int:
        """Every bucket's CUDA graph for Reuse steps of `block_length` now (`StepGraphs.capture_all`)."""
        graphs = getattr(self.runner, "graphs", None)
        return graphs.capture_all(block_length, prompt_len, max_batch) if isinstance(graphs, StepGraphs) else 0

    def step(self) -> list[RequestOutput]:
        started = time.perf_counter()
        batch = self.scheduler.schedule(started)
        if not batch:
            return []
        st = self.runner.run(batch)
        if st.decisions is not None:
            self.commit(batch, st.decisions)
        finished = self.advance(batch, time.perf_counter(), committed=st.decisions is not None)
        for req in finished:
            self.scheduler.finish(req)
        self.counters.record(len(batch), st.query_tokens, st.logits_rows, st.max_logits_rows, st.refresh, st.reuse,
                             self.scheduler.stalled, self.scheduler.deferred, started=started,
                             key_tokens=st.key_tokens, padded=st.padded_requests, graph=st.graph, cache=st.cache)
        return [req.output() for req in finished]

    def commit(self, batch: Batch, d: StepDecisions) -> None:
        """The decided tokens written into the canvas pool, then read back in one device-to-host copy."""
        offsets = np.array([r.canvas_offset for r, _ in batch], dtype=np.int64)
        cols = [d.row.long(), d.positions.long(), d.tokens.long()]
        index = d.canvas_index if d.canvas_index is not None else (
            torch.from_numpy(offsets).to(self.device, non_blocking=True)[d.row] + d.positions)
        if d.taken is not None:     # entries that do not commit write the trash cell (no cell written twice)
            index = torch.where(d.taken, index, self.canvases.trash)
            cols.append(d.taken.long())
        self.canvases.tokens[index] = d.tokens
        host = torch.stack(cols).cpu().numpy()
        row, pos, tok = host[:3] if d.taken is None else host[:3, host[3].astype(bool)]
        self.canvases.host[offsets[row] + pos] = tok
        for (req, _), n in zip(batch, d.logits_rows):
            req.nfe += 1
            req.logits_rows += n

    def advance(self, batch: Batch, now: float, committed: bool = True) -> list[Request]:
        """Move the cursors -> the finished requests (`committed` False: blocks end as planned)."""
        for req, _ in batch:
            req.advance(now, committed)
        return [req for req, _ in batch if req.status is Status.FINISHED]

    generate = run_to_completion

    def stats(self) -> dict:
        c, pool = self.counters.stats(), self.pool
        c.update({f"requests_{m}": self.scheduler.served[m] for m in ("dual", "sparse", "none")},
                 kv_pool_tokens=pool.capacity,
                 kv_pool_bytes=None if pool.capacity is None else pool.capacity * pool.bytes_per_token,
                 peak_kv_tokens=pool.peak_used, peak_kv_bytes=pool.peak_used * pool.bytes_per_token)
        if self.profile is not None:
            c["profile"] = self.profile.to_dict()
        return c

    def close(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        self.close()
