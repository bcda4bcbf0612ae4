"""Accuracy under KV retention (the paper's Fig. 6): head-centric vs uniform selection — the
points of a run and their results.

One *point* = one serving configuration: the dense reference (the engine with cache=none: exact
mode), the engine's sparse cache at (selection, retention), or a baseline system. A point
runs through its backend (dllm_bench.accuracy.backend.PointBackend) and is scored by
dllm_bench.accuracy.evaluate; decoding is greedy (temperature 0), float32 by default.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dllm_bench.systems.spec import ENGINE, baseline_registry
from engine.decoding import FIXED
from workloads.tasks import generated
from workloads.tasks.scoring import extract_strict

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
        if s == ENGINE:
            if include_r1:
                pts.append(Point("sparse-r1.0", "engine", "sparse", "sparse", "head", 1.0))
            for q in score_queries:
                for sel in selections:
                    name = sel if q == "mean" else f"{sel}-{q}"
                    for r in retentions:
                        if r < 1.0 or not include_r1:
                            pts.append(Point(f"{name}-r{r:g}", "engine", "sparse", "sparse", sel, float(r), q))
        elif baseline_registry()[s].retention_knob:   # a baseline with KV retention sweeps it too
            for r in retentions:
                pts.append(Point(f"{s}-r{r:g}", s, "baseline", None, "uniform", float(r)))
        else:
            pts.append(Point(s, s, "baseline"))
    return pts


# ------------------------------------------------------------------------------------ tasks
def model_training_info(path: Path) -> dict:
    """The checkpoint's training.json (written by dllm-bench train), or {}."""
    try:
        return json.loads((Path(path) / "training.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def generated_docs(task: str, split: str, n: int, seed: int, context_facts: int, knobs: dict) -> list[dict]:
    """The first `n` questions of a generated task's dev or test split (seed `seed`)."""

    if split == "train":
        raise ValueError("accuracy is measured on the dev or test split, never on train")
    return generated.examples(task, split, n, seed=seed, context_facts=context_facts, **knobs)


def local_synth_docs(rows: list[dict], n: int) -> list[dict]:
    """GSM8K-shaped rows of a local file as synth docs (the target is the "#### N" line's N)."""
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
    decoding: str = FIXED         # what the point's system decoded with (dllm_bench.systems.decoding)
    decoding_note: str | None = None  # why it is not the policy asked for
    decoding_stats: dict = field(default_factory=dict)   # per-request TPF mean/p50/p90, forwards per block
    tensor_parallel_size: int | None = None   # a tensor-parallel run's: the point's ranks (a baseline's 1)

    def row(self, dense_acc: float | None = None) -> dict:
        p = self.point
        d = {"point": p.name, **({"model": self.model} if self.model else {}), "system": p.system, "role": p.role, "cache": p.cache, "selection": p.selection, "score_query": p.score_query,
             "retention": p.retention, "n": self.n, "correct": self.correct, "accuracy": self.accuracy,
             "ci_low": self.ci_low, "ci_high": self.ci_high, "metric": self.metric,
             "elapsed_s": round(self.elapsed_s, 3), "nfe_mean": self.nfe_mean, "decoding": self.decoding,
             **({"decoding_note": self.decoding_note} if self.decoding_note else {}), **self.decoding_stats,
             **({"tensor_parallel_size": self.tensor_parallel_size} if self.tensor_parallel_size else {})}
        for k, v in self.other.items():
            d[f"{k}_correct"], d[f"{k}_accuracy"] = v["correct"], v["accuracy"]
        if dense_acc:
            d["relative_to_dense"] = self.accuracy / dense_acc
        for k in ("forwards", "query_tokens", "peak_kv_bytes", "peak_kv_tokens"):
            if k in self.stats:
                d[k] = self.stats[k]
        return d


