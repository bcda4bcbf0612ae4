"""One `dllm-bench` sub-command in its own process, with this Python and this source tree: its
stderr (progress, tables) and stdout go to a log file, stdout is also returned (the --json
document), and a crash, a hang past its timeout or Ctrl-C ends it and every process it started
(serve's workers) without ending the run. `Commands` says which sub-commands and flags this
build has, so a step whose command has not landed is recorded as such instead of failing late.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import dllm_bench

SOURCE_ROOT = Path(dllm_bench.__file__).resolve().parent.parent
GRACE_S = 10.0  # after SIGTERM, before SIGKILL


@dataclass(frozen=True)
class Commands:
    """Sub-command name -> its option strings (`--json`, `--no-cuda-graphs`, ...)."""
    options: Mapping[str, frozenset[str]]

    def has(self, command: str) -> bool:
        return command in self.options

    def has_flag(self, command: str, flag: str) -> bool:
        return flag in self.options.get(command, ())

    @classmethod
    def of(cls, group) -> Commands:
        """From the CLI's click group (`typer.main.get_command(app)`)."""
        return cls({name: frozenset(o for p in cmd.params for o in (*p.opts, *p.secondary_opts))
                    for name, cmd in getattr(group, "commands", {}).items()})


@dataclass(frozen=True)
class Outcome:
    args: tuple[str, ...]
    rc: int               # the exit code; -1 timed out, 130 interrupted
    seconds: float
    stdout: str
    log: Path

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def reason(self) -> str:
        """One line saying why it failed: its last `error:` line, else its last line."""
        if self.rc == -1:
            return f"timed out after {self.seconds:.0f} s (log: {self.log.name})"
        lines = [ln.strip() for ln in self.log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")]
        last = errors[-1] if errors else (lines[-1] if lines else "no output")
        return f"exit {self.rc}: {last[:300]}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(SOURCE_ROOT) + (os.pathsep + path if path else "")
    env.setdefault("COLUMNS", "200")  # the logs' tables are not squeezed into 80 columns
    return env


def _stop(proc: subprocess.Popen, sig: int) -> None:
    """Signal the sub-command's process group (it and its workers), then make sure it ends."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run_cli(args: Sequence[str], log: Path, timeout_s: float | None = None) -> Outcome:
    """`dllm-bench ARGS` as a child in its own session; KeyboardInterrupt is passed on to it
    and re-raised once it has ended."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("w", encoding="utf-8") as fh:
        fh.write(f"$ dllm-bench {shlex.join(args)}\n")
        fh.flush()
        proc = subprocess.Popen([sys.executable, "-m", "dllm_bench.cli", *args], stdout=subprocess.PIPE,
                                stderr=fh, text=True, env=_env(), start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            _stop(proc, signal.SIGTERM)
            out, rc = proc.communicate()[0], -1
        except KeyboardInterrupt:
            _stop(proc, signal.SIGINT)
            raise
        fh.write(out)
    return Outcome(tuple(args), rc, time.perf_counter() - t0, out, log)
