"""The held-out protocol of `dllm-bench accuracy`: choices are made on a dev-split run and
reported on a test-split run, whose questions the choice never saw.

The choice made here is the selection scoring rule (`score_query`: the block queries' mean, as
dLLM-Serve's and Sparse-dLLM's code score, or their max): per selection, the rule with the
higher accuracy averaged over the dev run's swept retentions r < 1 and its models, the upstream
`mean` on a tie. Both rules are still measured and reported on test; the choice only says which
one the verdict is read under.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from dllm_bench.systems.spec import ENGINE

UPSTREAM_RULE = "mean"


def dev_choice(points: list[dict]) -> dict[str, dict]:
    """selection -> {"score_query": chosen rule, "dev_mean_accuracy": {rule: mean over r < 1}}
    from a run's point rows (summary.json "points")."""
    acc: dict[str, dict[str, list[float]]] = {}
    for p in points:
        if p.get("system") == ENGINE and p.get("role") == "sparse" and float(p["retention"]) < 1.0:
            acc.setdefault(p["selection"], {}).setdefault(p.get("score_query") or "mean", []).append(p["accuracy"])
    out = {}
    for sel, by_rule in acc.items():
        means = {q: statistics.fmean(v) for q, v in by_rule.items()}
        best = max(means.values())
        rule = UPSTREAM_RULE if means.get(UPSTREAM_RULE) == best else max(means, key=means.get)
        out[sel] = {"score_query": rule, "dev_mean_accuracy": means}
    return out


def load_dev_choice(dev_run: Path, task: str, models: list[str]) -> dict:
    """{"dev_run", "choice"} from a finished dev-split run of the same task and models; ValueError
    (one line) when the run is not such a run."""
    try:
        summ = json.loads((Path(dev_run) / "summary.json").read_text(encoding="utf-8"))
        cfg = json.loads((Path(dev_run) / "config.json").read_text(encoding="utf-8")).get("config", {})
    except (OSError, ValueError):
        raise ValueError(f"--dev-run {dev_run}: not a finished accuracy run (no summary.json)") from None
    if cfg.get("split") != "dev":
        raise ValueError(f"--dev-run {dev_run}: a {cfg.get('split', 'test')}-split run, not a dev one")
    if cfg.get("task") != task or list(cfg.get("models") or [cfg.get("model")]) != list(models):
        raise ValueError(f"--dev-run {dev_run}: task/models {cfg.get('task')}/{cfg.get('models')} differ "
                         f"from this run's {task}/{models}")
    choice = dev_choice(summ.get("points", []))
    if not choice:
        raise ValueError(f"--dev-run {dev_run}: has no sparse engine points to choose from")
    return {"dev_run": Path(dev_run).name, "choice": choice}
