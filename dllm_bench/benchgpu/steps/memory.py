"""Step `memory`: `dllm-bench memory` (the longest canvas each system fits in a budget, peak and
mean memory over a request's steps) at the 22 GiB budget and at the whole GPU's, kept under
memory/. Flags this build's command lacks are not passed; a build without the command fails the
step in one line."""
from __future__ import annotations

import json

from dllm_bench.benchgpu.record import FAILED, NOT_RUN, OK, Bench, StepRecord
from dllm_bench.benchgpu.subcommand import run_cli
from dllm_bench.results import atomic_write_bytes, atomic_write_json

COMMAND = "memory"


def budgets(bench: Bench) -> list[tuple[str, str | None]]:
    """(label, --memory-budget or None for the command's default: the whole GPU)."""
    s = bench.scale
    return [("small", s.small_budget), ("full", s.full_budget)]


def estimate(bench: Bench) -> float:
    return len(budgets(bench)) * bench.costs.load_s


def _args(bench: Bench, budget: str | None) -> list[str]:
    has = bench.commands.has_flag
    args = [COMMAND, "--model", bench.model_arg()]
    if budget is not None and has(COMMAND, "--memory-budget"):
        args += ["--memory-budget", budget]
    if has(COMMAND, "--device"):
        args += ["--device", bench.scale.device]
    if has(COMMAND, "--json"):
        args.append("--json")
    return args


def run(bench: Bench, rec: StepRecord) -> None:
    if not bench.commands.has(COMMAND):
        rec.fail(f"`dllm-bench {COMMAND}` is not in this build: no memory report")
        return
    rows = []
    for name, budget in budgets(bench):
        row = {"regime": name, "budget": budget, "status": NOT_RUN, "file": None}
        rows.append(row)
        left = bench.left_s()
        if left is not None and left < bench.costs.load_s:
            row["reason"] = f"time budget: {max(left, 0):.0f} s left"
            continue
        outcome = run_cli(_args(bench, budget), bench.out / "logs" / f"memory-{name}.log",
                          timeout_s=4 * bench.costs.load_s + 120)
        if not outcome.ok:
            row["status"], row["reason"] = FAILED, outcome.reason()
            continue
        try:
            doc = json.loads(outcome.stdout)
        except ValueError:
            doc = None
        path = bench.out / "memory" / f"{name}.{'json' if doc is not None else 'txt'}"
        if doc is not None:
            atomic_write_json(path, doc)
            row["doc"] = doc
        else:
            atomic_write_bytes(path, outcome.stdout.encode())
        row.update(status=OK, file=bench.rel(path))
    rec.data = {"entries": rows}
    rec.outputs += ["memory/"]
    bad = [f"{r['regime']}: {r.get('reason', '')}" for r in rows if r["status"] != OK]
    if bad:
        rec.fail("; ".join(bad))
    else:
        rec.status, rec.detail = OK, f"{len(rows)} budgets"
