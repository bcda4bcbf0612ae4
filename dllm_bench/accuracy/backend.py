"""An accuracy point's system as an lm-eval backend: prompts + gen_kwargs -> completions
(PointBackend), and the `engine` backend `lm_eval --model dllm_bench --model_args
model=tiny-math,retention=0.1,selection=head` runs (engine_backend, registered by
dllm_bench.accuracy.lm_eval_model).

All samples of a point go through ONE system instance at once (LLMEngine.generate: every request
added, then stepped until all finish; the engine batches them continuously, baselines in static
batches). Decoding is greedy (temperature 0). With tensor parallelism an engine point runs on
ranks started for it and stopped after it (a GPU's memory is a fresh process's at every point);
baselines stay on one device.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_bench import console
from dllm_bench.accuracy.points import SCORE_QUERIES, SELECTIONS, SYSTEMS, Point, model_training_info
from dllm_bench.checkpoints.load import encode_prompt, load_tokenizer, model_dir
from dllm_bench.device_defaults import resolve_device_options
from dllm_bench.errors import UserError
from dllm_bench.systems import decoding as system_decoding
from dllm_bench.systems.inprocess import InProcess
from dllm_bench.systems.options import check_engine_only
from dllm_bench.systems.spec import ENGINE, retention_knobs
from dllm_bench.systems.step_budgets import AUTO
from engine import EngineConfig, SamplingParams
from engine.decoding import FIXED, Decoding
from engine.models import DenseLM


def point_system(point: Point, model: DenseLM | InProcess, *, max_num_seqs: int = 64,
                 max_num_batched_tokens: int | None = None, max_num_logits: int | str | None = AUTO, batch: int = 32,
                 pool_window: int = 3, delay_step: int = 1, memory_budget: int | None = None,
                 decoding: Decoding = Decoding(), cuda_graphs: bool | None = None,
                 longest_canvas: int | None = None, block_length: int = 32) -> Any:
    """A fresh serving system for `point` over a loaded model or a checkpoint's systems
    (dllm_bench.systems.inprocess: there an engine may run over several ranks of its own; close
    it to stop them). `memory_budget`: the run's one budget (measured once; per rank), so every
    point's engine gets the same KV pool rather than whatever the previous point's engine left
    free. `decoding`: the policy its requests ask for; a baseline gets it through its knobs
    (Fast-dLLM's threshold / factor), or runs fixed (dllm_bench.systems.decoding). The engine's
    token and logit budgets (None / AUTO: not given) are 8192 and 1024 on a CPU and scale with
    the GPU on CUDA (dllm_bench.systems.step_budgets; at least `longest_canvas`, default the model's length)."""
    src = model if isinstance(model, InProcess) else InProcess.over(model)
    if point.system == ENGINE:
        b = src.budgets(tokens=max_num_batched_tokens, logits=max_num_logits, max_num_seqs=max_num_seqs,
                        block_length=block_length, longest_canvas=longest_canvas, budget_bytes=memory_budget)
        cfg = EngineConfig(cache=point.cache or "none", selection=point.selection or "head",
                           retention=point.retention, score_query=point.score_query, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=b.max_num_batched_tokens, max_num_logits=b.max_num_logits,
                           pool_window=pool_window, delay_step=delay_step, sampling=False, attention_backend="auto",
                           memory_budget=memory_budget, cuda_graphs=cuda_graphs,
                           ridge_rows=b.ridge_rows or EngineConfig.ridge_rows)
        return src.engine(cfg, label=point.name)
    knobs = dict(retention_knobs(point.retention).get(point.system, {}))
    knobs.update(system_decoding.resolve(point.system, decoding).knobs)
    return src.baseline(point.system, batch=batch, knobs=knobs, label=point.name)


def decode_completion(tok, token_ids: Sequence[int], eos_id: int | None) -> str:
    """Generated ids -> text: cut at the first EOS (the answer ends there), special tokens dropped."""
    ids = list(token_ids)
    if eos_id is not None and eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return tok.decode(ids, skip_special_tokens=True)


@dataclass
class PointBackend:
    """prompts + lm-eval gen_kwargs -> completions, through `point`'s system (lm-eval Backend).

    Shape: gen_length = the given one, else max_gen_toks rounded up to a block multiple; steps
    = the given one, else gen_length (one token per step). `decoding`: the policy asked for
    (`decoded` is what the point's system runs: fixed where it has no such rule upstream).
    `source`: the checkpoint's systems (dllm_bench.systems.inprocess; default: over `model`,
    which may then be None), where an engine point may run over several ranks of its own."""
    model: Any
    tok: Any
    point: Point
    gen_length: int | None = None
    block_length: int = 32
    steps: int | None = None
    seed: int = 0
    chat: bool = False
    system_kw: dict = field(default_factory=dict)
    show_progress: bool = False
    label: str = ""
    decoding: Decoding = Decoding()
    source: InProcess | None = None
    outputs: list = field(default_factory=list)      # RequestOutputs of every call
    by_prompt: dict = field(default_factory=dict)    # prompt text -> its RequestOutput
    stats: list = field(default_factory=list)        # system.stats() of every call
    elapsed_s: float = 0.0

    def __post_init__(self) -> None:
        if self.source is None:
            self.source = InProcess.over(self.model)

    def params_for(self, max_gen_toks: int | None) -> SamplingParams:
        b = self.block_length
        g = self.gen_length or max(b, math.ceil(int(max_gen_toks or 256) / b) * b)
        return SamplingParams(gen_length=g, block_length=b, steps=self.steps or g, temperature=0.0, seed=self.seed,
                              decoding=self.decoded.decoding)

    @property
    def decoded(self) -> system_decoding.SystemDecoding:
        return system_decoding.resolve(self.point.system, self.decoding)

    @property
    def tensor_parallel_size(self) -> int:
        """The ranks this point's system runs on: a baseline always one device."""
        return self.source.ranks_of(self.point.system)

    def __call__(self, prompts: list[str], gen_kwargs: dict) -> list[str]:
        params = self.params_for(gen_kwargs.get("max_gen_toks"))
        ids = [encode_prompt(self.tok, p, self.chat) for p in prompts]
        label = self.label or self.point.name
        threads, system = torch.get_num_threads(), None     # spawned ranks set this process's to their share
        try:
            system = point_system(self.point, self.source, decoding=self.decoding,
                                  longest_canvas=max(map(len, ids), default=0) + params.gen_length,
                                  block_length=params.block_length, **self.system_kw)
            t0 = time.perf_counter()
            with console.progress(enabled=self.show_progress) as prog:
                task = prog.add_task(label, total=len(ids))
                outs = system.generate(ids, params, lambda done, _total: prog.update(task, completed=done))
            self.elapsed_s += time.perf_counter() - t0
            self.stats.append(system.stats())
        finally:
            if system is not None:              # an engine over several ranks: they stop here
                system.close()
            torch.set_num_threads(threads)
        self.outputs.extend(outs)
        self.by_prompt.update(zip(prompts, outs, strict=True))
        eos = self.source.config.eos_token_id
        return [decode_completion(self.tok, o.token_ids, eos) for o in outs]


def _arg(model_args: dict, key: str, cast, default=None):
    v = model_args.get(key)
    if v is None or v == "":
        return default
    if cast is bool:
        return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")
    return cast(v)


def engine_backend(model_args: dict) -> PointBackend:
    """The lm-eval backend `engine`: `model=<preset|dir>` plus optional `retention`, `selection`
    (head|uniform), `score_query` (mean|max), `cache` (none|dual|sparse; default sparse when retention < 1 is given, else
    none), `system` (engine or a baseline), `dtype` (default bfloat16 on CUDA, float32 on CPU),
    `device`, `memory_budget` (default auto: free GPU memory x GPU_MEMORY_UTILIZATION, none on CPU), `threads`,
    `gen_length`, `block_length`, `steps`, `seed`, `chat`, `max_num_seqs`, `batch` (baselines),
    `decoding` (fixed | threshold:τ | factor:f | entropy:γ; default fixed), `tensor_parallel_size`
    (the engine on N ranks, spawned for every call and stopped after it; `threads` shared out)."""


    spec = str(model_args.get("model", ""))
    if spec.startswith("engine:"):
        spec = spec.split(":", 1)[1]
    if not spec:
        raise ValueError("the engine backend needs model=<preset name or checkpoint dir>")
    threads = _arg(model_args, "threads", int)
    if threads:
        torch.set_num_threads(threads)
    retention = _arg(model_args, "retention", float, 1.0)
    selection = _arg(model_args, "selection", str, "head")
    system = _arg(model_args, "system", str, "engine")
    cache = _arg(model_args, "cache", str, "sparse" if retention < 1.0 else "none")
    if system not in SYSTEMS:
        raise ValueError(f"system must be one of {SYSTEMS}, got {system!r}")
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    if not 0 < retention <= 1:
        raise ValueError(f"retention must be in (0, 1], got {retention}")
    score_query = _arg(model_args, "score_query", str, "mean")
    if score_query not in SCORE_QUERIES:
        raise ValueError(f"score_query must be one of {SCORE_QUERIES}, got {score_query!r}")
    decoding = Decoding.parse(_arg(model_args, "decoding", str, FIXED))
    tp = _arg(model_args, "tensor_parallel_size", int, 1)
    if tp < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tp}")
    try:
        check_engine_only(tp, system)
    except UserError as e:
        raise ValueError(str(e)) from None
    role = "baseline" if system != ENGINE else ("dense" if cache == "none" else "sparse")
    point = Point(f"{system}:{cache}:{selection}:{score_query}:r{retention:g}", system, role, cache, selection,
                  retention, score_query)
    path = model_dir(spec)
    tok = load_tokenizer(path)
    if tok is None:
        raise ValueError(f"{path} has no tokenizer: the lm-eval backend needs text prompts")
    # A model trained by `dllm-bench train` decodes its fixed answer window by default (the task's
    # max_gen_toks may be longer than anything it saw in training); gen_length= overrides.
    window = model_training_info(path).get("config", {}).get("window")
    opts = resolve_device_options(_arg(model_args, "device", str, "auto"), _arg(model_args, "dtype", str),
                                  _arg(model_args, "memory_budget", str, "auto"))
    source = InProcess(str(path), opts.dtype, str(opts.device), tp, in_turn=True)
    if source.needs_model(system):
        source.model    # noqa: B018 - loaded now: a checkpoint that cannot load fails here, not at the first call
    kw: dict[str, Any] = {"memory_budget": opts.budget.bytes}
    if _arg(model_args, "max_num_seqs", int):
        kw["max_num_seqs"] = _arg(model_args, "max_num_seqs", int)
    if _arg(model_args, "batch", int):
        kw["batch"] = _arg(model_args, "batch", int)
    gen_length = _arg(model_args, "gen_length", int, window)
    return PointBackend(None, tok, point, gen_length=gen_length,
                        block_length=_arg(model_args, "block_length", int, min(32, gen_length or 32)),
                        steps=_arg(model_args, "steps", int), seed=_arg(model_args, "seed", int, 0),
                        chat=_arg(model_args, "chat", bool, False), system_kw=kw,
                        show_progress=_arg(model_args, "progress", bool, False), decoding=decoding, source=source)


