"""The report's frontier section: the latest `dllm-bench frontier` run's table, Pareto plot and
the goals' verdicts (issue 39's, not the paper's: no claim rows), read from its summary.json."""
from __future__ import annotations

from pathlib import Path

from dllm_bench.frontier.output import markdown
from dllm_bench.report.claims import Claims
from dllm_bench.report.sections import _figures
from dllm_bench.results import read_json


def frontier_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:
    doc = read_json(run_dir / "summary.json")
    return "".join([f"## Frontier: accuracy vs throughput under parallel decoding ({doc['task']})\n\n",
                    f"Run `{run_dir.name}` (`dllm-bench frontier`): ", markdown(doc),
                    _figures(run_dir, "frontier.png", files_dir, "frontier", rel_base)])
