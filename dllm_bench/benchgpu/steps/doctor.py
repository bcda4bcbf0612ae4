"""Step `doctor`: `dllm-bench doctor --json` on the device and the checkpoint; its document is
kept as doctor.json and its table in the log, its rows go into the summary."""
from __future__ import annotations

import json

from dllm_bench.benchgpu.record import OK, Bench, StepRecord
from dllm_bench.benchgpu.subcommand import run_cli
from dllm_bench.results import atomic_write_json


def estimate(bench: Bench) -> float:
    return bench.costs.doctor_s


def run(bench: Bench, rec: StepRecord) -> None:
    args = ["doctor", "--device", bench.scale.device, "--json"]
    if bench.model_dir is not None:
        args += ["--model", str(bench.model_dir)]
    outcome = run_cli(args, bench.log("doctor"))
    rec.outputs.append(bench.rel(outcome.log))
    try:
        doc = json.loads(outcome.stdout)
    except ValueError:
        rec.fail(f"doctor printed no JSON document: {outcome.reason()}")
        return
    atomic_write_json(bench.out / "doctor.json", doc)
    rec.outputs.append("doctor.json")
    checks = doc.get("checks", [])
    rec.data = {"checks": [{k: c.get(k) for k in ("name", "status", "detail")} for c in checks]}
    counts: dict[str, int] = {}
    for c in checks:
        counts[c.get("status", "?")] = counts.get(c.get("status", "?"), 0) + 1
    line = ", ".join(f"{n} {s}" for s, n in counts.items())
    failed = [c["name"] for c in checks if c.get("status") == "fail"]
    if failed or not outcome.ok:
        rec.fail(f"{line}; failed: {', '.join(failed) or outcome.reason()}")
    else:
        rec.status, rec.detail = OK, line
