"""`dllm-bench` entry point. Each command lives in dllm_bench/commands/<name>.py and exposes
`register(app)`; this file only assembles them and turns bad input into exit code 2."""
from __future__ import annotations

import importlib
import sys

import typer

from dllm_bench.errors import EXIT_USAGE, UserError

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
    "dllm_bench.commands.systems",
    "dllm_bench.commands.train",
    "dllm_bench.commands.accuracy",
    "dllm_bench.commands.ablate",
    "dllm_bench.commands.sweep",
    "dllm_bench.commands.report",
    "dllm_bench.commands.calibrate",
    "dllm_bench.commands.simulate",
]

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    try:
        app(standalone_mode=False)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # click usage errors come through here with standalone_mode=False
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(EXIT_USAGE)
        if isinstance(e, click.exceptions.Exit):
            sys.exit(e.exit_code)
        raise


if __name__ == "__main__":
    main()
