"""What `doctor` shows: the pass/fail table (stderr, like every Rich table here), the JSON
document (`--json`, stdout), the commands to run next, and the exit code (1 iff a check failed)."""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from dllm_bench.doctor.checks import FAIL, OK, SKIP, WARN, Check

STYLE = {OK: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def next_commands(checks: list[Check], model: Path | None) -> list[str]:
    """The commands a user runs after this one, in order: fixes first, then the first real runs."""
    c = by_name(checks)
    failed = [x.name for x in checks if x.status == FAIL]
    if failed:
        return [f"fix the failed check(s) first: {', '.join(failed)}; then run `dllm-bench doctor` again"]
    gpu = c.get("device") is not None and c["device"].data.get("type") == "cuda"
    if not gpu:
        out = ["dllm-bench generate --model tiny --prompt Hello          # seconds",
               "dllm-bench serve --rps 0.5                                # the default CPU benchmark, ~10 min",
               "dllm-bench simulate --preset paper --hardware h100        # a GPU run, simulated"]
        if c.get("layer timing") is not None and c["layer timing"].status == WARN:
            out.insert(0, "dllm-bench calibrate                                      # profile this CPU for simulate")
        return out + ["on a GPU machine: docs/GPU.md"]
    d = str(model) if model is not None else "DIR"
    out = [] if model is not None else ["dllm-bench doctor --model /path/to/LLaDA-8B-Instruct"]
    if c.get("attention") is not None and c["attention"].status == WARN:
        out.append("pip install -e '.[gpu]'                                   # flash-attn (or torch >= 2.10)")
    mem = c["memory"].data.get("total") if c.get("memory") is not None else None
    gib = f"{int(mem / 2**30)}GiB" if mem else "80GiB"
    prof = (c.get("layer timing").data.get("profile") if c.get("layer timing") is not None else None) or "mygpu"
    out += [f"dllm-bench profile --model llada-8b --device-memory {gib}",
            f"dllm-bench generate --model {d} --prompt 'What is 7 * 8?'",
            f"dllm-bench serve --preset paper --model {d}",
            f"dllm-bench accuracy --model {d}",
            f"dllm-bench calibrate --device cuda --preset paper --model {d} --name {prof}-here",
            f"dllm-bench simulate --preset paper --hardware {prof}-here"]
    return out + ["details: docs/GPU.md"]


def table(checks: list[Check]) -> Table:
    t = Table(title="dllm-bench doctor", show_lines=False)
    t.add_column("check", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("detail", overflow="fold")
    for c in checks:
        t.add_row(c.name, f"[{STYLE[c.status]}]{c.status}[/]", escape(c.detail))
    return t


def show(checks: list[Check], model: Path | None, console) -> None:
    console.print(table(checks))
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL, SKIP)}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    console.print("next:")
    for line in next_commands(checks, model):
        console.print(f"  {line}", markup=False, highlight=False)


def document(checks: list[Check], model: Path | None, seconds: float) -> dict:
    return {"ok": exit_code(checks) == 0, "seconds": round(seconds, 2), "model": str(model) if model else None,
            "checks": [{"name": c.name, "status": c.status, "detail": c.detail, **({"data": c.data} if c.data else {})}
                       for c in checks],
            "next": next_commands(checks, model)}
