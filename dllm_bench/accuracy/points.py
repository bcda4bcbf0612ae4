"""Accuracy under KV retention (the paper's §6.4 / Fig. 6): head-centric vs uniform selection.

One *point* = one serving configuration: the dense reference (the engine with cache=none, i.e.
exact LLaDA), the engine's sparse cache at (selection, retention), or a baseline system. All
samples of a point go through ONE system instance at once: every request is added, then the
system is stepped until all have finished (the engine batches them continuously; baselines in
static batches). Decoding is greedy (temperature 0), float32 by default.

Scoring: synth with workloads/tasks/scoring (lm-eval-exact GSM8K extraction; strict-match is
the primary metric, flexible-extract reported too); gsm8k and humaneval through
`lm_eval.simple_evaluate` (dllm_bench.accuracy.lm_eval_model.run_lm_eval, the tasks in
dllm_bench/accuracy/lm_eval_tasks) with a backend that runs the point's system. Each accuracy carries a
Wilson 95% interval. `engine_backend(model_args)` is also what `lm_eval --model dllm_bench
--model_args model=tiny-math,retention=0.1,selection=head` runs (registered in lm_eval_adapter).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASKS = ("synth", "synth-cot", "gsm8k", "humaneval")
GENERATED = ("synth", "synth-cot")     # our generated tasks: scored here, with dev / test splits
SYSTEMS = ("engine", "llada", "fast-dllm", "dllm-cache", "sparse-dllm")
SELECTIONS = ("head", "uniform")
SCORE_QUERIES = ("mean", "max")
DEFAULT_RETENTIONS = (0.1, 0.2, 0.3, 0.4, 0.5)
LM_EVAL_TASK = {"synth": "dllm_synth", "gsm8k": "dllm_gsm8k", "humaneval": "dllm_humaneval"}
# (gen_length, block_length, steps) per task: synth / synth-cot answers fit one 32-token block
# (one token per step); gsm8k / humaneval use LLaDA's evaluation lengths (one token per step,
# 32-token blocks). A model trained by `dllm-bench train` decodes its own answer window instead.
TASK_SHAPES = {"synth": (32, 32, 32), "synth-cot": (32, 32, 32), "gsm8k": (256, 32, 256),
               "humaneval": (512, 32, 512)}
PRIMARY_METRIC = {"synth": "strict-match", "synth-cot": "strict-match", "gsm8k": "strict-match",
                  "humaneval": "pass@1"}
Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n (0, 1 for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (0.0 if k == 0 else max(0.0, mid - half)), (1.0 if k == n else min(1.0, mid + half))


# ------------------------------------------------------------------------------------ points
@dataclass(frozen=True)
class Point:
    name: str
    system: str                   # engine | llada | fast-dllm | dllm-cache | sparse-dllm
    role: str                     # dense | sparse | baseline
    cache: str | None = None      # engine cache policy
    selection: str | None = None  # head | uniform (engine sparse); "uniform" for sparse-dllm
    retention: float = 1.0
    score_query: str = "mean"     # engine sparse: block queries' mean (upstream) | max

    def label(self) -> str:
        return self.name

    @property
    def series(self) -> str | None:
        """The curve this point belongs to: head | uniform | head-max | uniform-max."""
        if self.selection is None:
            return None
        return self.selection if self.score_query == "mean" else f"{self.selection}-{self.score_query}"


def plan_points(systems: Sequence[str], selections: Sequence[str], retentions: Sequence[float],
                include_r1: bool = True, score_queries: Sequence[str] = ("mean",)) -> list[Point]:
    """The dense reference first, then the sweep of every requested system."""
    pts = [Point("dense", "engine", "dense", cache="none", retention=1.0)]
    for s in systems:
        if s == "engine":
            if include_r1:
                pts.append(Point("sparse-r1.0", "engine", "sparse", "sparse", "head", 1.0))
            for q in score_queries:
                for sel in selections:
                    name = sel if q == "mean" else f"{sel}-{q}"
                    for r in retentions:
                        if r < 1.0 or not include_r1:
                            pts.append(Point(f"{name}-r{r:g}", "engine", "sparse", "sparse", sel, float(r), q))
        elif s == "sparse-dllm":
            for r in retentions:
                pts.append(Point(f"sparse-dllm-r{r:g}", "sparse-dllm", "baseline", None, "uniform", float(r)))
        else:
            pts.append(Point(s, s, "baseline"))
    return pts


def build_system(point: Point, model, *, max_num_seqs: int = 64, max_num_batched_tokens: int = 8192,
                 max_num_logits: int | None = 1024, batch: int = 32, pool_window: int = 3,
                 delay_step: int = 1):
    """A fresh serving system (engine interface) for `point` over an already-loaded model."""
    from engine import EngineConfig, LLMEngine

    if point.system == "engine":
        cfg = EngineConfig(cache=point.cache or "none", selection=point.selection or "head",
                           retention=point.retention, score_query=point.score_query, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, max_num_logits=max_num_logits,
                           pool_window=pool_window, delay_step=delay_step, sampling=False,
                           device=str(model.device), attention_backend="auto")
        return LLMEngine(cfg, model=model)
    from baselines import make_system

    knobs = {"keep_ratio": point.retention} if point.system == "sparse-dllm" else {}
    return make_system(point.system, model, max_batch_size=batch, **knobs)


def run_requests(system, prompts: Sequence[Sequence[int]], params, on_done: Callable[[int], None] | None = None):
    """Add every request, then step until all have finished (continuous batching in the engine).
    Returns RequestOutputs in input order. ValueError if a request can never run."""
    ids = [system.add_request(list(p), params) for p in prompts]
    out: dict[str, Any] = {}
    while system.has_unfinished():
        for o in system.step():
            out[o.request_id] = o
            if on_done:
                on_done(len(out))
    return [out[i] for i in ids]


def decode_completion(tok, token_ids: Sequence[int], eos_id: int | None) -> str:
    """Generated ids -> text: cut at the first EOS (the answer ends there), special tokens dropped."""
    ids = list(token_ids)
    if eos_id is not None and eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return tok.decode(ids, skip_special_tokens=True)


def progress_bar(label: str, total: int, enabled: bool):
    """A Rich progress bar over finished samples on stderr: (context manager, advance(n_done))."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), disable=not enabled, transient=True)
    task = prog.add_task(label, total=total)
    return prog, (lambda done: prog.update(task, completed=done))


# ------------------------------------------------------------------------------------ backend
@dataclass
class PointBackend:
    """prompts + lm-eval gen_kwargs -> completions, through `point`'s system (lm-eval Backend).

    Shape: gen_length = the given one, else max_gen_toks rounded up to a block multiple; steps
    = the given one, else gen_length (one token per step)."""
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
    outputs: list = field(default_factory=list)      # RequestOutputs of every call
    by_prompt: dict = field(default_factory=dict)    # prompt text -> its RequestOutput
    stats: list = field(default_factory=list)        # system.stats() of every call
    elapsed_s: float = 0.0

    def params_for(self, max_gen_toks: int | None):
        from engine import SamplingParams

        b = self.block_length
        g = self.gen_length or max(b, math.ceil(int(max_gen_toks or 256) / b) * b)
        return SamplingParams(gen_length=g, block_length=b, steps=self.steps or g, temperature=0.0, seed=self.seed)

    def __call__(self, prompts: list[str], gen_kwargs: dict) -> list[str]:
        from dllm_bench.checkpoints.load import encode_prompt

        params = self.params_for(gen_kwargs.get("max_gen_toks"))
        ids = [encode_prompt(self.tok, p, self.chat) for p in prompts]
        system = build_system(self.point, self.model, **self.system_kw)
        prog, advance = progress_bar(self.label or self.point.name, len(ids), self.show_progress)
        t0 = time.perf_counter()
        with prog:
            outs = run_requests(system, ids, params, advance)
        self.elapsed_s += time.perf_counter() - t0
        self.outputs.extend(outs)
        self.by_prompt.update(zip(prompts, outs, strict=True))
        self.stats.append(system.stats())
        eos = self.model.config.eos_token_id
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
    none), `system` (engine or a baseline), `dtype`, `device`, `threads`, `gen_length`,
    `block_length`, `steps`, `seed`, `chat`, `max_num_seqs`, `batch` (baselines)."""
    import torch

    from dllm_bench.checkpoints.load import load_model, load_tokenizer, model_dir

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
    role = "baseline" if system != "engine" else ("dense" if cache == "none" else "sparse")
    point = Point(f"{system}:{cache}:{selection}:{score_query}:r{retention:g}", system, role, cache, selection,
                  retention, score_query)
    path = model_dir(spec)
    tok = load_tokenizer(path)
    if tok is None:
        raise ValueError(f"{path} has no tokenizer: the lm-eval backend needs text prompts")
    # A model trained by `dllm-bench train` decodes its fixed answer window by default (the task's
    # max_gen_toks may be longer than anything it saw in training); gen_length= overrides.
    window = model_training_info(path).get("config", {}).get("window")
    model = load_model(spec, _arg(model_args, "dtype", str, "float32"), _arg(model_args, "device", str, "auto"))
    kw = {}
    if _arg(model_args, "max_num_seqs", int):
        kw["max_num_seqs"] = _arg(model_args, "max_num_seqs", int)
    if _arg(model_args, "batch", int):
        kw["batch"] = _arg(model_args, "batch", int)
    gen_length = _arg(model_args, "gen_length", int, window)
    return PointBackend(model, tok, point, gen_length=gen_length,
                        block_length=_arg(model_args, "block_length", int, min(32, gen_length or 32)),
                        steps=_arg(model_args, "steps", int), seed=_arg(model_args, "seed", int, 0),
                        chat=_arg(model_args, "chat", bool, False), system_kw=kw,
                        show_progress=_arg(model_args, "progress", bool, False))


# ------------------------------------------------------------------------------------ tasks
def model_training_info(path: Path) -> dict:
    """The checkpoint's training.json (written by dllm-bench train), or {}."""
    try:
        return json.loads((Path(path) / "training.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def generated_docs(task: str, split: str, n: int, seed: int, context_facts: int, knobs: dict) -> list[dict]:
    """The first `n` questions of a generated task's dev or test split (seed `seed`)."""
    from workloads.tasks import generated

    if split == "train":
        raise ValueError("accuracy is measured on the dev or test split, never on train")
    return generated.examples(task, split, n, seed=seed, context_facts=context_facts, **knobs)


def local_synth_docs(rows: list[dict], n: int) -> list[dict]:
    """GSM8K-shaped rows of a local file as synth docs (the target is the "#### N" line's N)."""
    from workloads.tasks.scoring import extract_strict

    docs = []
    for r in rows[:n]:
        target = extract_strict(r["answer"])
        if target == "[invalid]":
            raise ValueError(f"answer without a '#### N' line: {r['answer'][-60:]!r}")
        docs.append({"question": r["question"], "answer": r["answer"], "target": target, "op": r.get("op")})
    return docs


@dataclass
class PointResult:
    point: Point
    n: int
    correct: int
    accuracy: float
    ci_low: float
    ci_high: float
    metric: str
    other: dict                     # e.g. {"flexible-extract": {"correct", "accuracy"}}
    elapsed_s: float
    nfe_mean: float
    stats: dict
    samples: list = field(default_factory=list)
    model: str = ""                 # which trained model (seed) of a several-model run, else ""

    def row(self, dense_acc: float | None = None) -> dict:
        p = self.point
        d = {"point": p.name, **({"model": self.model} if self.model else {}), "system": p.system, "role": p.role, "cache": p.cache, "selection": p.selection, "score_query": p.score_query,
             "retention": p.retention, "n": self.n, "correct": self.correct, "accuracy": self.accuracy,
             "ci_low": self.ci_low, "ci_high": self.ci_high, "metric": self.metric,
             "elapsed_s": round(self.elapsed_s, 3), "nfe_mean": self.nfe_mean}
        for k, v in self.other.items():
            d[f"{k}_correct"], d[f"{k}_accuracy"] = v["correct"], v["accuracy"]
        if dense_acc:
            d["relative_to_dense"] = self.accuracy / dense_acc
        for k in ("forwards", "query_tokens", "peak_kv_bytes", "peak_kv_tokens"):
            if k in self.stats:
                d[k] = self.stats[k]
        return d


def _result(point, metric, hits: list[float], other: dict[str, list[float]], backend: PointBackend,
            samples: list[dict]) -> PointResult:
    n = len(hits)
    k = int(round(sum(hits)))
    lo, hi = wilson(k, n)
    stats: dict = {}
    for s in backend.stats:
        for key in ("forwards", "query_tokens"):
            stats[key] = stats.get(key, 0) + int(s.get(key, 0) or 0)
        for key in ("peak_kv_bytes", "peak_kv_tokens"):
            if s.get(key) is not None:
                stats[key] = max(stats.get(key, 0), int(s[key]))
    nfe = [o.nfe for o in backend.outputs]
    return PointResult(point, n, k, k / n if n else 0.0, lo, hi, metric,
                       {f: {"correct": int(round(sum(v))), "accuracy": (sum(v) / n if n else 0.0)} for f, v in other.items()},
                       backend.elapsed_s, (sum(nfe) / len(nfe)) if nfe else 0.0, stats, samples)


def eval_synth_point(backend: PointBackend, docs: list[dict]) -> PointResult:
    """A generated task (synth, synth-cot) or local GSM8K-shaped docs, scored here."""
    from workloads.tasks import generated, scoring

    prompts = [generated.format_prompt(d["question"]) for d in docs]
    texts = backend(prompts, {"max_gen_toks": backend.gen_length})
    samples, strict, flex = [], [], []
    outs = [backend.by_prompt[p] for p in prompts]     # by prompt: synth questions are distinct
    for i, (d, t, o) in enumerate(zip(docs, texts, outs, strict=True)):
        s = scoring.score_gsm8k(t, d["target"])
        strict.append(s["strict-match"])
        flex.append(s["flexible-extract"])
        samples.append({"index": i, "op": d.get("op"), "question": d["question"], "target": d["target"],
                        "completion": t, "strict-match": s["strict-match"],
                        "flexible-extract": s["flexible-extract"], "nfe": o.nfe,
                        "prompt_tokens": len(o.prompt_ids), "token_ids": o.token_ids})
    return _result(backend.point, "strict-match", strict, {"flexible-extract": flex}, backend, samples)


def eval_lm_eval_point(task: str, backend: PointBackend, limit: int | None, metadata: dict | None = None,
                       num_fewshot: int | None = None) -> PointResult:
    """gsm8k / humaneval through lm_eval.simple_evaluate with this point's backend; `metadata`
    reaches the task loaders (e.g. {"gsm8k_path": "local.jsonl"})."""
    from dllm_bench.accuracy.lm_eval_model import run_lm_eval

    name = LM_EVAL_TASK[task]
    res = run_lm_eval(name, backend, limit=limit, log_samples=True, metadata=metadata, num_fewshot=num_fewshot)
    logged = res.get("samples", {}).get(name, [])
    by_doc: dict[int, dict] = {}
    for s in logged:
        row = by_doc.setdefault(int(s["doc_id"]), {"index": int(s["doc_id"])})
        resp = s.get("resps") or [[""]]
        row.setdefault("completion", resp[0][0] if resp and resp[0] else "")
        flt = s.get("filter", "none")
        if task == "humaneval":
            row["task_id"] = s["doc"].get("task_id")
            row["pass@1"] = float(s.get("pass@1", 0.0))
        else:
            row.setdefault("question", s["doc"].get("question"))
            row["target"] = s.get("target")
            row[flt] = float(s.get("exact_match", 0.0))
            row[f"{flt}_extracted"] = (s.get("filtered_resps") or [None])[0]
        ctx = (s.get("arguments") or [[None]])[0][0]
        o = backend.by_prompt.get(ctx)
        if o is not None:
            row["nfe"], row["prompt_tokens"] = o.nfe, len(o.prompt_ids)
    rows = [by_doc[k] for k in sorted(by_doc)]
    if task == "humaneval":
        hits = [r.get("pass@1", 0.0) for r in rows]
        agg = res["results"][name].get("pass@1,none")
        other: dict = {}
    else:
        hits = [r.get("strict-match", 0.0) for r in rows]
        agg = res["results"][name].get("exact_match,strict-match")
        other = {"flexible-extract": [r.get("flexible-extract", 0.0) for r in rows]}
    out = _result(backend.point, PRIMARY_METRIC[task], hits, other, backend, rows)
    if agg is not None and rows and abs(float(agg) - out.accuracy) > 1e-9:
        raise RuntimeError(f"lm-eval aggregate {agg} != per-sample mean {out.accuracy}")
    return out
