"""Steps `profile` and `profile-baselines`: `dllm-bench profile-step --json` of the engine in
Reuse-only steps (the ones CUDA graphs replay) at each of the scale's batches with graphs on and
off; of each baseline at its largest static batch (serve-full's max-fit B; the saturation request
count if serve-full did not run). Each document is kept under
profile/; an invocation that fails is recorded and the others still run, and one that no longer
fits the time budget is left out. A build without `profile-step` fails the step in one line."""
from __future__ import annotations

import json
import re

from dllm_bench.benchgpu.derive import profile_figures
from dllm_bench.benchgpu.record import FAILED, NOT_RUN, OK, Bench, StepRecord
from dllm_bench.benchgpu.scale import BASELINES, ENGINE
from dllm_bench.benchgpu.subcommand import run_cli
from dllm_bench.results import atomic_write_json

COMMAND = "profile-step"


Entry = tuple[str, bool | None, int, str]


def engine_entries(bench: Bench) -> list[Entry]:
    """(system, CUDA graphs or None for a baseline, batch, where the batch comes from): the
    engine at each of the scale's batches, graphs on and off (step `profile`, the goals')."""
    return [(ENGINE, graphs, b, "scale") for b in bench.scale.profile_batches for graphs in (True, False)]


def baseline_entries(bench: Bench) -> list[Entry]:
    """Each baseline at serve-full's max-fit batch (step `profile-baselines`: no goal reads it,
    so it runs only when named, outside the default run's 10 minutes)."""
    fits = {p["system"]: p.get("max_batch_size") for p in bench.data("serve-full").get("points", [])}
    return [(name, None, int(fits[name]), "serve-full max-fit") if fits.get(name) else
            (name, None, bench.scale.full_prompts, "no serve-full max-fit: the saturation request count")
            for name in BASELINES if name in bench.small_systems]


def estimate(bench: Bench) -> float:
    return len(engine_entries(bench)) * bench.costs.profile_s


def estimate_baselines(bench: Bench) -> float:
    return len(baseline_entries(bench)) * bench.costs.profile_s


def label(system: str, graphs: bool | None, batch: int) -> str:
    mode = "" if graphs is None else ("-graphs" if graphs else "-eager")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{system}{mode}-b{batch}")


def _args(bench: Bench, system: str, graphs: bool | None, batch: int) -> list[str]:
    cmds = bench.commands
    flags = cmds.has_flag(COMMAND, "--cuda-graphs") and cmds.has_flag(COMMAND, "--no-cuda-graphs")
    name = system if graphs is None or flags else f"{system}:cuda_graphs={str(graphs).lower()}"
    args = [COMMAND, "--model", bench.model_arg(), "--system", name, "--batch", str(batch), "--json"]
    if graphs is not None and flags:
        args.append("--cuda-graphs" if graphs else "--no-cuda-graphs")
    # The engine in Reuse-only steps, the ones CUDA graphs replay; a baseline as it serves.
    if graphs is not None and cmds.has_flag(COMMAND, "--phase"):
        args += ["--phase", "reuse"]
    for flag, value in (("--preset", bench.scale.serve_preset), ("--device", bench.scale.device)):
        if cmds.has_flag(COMMAND, flag):
            args += [flag, value]
    return args


def run(bench: Bench, rec: StepRecord) -> None:
    _run(bench, rec, engine_entries(bench))


def run_baselines(bench: Bench, rec: StepRecord) -> None:
    _run(bench, rec, baseline_entries(bench))


def _run(bench: Bench, rec: StepRecord, entries: list[Entry]) -> None:
    if not bench.commands.has(COMMAND):
        rec.fail(f"`dllm-bench {COMMAND}` is not in this build: no step profile")
        return
    one = bench.costs.profile_s
    rows = []
    for system, graphs, batch, source in entries:
        name = label(system, graphs, batch)
        row = {"label": name, "system": system, "cuda_graphs": graphs, "batch": batch, "batch_from": source,
               "status": NOT_RUN, "file": None}
        rows.append(row)
        left = bench.left_s()
        if left is not None and left < one:
            row["reason"] = f"time budget: {max(left, 0):.0f} s left, one profile takes ~{one:.0f} s"
            continue
        outcome = run_cli(_args(bench, system, graphs, batch), bench.out / "logs" / "profile" / f"{name}.log",
                          timeout_s=4 * one + 60)
        try:
            doc = json.loads(outcome.stdout) if outcome.ok else None
        except ValueError:
            doc = None
        if doc is None:
            row["status"], row["reason"] = FAILED, outcome.reason() if not outcome.ok else "no JSON on stdout"
            continue
        path = bench.out / "profile" / f"{name}.json"
        atomic_write_json(path, doc)
        row.update(status=OK, file=bench.rel(path), **profile_figures(doc))
    rec.data = {"entries": rows}
    rec.outputs += ["profile/", "logs/profile/"]
    done = sum(r["status"] == OK for r in rows)
    line = f"{done}/{len(rows)} profiles"
    bad = [f"{r['label']}: {r.get('reason', '')}" for r in rows if r["status"] != OK]
    if bad:
        rec.fail(f"{line}; {bad[0]}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""))
    else:
        rec.status, rec.detail = OK, line
