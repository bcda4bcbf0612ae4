"""One frontier configuration on one model: its questions through a fresh system at a fixed
concurrency, scored and timed from the same requests.

"N requests at once" is vLLM's `--max-concurrency` over serve's own replay
(dllm_bench.serve.loadgen.run_open_loop): every question arrives at t = 0 and at most N are in
flight; the next one is handed over when one finishes. The engine batches whatever is in
flight continuously; a baseline's static batch is N, so it takes N questions, runs them to
completion and takes the next N. Throughput is output tokens (every generated position, EOS
padding included, as `serve` counts them) over the makespan. Accuracy comes from the same
outputs through the accuracy command's scoring (dllm_bench.accuracy.evaluate) and its Wilson
interval; decoding is greedy.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dllm_bench import console
from dllm_bench.accuracy.backend import PointBackend, decode_completion
from dllm_bench.accuracy.evaluate import eval_lm_eval_point, eval_synth_point
from dllm_bench.accuracy.points import GENERATED, PointResult
from dllm_bench.checkpoints.load import encode_prompt
from dllm_bench.errors import UserError
from dllm_bench.metrics.serving import summarize
from dllm_bench.serve.loadgen import run_open_loop
from dllm_bench.systems.build import warm_up
from engine.request import RequestOutput


@dataclass
class ConcurrentBackend(PointBackend):
    """PointBackend whose calls run at most `concurrency` requests at once through a fresh
    system from `build`, keeping serve's replay results (`runs`) for the serving metrics."""
    concurrency: int = 8
    build: Callable[[], Any] | None = None
    runs: list = field(default_factory=list)

    def __call__(self, prompts: list[str], gen_kwargs: dict) -> list[str]:
        params = self.params_for(gen_kwargs.get("max_gen_toks"))
        ids = [encode_prompt(self.tok, p, self.chat) for p in prompts]
        system = self.build()
        # first-call costs (allocations, kernel selection) are not serving
        warm_up(system, ids[0][:8], params.block_length, 1)
        items = [{"request_id": f"q{i}", "prompt_ids": x, "gen_length": params.gen_length, "arrival": 0.0}
                 for i, x in enumerate(ids)]
        with console.progress(enabled=self.show_progress) as prog:
            task = prog.add_task(self.label or self.point.name, total=len(items))
            res = run_open_loop(system, items, lambda _it: params, keep_token_ids=True,
                                max_concurrency=self.concurrency, progress_interval=0.5,
                                progress=lambda _a, done, _tps: prog.update(task, completed=done))
        if res["interrupted"]:
            raise KeyboardInterrupt
        if res["rejected"]:
            raise ValueError(res["rejected"][0]["error"])
        outs = [_output(rec, ids) for rec in res["records"]]
        outs.sort(key=lambda o: int(o.request_id[1:]))
        self.runs.append(res)
        self.elapsed_s += res["duration"]
        self.outputs.extend(outs)
        self.by_prompt.update(zip(prompts, outs, strict=True))
        self.stats.append(res["stats"])
        eos = self.source.config.eos_token_id
        return [decode_completion(self.tok, o.token_ids, eos) for o in outs]

    def serving(self) -> dict:
        """serve's metrics over every call (one for the generated tasks; lm-eval may make several):
        their requests together over their summed makespans."""
        recs = [r for res in self.runs for r in res["records"]]
        merged = {"records": recs, "duration": sum(res["duration"] for res in self.runs), "rejected": [],
                  "stats": _sum_counters([res["stats"] for res in self.runs])}
        return summarize(merged, max_concurrency=self.concurrency)


def _output(rec: dict, ids: Sequence[Sequence[int]]) -> RequestOutput:
    """A replay record (dllm_bench.serve.loadgen) as the RequestOutput the scorers read."""
    return RequestOutput(rec["request_id"], list(ids[int(rec["request_id"][1:])]), list(rec["token_ids"]),
                         int(rec["nfe"] or 0), rec["arrival_time"], rec["admitted_time"], rec["first_token_time"],
                         rec["finished_time"], int(rec["logits_rows"] or 0), int(rec["kv_tokens"] or 0),
                         int(rec["kv_bytes"] or 0), steps_per_block=list(rec.get("steps_per_block") or ()))


def _sum_counters(stats: list[dict]) -> dict:
    out = dict(stats[-1]) if stats else {}
    for k in ("steps", "forwards", "query_tokens", "logits_rows", "batched_requests"):
        vals = [s.get(k) for s in stats]
        if all(isinstance(v, int) for v in vals):
            out[k] = sum(vals)
    return out


@dataclass
class Measured:
    """One (configuration, model, repeat): its accuracy point and serving summary."""
    result: PointResult
    serving: dict
    records: list
    wall_s: float


def measure(backend: ConcurrentBackend, task: str, docs: list[dict] | None, limit: int,
            metadata: dict | None = None, num_fewshot: int | None = None) -> Measured:
    """Score and time one configuration on one model (a fresh backend each time)."""
    t0 = time.perf_counter()
    try:
        if task in GENERATED:
            res = eval_synth_point(backend, docs)
        else:
            res = eval_lm_eval_point(task, backend, limit, metadata=metadata, num_fewshot=num_fewshot)
    except ValueError as e:     # a request that can never run (too long for the model, ...)
        raise UserError(f"{backend.point.name}: {e}") from None
    recs = [r for run in backend.runs for r in run["records"]]
    return Measured(res, backend.serving(), recs, time.perf_counter() - t0)
