"""Where a benchmark script's result goes: `--result-dir` / `--run-id` like the commands', a run
directory of the script's kind holding its config and its summary document
(`results.write_result`), and the summary table printed from that directory (the one a doc's
current-results block renders: dllm_bench.report.benchmarks)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dllm_bench import inputs, results
from dllm_bench.errors import UserError
from dllm_bench.report.benchmarks import table_of


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--result-dir", default=None, help="the runs root (default: results/runs or $DLLM_BENCH_RESULTS_DIR)")
    ap.add_argument("--run-id", default=None, help="the run directory's name (default: timestamp-KIND)")


def check(a: argparse.Namespace) -> None:
    """Before anything is measured: a runs root we cannot write, or a run id that is not one plain
    name or names a run that exists, is one error line (exit 2)."""
    try:
        a.result_dir, a.run_id = inputs.result_dir(a.result_dir), inputs.run_id(a.run_id)
        if a.run_id and (a.result_dir / a.run_id).exists():
            raise UserError(f"run directory {a.result_dir / a.run_id} exists (choose another --run-id)")
    except UserError as e:
        fail(str(e))


def fail(message: str) -> None:
    """Bad input: one `error:` line and exit 2, as the commands do."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def save(kind: str, a: argparse.Namespace, config: dict, summary: dict) -> Path:
    """Write the run directory and print its summary table (on stdout; on stderr when `--json`
    keeps stdout for the document) and its path (stderr)."""
    run_dir = results.write_result(kind, config, summary, run_id=a.run_id, root=a.result_dir)
    print(f"\n{table_of(run_dir)}", file=sys.stderr if getattr(a, "json", False) else sys.stdout)
    print(f"results: {run_dir}", file=sys.stderr)
    return run_dir
