"""Held-out splits of the generated tasks (synth, synth-cot): a question's split is a pure
function of its text, so train, dev and test are disjoint for every seed, size and knob setting.

5 % of the question space is `test` (the reported figures), the next 5 % `dev` (where choices
such as the selection scoring rule are made), the rest `train`. Before dev existed the held-out
share was one 10 % `test` split; it is now cut in two, so the training split (and every model
trained on it) is unchanged.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

SPLITS: tuple[str, ...] = ("train", "dev", "test")
TEST_PERCENT = 5
DEV_PERCENT = 5


def split_of(question: str) -> str:
    """"test" | "dev" | "train" for a question text (sha256 bucket out of 100)."""
    h = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big") % 100
    if h < TEST_PERCENT:
        return "test"
    return "dev" if h < TEST_PERCENT + DEV_PERCENT else "train"


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def draw(split: str, n: int, stream: str, candidate: Callable[[random.Random], dict]) -> list[dict]:
    """The first `n` distinct candidates of the seeded stream `stream` that belong to `split`.

    One stream per (task, seed, split): a split's questions do not change with the size of
    another's. random.Random(str) seeds via sha512, independent of PYTHONHASHSEED."""
    check_split(split)
    rng = random.Random(stream)
    out: list[dict] = []
    seen: set[str] = set()
    budget = 200 * n + 10_000                        # stop degenerate (tiny) question spaces
    while len(out) < n:
        budget -= 1
        if budget < 0:
            raise ValueError(f"could not draw {n} distinct {split} examples with these knobs")
        ex = candidate(rng)
        if split_of(ex["question"]) != split or ex["question"] in seen:
            continue
        seen.add(ex["question"])
        out.append(ex)
    return out
