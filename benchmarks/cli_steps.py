"""dllm-bench commands run as a user types them, for the benchmarks that chain several."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(args: list[str], log: Path) -> None:
    """One dllm-bench command; its console output to `log` (a chain's progress bars would bury its
    summary). A failure stops the benchmark with the command and its log."""
    cmd = [str(Path(sys.executable).with_name("dllm-bench")), *args]
    with log.open("w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}; its output: {log}")
