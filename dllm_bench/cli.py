"""`dllm-bench` entry point. Each command lives in dllm_bench/commands/<name>.py and exposes
`register(app)`; this file only assembles them and turns bad input into one line and exit code 2,
any other error (a library's, or a bug) into one line and exit code 1 (the traceback in a file)."""
from __future__ import annotations

import importlib
import math
import os
import sys
import tempfile
import traceback
from pathlib import Path

import click
import typer
import typer.main

from dllm_bench import inputs
from dllm_bench.errors import EXIT_USAGE, UserError
from engine.parallel.driver import RankFailure

# An error that is not bad input prints one line; with this set, its whole traceback instead.
TRACEBACK_ENV = "DLLM_BENCH_TRACEBACK"

app = typer.Typer(
    name="dllm-bench",
    help="Benchmark and evaluate diffusion-LLM serving (LLaDA family): engine vs baselines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One line per command module; a module registers one or more commands (or a sub-app).
COMMAND_MODULES = [
    "dllm_bench.commands.models",
    "dllm_bench.commands.serve",
    "dllm_bench.commands.server",
    "dllm_bench.commands.generate",
    "dllm_bench.commands.profile",
    "dllm_bench.commands.profile_step",
    "dllm_bench.commands.memory",
    "dllm_bench.commands.systems",
    "dllm_bench.commands.train",
    "dllm_bench.commands.accuracy",
    "dllm_bench.commands.frontier",
    "dllm_bench.commands.ablate",
    "dllm_bench.commands.sweep",
    "dllm_bench.commands.report",
    "dllm_bench.commands.calibrate",
    "dllm_bench.commands.simulate",
    "dllm_bench.commands.doctor",
    "dllm_bench.commands.bench_gpu",
]

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


class _Float(click.types.FloatParamType):
    """A float option that refuses NaN (Python's float() accepts "nan"; no knob means it)."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if math.isnan(v):
            self.fail(f"{value!r} is not a number", param, ctx)
        return v


class _Int(click.types.IntParamType):
    """An integer option that fits int64, the widest integer torch and numpy take."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if not -(2**63) <= v < 2**63:
            self.fail(f"{value!r} is out of range", param, ctx)
        return v


class _Count(_Int):
    """A request/sample count (inputs.COUNT_OPTIONS): at most inputs.MAX_COUNT; the commands
    keep their own lower-bound messages."""

    def __init__(self, flag: str, what: str):
        self.flag, self.what = flag, what

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if v > inputs.MAX_COUNT:
            inputs.count(v, self.flag, self.what)
        return v


def _harden(cmd: click.Command) -> click.Command:
    """Every plain float/int option of every command gets the checked types above."""
    for p in cmd.params:
        if type(p.type) is click.types.FloatParamType:
            p.type = _Float()
        elif type(p.type) is click.types.IntParamType and p.name in inputs.COUNT_OPTIONS:
            p.type = _Count(max(p.opts, key=len), inputs.COUNT_OPTIONS[p.name])
        elif type(p.type) is click.types.IntParamType:
            p.type = _Int()
    for sub in getattr(cmd, "commands", {}).values():
        _harden(sub)
    return cmd


def one_line(text: str, limit: int | None = None) -> str:
    """A message as one line (a library's may span several), cut at `limit` characters."""
    line = " ".join(str(text).split())
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


def unexpected(e: Exception) -> str:
    """One line for an error nothing turned into a UserError (a library's, or a bug of ours):
    what was raised and where; the whole traceback goes to a file for a bug report."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    with tempfile.NamedTemporaryFile("w", prefix="dllm-bench-error-", suffix=".txt", delete=False) as f:
        f.write("".join(traceback.format_exception(e)))
    return (f"{type(e).__name__}{where}: {one_line(e, 400) or repr(e)} (traceback: {f.name}; "
            f"{TRACEBACK_ENV}=1 prints it)")


def main() -> None:
    try:
        _harden(typer.main.get_command(app)).main(standalone_mode=False)
    except UserError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except RankFailure as e:      # a tensor-parallel rank failed or exited: not bad input, one line too
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as e:  # bare `dllm-bench models`: the help is the answer
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.ClickException as e:  # usage errors: one line as well
        where = getattr(getattr(e, "ctx", None), "command_path", None)
        hint = f" (see '{where} --help')" if where else ""
        print(f"error: {e.format_message()}{hint}", file=sys.stderr)
        sys.exit(e.exit_code)
    except Exception as e:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"error: {unexpected(e)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
