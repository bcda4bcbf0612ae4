"""docs/MODELS.md's current-results table (dllm_bench.report.models) from fixture runs with known
figures, through a `models` block over a comma list of runs: LLaDA and Dream side by side, the
measured rows from serve and ablate runs, the simulated ones from simulate runs with their
profile's validation; every ratio paired per workload seed. Also the block's path rules and the
Makefile's simulated runs carrying the ladder the table reads. No model runs."""
from __future__ import annotations

import math
import re
from pathlib import Path

from dllm_bench import results
from dllm_bench.ablate.ladder import ladder
from dllm_bench.report import current
from dllm_bench.report import models as mt
from dllm_bench.systems.spec import parse_systems
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parent.parent
LLADA, DREAM = {"model_type": "llada"}, {"model_type": "Dream"}
RUNGS = {r.key: r for r in ladder(256)}


def _labels(n: int) -> dict[str, str]:
    return {r.key: parse_systems(r.spec)[0].label for r in ladder(n)}


def _run(root: Path, kind: str, run_id: str, model: dict | None, preset_model: str, cfg: dict,
         points: dict[str, list[float]], extra: dict | None = None, kv: dict | None = None,
         simulated: bool = False, dataset: str = "livebench") -> Path:
    """A run whose system `s` has, per workload seed i, throughput points[s][i]; `kv`: its KV pool."""
    cfg = {"preset": {"name": preset_model, "model": preset_model}, "num_prompts": 8, "datasets": [dataset],
           "repeats": max(len(v) for v in points.values()), **({"model": model} if model else {}), **cfg}
    d = results.create_run(kind, cfg, run_id=run_id, root=root)
    doc = results.load_config(d)                 # measured on a CPU, whatever machine runs the test
    results.atomic_write_json(d / "config.json", {**doc, "environment": {**doc["environment"], "cuda_device": None}})
    for system, tps in points.items():
        name = system.partition(":")[0]
        for seed, tp in enumerate(tps):
            s = {"system_name": name, "is_baseline": name != "engine", "workload_seed": seed,
                 "output_throughput": tp, "kv_pool_tokens": (kv or {}).get(system),
                 "knobs": {"max_num_logits": parse_systems(system)[0].knob_dict.get("max_num_logits")},
                 **({"simulated": True} if simulated else {}), **(extra or {}).get(system, {})}
            results.write_point(d, results.PointKey(system, math.inf, dataset, seed), s, [])
    return d


def _serve(root: Path, run_id: str, model: dict | None, preset: str, points: dict) -> Path:
    cfg = {"preset_line": f"preset {preset}", "systems": [{"label": s} for s in points]}
    return _run(root, "serve", run_id, model, preset, cfg, points)


def _ablate(root: Path, run_id: str, model: dict | None, preset: str, tps: list[list[float]], kv: tuple) -> Path:
    lab = {k: r.spec if k == "baseline" else _labels(256)[k] for k, r in RUNGS.items()}
    cfg = {"preset_line": f"preset {preset}", "measurement": "saturation",
           "ladder": [{"key": k, "title": r.title, "spec": r.spec, "label": lab[k]} for k, r in RUNGS.items()]}
    return _run(root, "ablate", run_id, model, preset, cfg, dict(zip(lab.values(), tps, strict=True)),
                kv={lab["scheduler"]: kv[0], lab["logits"]: kv[1]})


def _simulate(root: Path, run_id: str, model: dict, shape: str, hw: dict, points: dict, kv: tuple) -> Path:
    lab = _labels(2048)
    pts = {k: v for k, v in points.items() if k != "ladder"}
    pts.update({lab[k]: v for k, v in points.get("ladder", {}).items()})
    cfg = {"hardware": hw, "validation_label": "x", "engine_defaults": {"max_num_logits": 2048,
                                                                        "max_num_batched_tokens": 4000},
           "rps": [math.inf], "systems": [{"label": s} for s in pts], "preset": {"name": "paper", "model": shape}}
    return _run(root, "simulate", run_id, model, shape, cfg, pts, kv={lab["scheduler"]: kv[0], lab["logits"]: kv[1]},
                simulated=True)


H100 = {"name": "h100", "kind": "gpu", "memory_bytes": 80e9,
        "validation": {"within": 0.043, "device": "NVIDIA H100", "date": "2026-11-26", "leave_one_out": 0.11}}
L40S = {"name": "l40s", "kind": "gpu", "memory_bytes": 48e9}


def _fixtures(runs: Path) -> None:
    # Paired per seed: the engine over fast-dllm is 2.0, 0.8, 2.0 (median 2.00 [0.80–2.00]); the
    # medians' ratio would be 20/15 and the intervals' extremes 0.40–6.00.
    _serve(runs, "serve-llada", None, "similar-1024",        # recorded before model_type: LLaDA
           {"engine": [10.0, 20.0, 30.0], "fast-dllm": [5.0, 25.0, 15.0], "dllm-cache": [12.0, 12.0, 12.0]})
    # A projected (simulated) point in a measured run never enters its cells.
    results.write_point(runs / "serve-llada", results.PointKey("engine", math.inf, "livebench", 5),
                        {"system_name": "engine", "workload_seed": 0, "output_throughput": 1e6, "simulated": True},
                        [])
    _serve(runs, "serve-dream", DREAM, "similar-dream",
           {"engine": [11.0, 13.0], "sparse-dllm": [10.0, 10.0], "fast-dllm": [4.0, 4.0]})
    _ablate(runs, "ablate-llada", LLADA, "similar-1024",
            [[4.0, 2.0], [6.0, 2.0], [8.0, 3.0], [8.0, 5.0]], (1000, 1500))
    _ablate(runs, "ablate-dream", DREAM, "similar-dream", [[2.0], [3.0], [3.0], [4.0]], (9000, 9000))
    _simulate(runs, "models-h100-dream-7b", DREAM, "/cache/shapes/dream-7b", H100,
              {"engine": [300.0], "fast-dllm": [100.0], "sparse-dllm": [150.0],
               "ladder": {"baseline": [150.0], "engine": [200.0], "scheduler": [210.0], "logits": [330.0]}},
              (20000, 50000))
    # No ladder in this one: its ladder rows and KV pool are blank, the serving row is there.
    _simulate(runs, "models-l40s-llada-8b", LLADA, "/cache/shapes/llada-8b", L40S,
              {"engine": [90.0], "fast-dllm": [100.0]}, (1, 1))


def _doc(root: Path, src: str, pending: bool = False) -> Path:
    doc = root / "docs" / "MODELS.md"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(f"# M\n\n{current.OPEN} models {src}{current.PENDING if pending else ''} -->\nhand\n"
                   f"{current.CLOSE}\n")
    return doc


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in r.split("|")[1:-1]] for r in text.splitlines() if r.startswith("| ")]


SRC = "results/current/serve-llada,serve-dream,ablate-*,models-*"


def test_models_table_sets_the_families_side_by_side_per_machine(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "results" / "current"
    _fixtures(runs)
    doc = _doc(tmp_path, SRC)
    r = run_cli(monkeypatch, capsys, "report", "--docs", str(doc))
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert "hand" not in text and text.count("\n* `dllm-bench ") == 6
    head, *rows = _rows(text)
    assert head == ["machine", "measure", "LLaDA", "Dream"]
    # Measured first, then each simulated profile by memory; every group's first row names it.
    machines = [r[0] for r in rows if r[0]]
    assert machines == ["CPU, measured: similar-1024 · similar-dream",
                        "l40s, **simulated** (not validated on real hardware): llada-8b · –",
                        "h100, **simulated** (validated on NVIDIA H100, 2026-11-26 within 4%): – · dream-7b"]
    cpu, l40s, h100 = rows[:5], rows[5:10], rows[10:]
    assert [r[1] for r in cpu] == list(mt.MEASURES)
    assert cpu[0][2:] == ["1,000 → 1,500 (1.50×, 256 rows)", "9,000 → 9,000 (1.00×, 256 rows)"]
    assert cpu[1][2:] == ["**2.00× [0.80–2.00]** vs fast-dllm (3 seeds)", "**1.20× [1.10–1.30]** vs sparse-dllm (2 seeds)"]
    # The ladder over its baseline rung, per seed: LLaDA's rungs 6/4, 2/2 -> 1.25 [1.00–1.50] ...
    assert [r[2] for r in cpu[2:]] == ["1.25× [1.00–1.50]", "1.75× [1.50–2.00]", "2.25× [2.00–2.50]"]
    assert [r[3] for r in cpu[2:]] == ["1.50×", "1.50×", "2.00×"]
    assert l40s[1][2:] == ["**0.90×** vs fast-dllm (1 seed)", "–"]
    assert all(r[2] == r[3] == "–" for r in l40s[2:]) and l40s[0][2] == "–"
    assert h100[0][3] == "20,000 → 50,000 (2.50×, 2,048 rows)" and h100[1][3] == "**2.00×** vs sparse-dllm (1 seed)"
    assert [r[3] for r in h100[2:]] == ["1.33×", "1.40×", "2.20×"]
    line = next(x for x in text.splitlines() if x.startswith("Dataset livebench"))
    assert line.endswith("every seed: Dream on CPU, Dream on h100; below it in some seed: LLaDA on CPU, LLaDA on l40s.")
    # A changed seed changes its pair: the doc is stale.
    summ = runs / "serve-llada" / "points" / "livebench__fast-dllm__rpsinf__r1" / "summary.json"
    s = results.read_json(summ)
    results.atomic_write_json(summ, {**s, "output_throughput": 20.0})
    assert run_cli(monkeypatch, capsys, "report", "--docs", str(doc), "--check").returncode == 1
    assert run_cli(monkeypatch, capsys, "report", "--docs", str(doc)).returncode == 0
    text = doc.read_text()
    assert "**2.00× [1.00–2.00]** vs fast-dllm (3 seeds)" in text and "0.80" not in text


def test_a_comma_list_waits_for_every_run_and_refuses_what_it_cannot_read(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "results" / "current"
    _fixtures(runs)
    doc = _doc(tmp_path, SRC + ",serve-later", pending=True)
    r = run_cli(monkeypatch, capsys, "report", "--docs", str(doc))
    assert r.returncode == 0 and "pending" in r.stderr and "hand" in doc.read_text()   # waits for serve-later
    both = [runs / "serve-dream", runs / "serve-llada"]
    assert current.sources(tmp_path, "results/current/serve-llada,serve-dream") == both
    assert current.sources(tmp_path, "results/current/serve-*") == both
    assert current.sources(tmp_path, "results/current/serve-llada,") == []
    _serve(runs, "serve-later", DREAM, "similar-dream", {"engine": [1.0], "fast-dllm": [1.0]})
    results.create_run("memory", {}, run_id="memory-x", root=runs)
    cases = [(SRC + ",serve-later", "2 runs (serve-dream, serve-later); keep one"),
             (SRC + ",memory-x", "reads serve or ablate or simulate runs, found ['ablate', 'memory'"),
             ("results/current/serve-llada,nothing-*", "reads serve or ablate or simulate runs, found none")]
    for src, msg in cases:
        doc = _doc(tmp_path, src)
        r = run_cli(monkeypatch, capsys, "report", "--docs", str(doc))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], (src, r)
        assert "hand" in doc.read_text()
    # Runs that share no dataset: one error line too.
    _run(runs, "serve", "serve-osc", DREAM, "similar-dream", {}, {"engine": [1.0], "fast-dllm": [1.0]}, dataset="osc")
    r = run_cli(monkeypatch, capsys, "report", "--docs", str(_doc(tmp_path, "results/current/serve-llada,serve-osc")))
    assert r.returncode == 2 and "share no dataset" in r.stderr


def test_the_makefile_makes_every_run_the_models_block_reads():
    make = (REPO / "Makefile").read_text()
    systems = re.search(r"^MODELS_SYSTEMS := (.+)$", make, re.M)[1]
    labels = {v.label for v in parse_systems(systems.replace("$(comma)", ","))}
    # The simulated runs carry the ladder at their logit budget, the engine and the baselines.
    sim = re.search(r"^MODELS_SIM = ((?:.*\\\n)*.*)$", make, re.M)[1]
    budget = int(re.search(r"--max-num-logits (\d+)", sim)[1])
    assert set(_labels(budget).values()) <= labels and {"engine", "fast-dllm", "dllm-cache", "sparse-dllm"} <= labels
    block = next(m for m in current.BLOCK.finditer((REPO / "docs" / "MODELS.md").read_text()) if m["table"] == "models")
    folder, _, names = block["src"].rpartition("/")
    made = set(re.findall(r"\$\(call keep,([a-z0-9-]+),", make))
    sims = {f"models-{hw}-{m}" for hw in ("rtx4090", "l40s", "h100") for m in ("llada-8b", "dream-7b")}
    assert folder == "results/current" and sims <= made
    for name in names.split(","):
        assert any(re.fullmatch(name.replace("*", ".*"), run) for run in made), name
