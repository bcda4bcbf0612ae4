"""A frontier run's measurements -> its files and rows.

Per configuration, model and repeat: `points/<config>/<model>/summary.json` (the accuracy point's
row and serve's metrics of its requests, per repeat) and `samples.jsonl` (repeat 0), and
`points/<config>/requests.jsonl` (every request of every model and repeat: NFE, TPF, steps per
block, times; a steps-per-block distribution `simulate --steps-per-block` replays).

Per configuration, one row: accuracy pooled over the models (repeat 0; greedy decoding gives
the same tokens in every repeat, checked: `accuracy_stable`) with its Wilson interval and each
model's accuracy; output tok/s per repeat = all models' output tokens over their summed
makespans, as median and min–max over repeats; TPF, NFE and forwards per block over every
request of repeat 0.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dllm_bench.accuracy import seeds
from dllm_bench.frontier.configs import Config
from dllm_bench.frontier.measure import Measured
from dllm_bench.metrics.serving import summarize
from dllm_bench.repeats import Spread
from dllm_bench.results import atomic_write_json, atomic_write_jsonl

# serve's metrics a row keeps (over every request of repeat 0, all models)
SERVING_KEYS = ("mean_tpf", "p50_tpf", "p90_tpf", "mean_nfe", "mean_steps_per_block", "tokens_per_forward",
                "mean_ttft_ms", "mean_itl_ms", "mean_e2el_ms")

Measurements = dict[tuple[str, str, int], Measured]     # (config slug, model, repeat) -> its measurement


def write_point(run_dir: Path, cfg: Config, model: str, meas: Measurements, repeats: int) -> None:
    """The files of one configuration on one model (rewritten as its repeats finish)."""
    mine = {r: meas[(cfg.slug, model, r)] for r in range(repeats) if (cfg.slug, model, r) in meas}
    d = run_dir / "points" / cfg.slug / Path(model).name
    first = mine[min(mine)]
    atomic_write_json(d / "summary.json", {
        "configuration": cfg.label, "system": cfg.variant.label, "decoding": str(cfg.decoding), "model": model,
        **first.result.row(), "repeats": [{"repeat": r, "accuracy": m.result.accuracy, "wall_s": m.wall_s, **m.serving}
                                          for r, m in sorted(mine.items())]})
    atomic_write_jsonl(d / "samples.jsonl", first.result.samples)
    recs = [{"model": mdl, "repeat": r, "configuration": cfg.label, "decoding": str(cfg.decoding),
             **{k: v for k, v in rec.items() if k != "token_ids"}}
            for (slug, mdl, r), m in sorted(meas.items()) if slug == cfg.slug for rec in m.records]
    atomic_write_jsonl(run_dir / "points" / cfg.slug / "requests.jsonl", recs)


def row(cfg: Config, models: Sequence[str], meas: Measurements, repeats: int) -> dict:
    """One configuration over its models and repeats (see the module docstring)."""
    first = [meas[(cfg.slug, m, 0)] for m in models]
    results = []
    for m, x in zip(models, first, strict=True):
        x.result.model = Path(m).name
        results.append(x.result)
    pooled = seeds.pooled(results)[0]
    spread = seeds.spreads(results)[cfg.label]
    per_repeat = []
    for r in range(repeats):
        ms = [meas[(cfg.slug, m, r)] for m in models]
        per_repeat.append(summarize({"records": [rec for x in ms for rec in x.records],
                                     "duration": sum(x.serving["duration_s"] for x in ms), "rejected": []}))
    tps = Spread.of(s["output_throughput"] for s in per_repeat)
    stable = all(meas[(cfg.slug, m, r)].result.correct == meas[(cfg.slug, m, 0)].result.correct
                 for m in models for r in range(repeats))
    return {"label": cfg.label, "system": cfg.variant.label, "system_name": cfg.system, "decoding": str(cfg.decoding),
            "accuracy": pooled.accuracy, "ci_low": pooled.ci_low, "ci_high": pooled.ci_high,
            "correct": pooled.correct, "n": pooled.n, "metric": pooled.metric,
            "per_seed": dict(zip(spread.models, spread.accuracies, strict=True)), "seed_sd": spread.sd,
            "accuracy_stable": stable, "tps": tps.median, "tps_min": tps.lo, "tps_max": tps.hi, "repeats": tps.n,
            "tps_per_repeat": [s["output_throughput"] for s in per_repeat],
            **{k: per_repeat[0].get(k) for k in SERVING_KEYS}}


def csv_rows(rows: Sequence[Mapping]) -> list[dict]:
    """Rows flat enough for metrics.csv (per-seed accuracies as columns)."""
    out = []
    for r in rows:
        flat = {k: v for k, v in r.items() if k not in ("per_seed", "tps_per_repeat")}
        flat.update({f"accuracy_{m}": a for m, a in (r.get("per_seed") or {}).items()})
        out.append(flat)
    return out
