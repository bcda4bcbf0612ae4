"""`synth-cot`: a GSM8K-shaped task with long worked answers, learnable by a ~1M-parameter
masked-diffusion model on a CPU, whose every answer step needs a different context token.

Each example: K facts "<Name> has <word> <item>." (values spelled out), of which `needles` (3 by
default) at random positions are events with a digit value and a marker verb ("<Name> found 7
<item>."; found/won/got add, lost/gave take away); the question lists the markers in context
order; the answer is a worked chain over the needles in that order, e.g. "found 7 - lost 3 = 4.
4 + won 5 = 9.\n#### 9" (27 tokens with `dllm-bench train`'s BPE; 4 needles: ~36). So at
retention r the answer survives only if the selection keeps each step's needle for the queries
of that step. Why this shape: `worked_answer`. Splits: train / dev / test by a stable hash of
the question text (`splits.split_of`); the task and its models: docs/ACCURACY.md.
"""
from __future__ import annotations

import random
import re

from workloads.tasks.splits import check_split, draw
from workloads.tasks.synth import ITEMS, NAMES, WORDS, format_prompt

__all__ = ["examples", "solve", "format_prompt", "DEFAULT_CONTEXT_FACTS", "DEFAULT_NEEDLES"]

ADD_MARKERS: tuple[str, ...] = ("found", "won", "got")
SUB_MARKERS: tuple[str, ...] = ("lost", "gave")
MARKERS = ADD_MARKERS + SUB_MARKERS
DEFAULT_CONTEXT_FACTS = 16
DEFAULT_NEEDLES = 3
DEFAULT_MAX_VALUE = 9

_FACT = re.compile(r"(\w+) (has|found|won|got|lost|gave) (\w+) (\w+)\.")
_QUESTION = re.compile(r"How many (\w+) are there after the ones ([\w, ]+)\?$")


def _sign(marker: str) -> str:
    return "+" if marker in ADD_MARKERS else "-"


def worked_answer(events: list[tuple[str, int]]) -> tuple[str, int]:
    """(answer text, N) for the needles' (marker, value) in context order: one step per needle after
    the first, each needle's marker written right before its value.

    Every needle value is written once; only computed running totals repeat (a step's result is
    the next one's first operand): a second copy of a recalled value lets a model trained with
    random masking copy it instead of learning to recall it. Needles are recognisable by form (the
    only digits in the context) and keyed by the marker before them in both context and answer
    ("lost 3"): a lookup a small model learns (an induction-style match of the preceding token),
    unlike name-keyed recall. Steps follow context order, as the question lists the markers, so
    later steps need later needles."""
    (m0, total), steps = events[0], []
    first = f"{m0} {total}"
    for marker, v in events[1:]:
        new = total + v if marker in ADD_MARKERS else total - v
        steps.append(f"{first if not steps else total} {_sign(marker)} {marker} {v} = {new}.")
        total = new
    return " ".join(steps) + f"\n#### {total}", total


def _question(item: str, markers: list[str]) -> str:
    listed = ", ".join(markers[:-1]) + f" and {markers[-1]}"
    return f"How many {item} are there after the ones {listed}?"


def _candidate(rng: random.Random, k: int, needles: int, max_value: int) -> dict:
    item = rng.choice(ITEMS)
    names = rng.sample(NAMES, k)
    where = sorted(rng.sample(range(k), needles))
    markers = [rng.choice(ADD_MARKERS)]              # the chain starts from something there
    markers += rng.sample([m for m in MARKERS if m != markers[0]], needles - 1)
    values, total = [], 0       # totals stay in 0..needles*max_value: a take never exceeds the total
    for m in markers:
        hi = max_value if m in ADD_MARKERS else min(max_value, total)
        if hi < 1:                                  # nothing left to take away: make it a gain
            return _candidate(rng, k, needles, max_value)
        v = rng.randint(1, hi)
        values.append(v)
        total += v if m in ADD_MARKERS else -v
    event = {i: (m, v) for i, m, v in zip(where, markers, values, strict=True)}
    facts = [f"{nm} {event[i][0]} {event[i][1]} {item}." if i in event
             else f"{nm} has {WORDS[rng.randint(1, max_value)]} {item}." for i, nm in enumerate(names)]
    answer, n = worked_answer(list(zip(markers, values, strict=True)))
    return {"question": " ".join(facts) + " " + _question(item, markers), "answer": answer,
            "target": str(n), "op": f"chain{needles}"}


def examples(split: str, n: int, seed: int = 0, context_facts: int = DEFAULT_CONTEXT_FACTS,
             needles: int = DEFAULT_NEEDLES, max_value: int = DEFAULT_MAX_VALUE) -> list[dict]:
    """`n` distinct examples of `split` ("train" | "dev" | "test"), deterministic in all arguments
    and prefix-stable in n: {"question", "answer" (worked, ends in "#### N"), "target", "op"}."""
    check_split(split)
    k, needles = int(context_facts), int(needles)
    if not 2 <= needles <= len(MARKERS):
        raise ValueError(f"needles must be in 2..{len(MARKERS)}, got {needles}")
    if not needles <= k <= len(NAMES):
        raise ValueError(f"context_facts must be in {needles}..{len(NAMES)}, got {k}")
    if not 1 <= int(max_value) <= 9:
        raise ValueError(f"max_value must be in 1..9 (single-digit values), got {max_value}")
    return draw(split, n, f"dllm-bench-synth-cot:{int(seed)}:{split}",
                lambda rng: _candidate(rng, k, needles, int(max_value)))


def solve(question: str) -> dict:
    """{"answer", "target", "op"} recomputed from a synth-cot question's own text; ValueError if
    the question's markers do not match its digit-valued facts."""
    events = [(verb, int(v)) for _, verb, v, _ in _FACT.findall(question) if verb != "has"]
    m = _QUESTION.search(question)
    if not m or not events:
        raise ValueError(f"not a synth-cot question: {question[-80:]!r}")
    listed = re.split(r", | and ", m.group(2))
    if listed != [verb for verb, _ in events]:
        raise ValueError(f"question lists {listed}, context has {[v for v, _ in events]}")
    answer, n = worked_answer(events)
    return {"answer": answer, "target": str(n), "op": f"chain{len(events)}"}
