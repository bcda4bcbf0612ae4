"""One kind of error the CLI turns into one line on stderr and exit code 2."""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (flags, files, checkpoints): reported, never a traceback."""


EXIT_USAGE = 2
