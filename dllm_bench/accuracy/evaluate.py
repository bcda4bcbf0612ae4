"""Scoring one accuracy point: synth through workloads.tasks.scoring (lm-eval-exact GSM8K
extraction; strict-match primary, flexible-extract too), gsm8k and humaneval through
`lm_eval.simple_evaluate` (dllm_bench.accuracy.lm_eval_model.run_lm_eval) with the point's
backend. Each accuracy carries a Wilson 95% interval (dllm_bench.accuracy.points.wilson).
"""
from __future__ import annotations

import numpy as np

from dllm_bench.accuracy.backend import PointBackend
from dllm_bench.accuracy.points import LM_EVAL_TASK, PRIMARY_METRIC, PointResult, wilson
from dllm_bench.metrics.serving import TPF_PERCENTILES
from workloads.tasks import scoring, synth


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
    decoded = backend.decoded
    return PointResult(point, n, k, k / n if n else 0.0, lo, hi, metric,
                       {f: {"correct": int(round(sum(v))), "accuracy": (sum(v) / n if n else 0.0)} for f, v in other.items()},
                       backend.elapsed_s, (sum(nfe) / len(nfe)) if nfe else 0.0, stats, samples,
                       decoding=str(decoded.decoding), decoding_note=decoded.note,
                       decoding_stats=decoding_stats(backend.outputs))


def decoding_stats(outputs) -> dict:
    """Per-request tokens per forward (mean, p50, p90) and forwards per block (mean) of a
    point's requests."""
    tpf = np.array([o.tokens_per_forward for o in outputs if o.nfe], dtype=float)
    spb = np.array([s for o in outputs for s in o.steps_per_block], dtype=float)
    out = {"tpf_mean": float(tpf.mean()) if tpf.size else None}
    out.update({f"tpf_p{p}": float(np.percentile(tpf, p)) if tpf.size else None for p in TPF_PERCENTILES})
    out["steps_per_block_mean"] = float(spb.mean()) if spb.size else None
    return out


def per_request(o) -> dict:
    """What a sample records of its request: forwards (NFE), TPF, forwards per block."""
    return {"nfe": o.nfe, "tpf": o.tokens_per_forward, "steps_per_block": list(o.steps_per_block)}


def eval_synth_point(backend: PointBackend, docs: list[dict]) -> PointResult:
    """A generated task (synth, synth-cot: the same prompt template) or local GSM8K-shaped docs."""
    prompts = [synth.format_prompt(d["question"]) for d in docs]
    texts = backend(prompts, {"max_gen_toks": backend.gen_length})
    samples, strict, flex = [], [], []
    outs = [backend.by_prompt[p] for p in prompts]     # by prompt: synth questions are distinct
    for i, (d, t, o) in enumerate(zip(docs, texts, outs, strict=True)):
        s = scoring.score_gsm8k(t, d["target"])
        strict.append(s["strict-match"])
        flex.append(s["flexible-extract"])
        samples.append({"index": i, "op": d.get("op"), "question": d["question"], "target": d["target"],
                        "completion": t, "strict-match": s["strict-match"],
                        "flexible-extract": s["flexible-extract"], **per_request(o),
                        "prompt_tokens": len(o.prompt_ids), "token_ids": o.token_ids})
    return _result(backend.point, "strict-match", strict, {"flexible-extract": flex}, backend, samples)


def eval_lm_eval_point(task: str, backend: PointBackend, limit: int | None, metadata: dict | None = None,
                       num_fewshot: int | None = None) -> PointResult:
    """gsm8k / humaneval through lm_eval.simple_evaluate with this point's backend; `metadata`
    reaches the task loaders (e.g. {"gsm8k_path": "local.jsonl"})."""
    # lm-eval costs seconds to import and is only needed for its tasks (not for synth)
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
            row.update(per_request(o), prompt_tokens=len(o.prompt_ids))
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
