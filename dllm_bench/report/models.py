"""The current-results table of docs/MODELS.md: the dLLM-Serve mechanisms per model family, side by
side (one column per family), one group of rows per machine (measured runs on this machine, then
each simulated hardware profile with its validation). Per group: the engine's KV pool without and
with the logit budget (the ladder's phase-scheduler and logit-budget rungs), the engine against
the best baseline, and the ladder's rungs against Sparse-dLLM. Every ratio is paired per workload
seed (repeat) and shown as the median [min–max] of those ratios, at the runs' one shared dataset
(livebench when they all have it) and each run's heaviest load. Reads `serve`, `ablate` and
`simulate` runs (config.json and each point's summary.json); how to read it: docs/MODELS.md.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.ablate.ladder import ladder
from dllm_bench.console import md_table
from dllm_bench.errors import UserError
from dllm_bench.repeats import Spread
from dllm_bench.report.scheduler import scheduler_line
from dllm_bench.report.sections import _repeats, ablate_line
from dllm_bench.simulate.hardware import validation_label
from dllm_bench.systems.spec import ENGINE, parse_system
from engine.models import FAMILIES, family_of

KINDS = ("serve", "ablate", "simulate")
THROUGHPUT = "output_throughput"
PREFERRED_DATASET = "livebench"
# A run recorded before the families were named (no model_type in its config) served LLaDA.
LEGACY_MODEL_TYPE = "llada"
RUNGS = ("engine", "scheduler", "logits")          # the ladder's rungs above its baseline


class _Run:
    """One run as the table reads it: its family, machine, model and finished points."""

    def __init__(self, run_dir: Path):
        doc = results.load_config(run_dir)
        self.dir, self.doc, self.kind = run_dir, doc, doc.get("kind")
        if self.kind not in KINDS:
            raise ValueError(f"{run_dir.name}: a {self.kind!r} run (the models table reads {', '.join(KINDS)})")
        cfg = self.cfg = doc.get("config") or {}
        self.model_type = (cfg.get("model") or {}).get("model_type") or LEGACY_MODEL_TYPE
        self.model = Path(str((cfg.get("preset") or {}).get("model") or "?")).name
        self.simulated = self.kind == "simulate"
        hw = cfg.get("hardware") if self.simulated else None
        if self.simulated:
            self.machine = (float(hw.get("memory_bytes") or 0), hw.get("name", "?"))
            self.machine_label = (f"{hw.get('name', '?')}, **simulated** "
                                  f"({validation_label(hw.get('kind', ''), hw.get('name', '?'), hw.get('validation'), short=True)})")
        else:
            device = (doc.get("environment") or {}).get("cuda_device") or "CPU"
            self.machine = (-1.0, device)
            self.machine_label = f"{device}, measured"
        self.points = [p for p in results.load_points(run_dir)
                       if bool(p.get("simulated")) == self.simulated and not p.get("interrupted")]

    def datasets(self) -> set[str]:
        return {p.get("dataset", "") for p in self.points}

    def by_seed(self, dataset: str) -> dict[str, dict[int, Mapping]]:
        """system label -> workload seed -> its point, at the dataset's heaviest load."""
        pts = [p for p in self.points if p.get("dataset", "") == dataset]
        if not pts:
            return {}
        top = max(p["rps"] for p in pts)
        out: dict[str, dict[int, Mapping]] = {}
        for p in pts:
            if p["rps"] == top:
                out.setdefault(p["system"], {})[int(p.get("workload_seed", p.get("repeat", 0)) or 0)] = p
        return out

    def rungs(self) -> dict[str, str] | None:
        """Ladder key -> system label: an ablate run's own ladder, or a simulate run's systems that are
        the ladder at its logit budget (None when the run has no such ladder)."""
        if self.kind == "ablate":
            return {r["key"]: r.get("label") or parse_system(r["spec"]).label for r in self.cfg.get("ladder") or []}
        if self.kind != "simulate":
            return None
        n = (self.cfg.get("engine_defaults") or {}).get("max_num_logits")
        try:
            want = {r.key: parse_system(r.spec).label for r in ladder(n)}
        except UserError:                      # monolithic run: no logit-budget rung
            return None
        labels = {s.get("label") for s in self.cfg.get("systems") or []}
        return want if set(want.values()) <= labels else None


def paired(a: Mapping[int, Mapping], b: Mapping[int, Mapping]) -> Spread:
    """a / b throughput over the workload seeds both ran (a seed's ratio pairs its two points)."""
    ratios = [float(a[s][THROUGHPUT]) / float(b[s][THROUGHPUT]) for s in sorted(set(a) & set(b))
              if (a[s].get(THROUGHPUT) or 0) > 0 and (b[s].get(THROUGHPUT) or 0) > 0]
    return Spread.of(ratios)


def _median(points: Mapping[int, Mapping], key: str) -> float | None:
    s = Spread.of([p.get(key) for p in points.values() if isinstance(p.get(key), (int, float))])
    return s.median if s.n else None


def _x(s: Spread) -> str:
    if not s.n:
        return "–"
    return f"{s.median:.2f}×" + (f" [{s.lo:.2f}–{s.hi:.2f}]" if s.n > 1 and s.lo != s.hi else "")


def _seeds(s: Spread) -> str:
    return f"{s.n} seed{'' if s.n == 1 else 's'}"


def best_baseline(systems: Mapping[str, Mapping[int, Mapping]]) -> str | None:
    """The baseline with the highest median throughput (never the engine, nor an endpoint)."""
    base = {k: v for k, v in systems.items()
            if all(p.get("is_baseline") and p.get("system_name") != "endpoint" for p in v.values())}
    tps = {k: _median(v, THROUGHPUT) for k, v in base.items()}
    tps = {k: t for k, t in tps.items() if t is not None}
    return max(tps, key=tps.get) if tps else None


def versus_best(run: _Run, dataset: str) -> tuple[str, Spread | None]:
    """The engine's cell against the best baseline, and its paired ratios."""
    systems = run.by_seed(dataset)
    best = best_baseline(systems)
    if ENGINE not in systems or best is None:
        return "–", None
    s = paired(systems[ENGINE], systems[best])
    return (f"**{_x(s)}** vs {best} ({_seeds(s)})" if s.n else "–"), s


def kv_cell(run: _Run, dataset: str) -> str:
    """KV pool tokens of the monolithic phase rung → the logit-budget rung (its rows), and the ratio."""
    rungs, systems = run.rungs(), run.by_seed(dataset)
    if not rungs or rungs.get("scheduler") not in systems or rungs.get("logits") not in systems:
        return "–"
    mono, budg = (_median(systems[rungs[k]], "kv_pool_tokens") for k in ("scheduler", "logits"))
    if mono is None or budg is None:
        return "–"
    rows = next(iter(systems[rungs["logits"]].values())).get("knobs", {}).get("max_num_logits")
    ratio = f"{budg / mono:.2f}×" if mono else "∞"
    return f"{mono:,.0f} → {budg:,.0f} ({ratio}" + (f", {rows:,} rows)" if isinstance(rows, int) else ")")


def ladder_cells(run: _Run, dataset: str) -> dict[str, str]:
    """Each rung above the baseline: its throughput / the baseline rung's, paired per seed."""
    rungs, systems = run.rungs(), run.by_seed(dataset)
    if not rungs or rungs.get("baseline") not in systems:
        return {}
    base = systems[rungs["baseline"]]
    return {k: _x(paired(systems[rungs[k]], base)) for k in RUNGS if rungs.get(k) in systems}


RUNG_TITLES = {"engine": "+ inference engine", "scheduler": "+ phase-multiplexed scheduler",
               "logits": "+ logit-aware budgeting"}
MEASURES = ("KV pool tokens: monolithic → logit budget", "engine / best baseline tok/s",
            *(f"ladder {RUNG_TITLES[k]} (× Sparse-dLLM)" for k in RUNGS))


def shared_dataset(runs: list[_Run]) -> str:
    common = set.intersection(*(r.datasets() for r in runs)) if runs else set()
    if not common:
        raise ValueError("the runs share no dataset with finished points")
    return PREFERRED_DATASET if PREFERRED_DATASET in common else sorted(common)[0]


def _one(runs: list[_Run], what: str) -> _Run | None:
    if len(runs) > 1:
        raise ValueError(f"{what}: {len(runs)} runs ({', '.join(r.dir.name for r in runs)}); keep one")
    return runs[0] if runs else None


def table(run_dirs: list[Path]) -> str:
    """The table (see the module's docstring), its legend and the generated verdict line."""
    runs = [_Run(d) for d in run_dirs]
    dataset = shared_dataset(runs)
    present = {r.model_type for r in runs}           # LLaDA's column first, then the registry's order
    order = [t for t in dict.fromkeys((LEGACY_MODEL_TYPE, *FAMILIES)) if t in present]
    order += sorted(present - set(order))
    cols = {t: family_of(t).name if t in FAMILIES else t for t in order}
    rows, above, below = [], [], []
    for machine in sorted({r.machine for r in runs}):
        here = [r for r in runs if r.machine == machine]
        cells: dict[str, list[str]] = {m: [] for m in MEASURES}
        models = []
        for t in order:
            fam = [r for r in here if r.model_type == t]
            label = f"{cols[t]} on {machine[1]}"
            serving = _one([r for r in fam if r.kind in ("serve", "simulate")], f"{label}, engine vs baselines")
            laddered = _one([r for r in fam if r.rungs()], f"{label}, the ladder")
            models.append(" + ".join(dict.fromkeys(r.model for r in fam)) or "–")
            cells[MEASURES[0]].append(kv_cell(laddered, dataset) if laddered else "–")
            text, s = versus_best(serving, dataset) if serving else ("–", None)
            cells[MEASURES[1]].append(text)
            if s is not None and s.n:
                (above if s.lo >= 1.0 else below).append(label)
            lc = ladder_cells(laddered, dataset) if laddered else {}
            for k, m in zip(RUNGS, MEASURES[2:], strict=True):
                cells[m].append(lc.get(k, "–"))
        head = f"{here[0].machine_label}: {' · '.join(models)}"
        for i, m in enumerate(MEASURES):
            rows.append({"machine": head if i == 0 else "", "measure": m,
                         **{cols[t]: cells[m][j] for j, t in enumerate(order)}})
    text = md_table(pd.DataFrame(rows), as_text=True)
    legend = (f"\nDataset {dataset} at each run's heaviest load; each ratio is the median [min–max] over the "
              "workload seeds of that seed's pair of points. Engine at or above the best baseline in every seed: "
              f"{', '.join(above) or 'none'}; below it in some seed: {', '.join(below) or 'none'}.\n")
    return text + legend


def run_line(doc: dict) -> str:
    """What one run measured or simulated, in a line."""
    cfg = doc.get("config") or {}
    if doc.get("kind") == "simulate":
        return scheduler_line(doc)
    if doc.get("kind") == "ablate":
        return "measured; " + ablate_line(cfg).rstrip(".")
    return (f"measured; {cfg.get('preset_line', '')}; {', '.join(s['label'] for s in cfg.get('systems') or [])}; "
            f"{cfg.get('num_prompts', '?')} requests per point{_repeats(cfg)}")
