"""`synth`: a GSM8K-format synthetic task family that a ~1M-parameter masked-diffusion model learns
on a CPU in minutes, whose answers hinge on a few context tokens (so dropping KV costs accuracy).

Each example: K facts "<Name> has <d> <item>." (one shared item); the question recalls one value
or adds/subtracts two, the asked facts picked by a marker verb ("found", "won"; the default ops
mark-*, whose facts are the only digits in the context) or by the person's name (ops recall/add/
sub); the answer is "#### N", or "a + b = N\n#### N" for add/sub. K=16 gives ~105 prompt tokens
and answers <= 12 tokens, so at retention 0.1 the needed digits survive only if the selection
finds them. Knobs: `context_facts` (K), `ops`, `max_value` (keep <= 9). Splits: train / dev /
test by a stable hash of the question text (`splits.split_of`). Why this shape: the comments
below; the task and its models: docs/ACCURACY.md ("Tasks and models").
"""
from __future__ import annotations

import random
import re

from workloads.tasks.splits import check_split, draw, split_of

# Short, common first names: a BPE tokenizer trained on this corpus keeps each as one token, so
# a name-keyed recall key is a single token (the easiest form of associative recall).
NAMES: tuple[str, ...] = (
    "Ann", "Bob", "Cy", "Dee", "Eve", "Fay", "Gus", "Hal", "Ida", "Jay", "Kim", "Lou", "Max", "Ned",
    "Oli", "Pam", "Quin", "Ray", "Sam", "Tom", "Uma", "Val", "Wes", "Xia", "Yul", "Zoe", "Abe", "Bea",
    "Cal", "Dan", "Eli", "Fred", "Gil", "Hope", "Ivy", "Jon", "Kate", "Leo", "Mia", "Nia", "Otto",
    "Pia", "Rex", "Sue", "Ted", "Una", "Vic", "Will", "Yan", "Zed", "Amy", "Ben", "Cat", "Don", "Ed",
    "Flo", "Greg", "Hugo", "Ian", "Jill", "Ken", "Liz", "Meg", "Nora",
)
ITEMS: tuple[str, ...] = (
    "apples", "pears", "marbles", "books", "coins", "cards", "shells", "pens", "cups", "hats",
    "keys", "stamps", "balls", "eggs", "nuts", "kites",
)
# Two ways to point at a fact. By its person's name (associative recall, ops recall/add/sub:
# "does Bob have"), or by a marker verb written in the fact itself (ops mark-*: "Bob found 7
# marbles." among "X has N marbles." distractors; "how many were found"). When this task was
# built, name-keyed recall stayed at chance (1/K) after 48k examples even with K = 2,
# while a marker-keyed lookup (a fixed key next to the value, any position) is learned in minutes;
# so the marker-keyed ops are the default. Either way the needed fact sits at a random position.
NAME_OPS: tuple[str, ...] = ("recall", "add", "sub")
MARK_OPS: tuple[str, ...] = ("mark-recall", "mark-add", "mark-sub")
OPS: tuple[str, ...] = NAME_OPS + MARK_OPS
DEFAULT_OPS: tuple[str, ...] = MARK_OPS
MARKERS: tuple[str, str] = ("found", "won")      # verbs of the asked facts (distractors: "has")
# mark-* distractors spell their values out, the asked facts use digits: the needle is recognisable
# by its form, so finding it is one attention hop (learned in minutes); what retention tests is
# whether the KV selection keeps it.
WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DEFAULT_CONTEXT_FACTS = 16                # ~105 prompt tokens (K=32: ~200); what tiny-math is evaluated at
DEFAULT_MAX_VALUE = 9
PROMPT_TEMPLATE = "Question: {question}\nAnswer:"   # same as GSM8K (lm-eval's gsm8k doc_to_text)

_FACT = re.compile(r"(\w+) (?:has|found|won) (\w+) (\w+)\.")
_VERB_FACT = re.compile(r"(\w+) (has|found|won) (\w+) (\w+)\.")
_QUERIES = {
    "recall": re.compile(r"How many (\w+) does (\w+) have\?$"),
    "add": re.compile(r"How many (\w+) do (\w+) and (\w+) have together\?$"),
    "sub": re.compile(r"How many more (\w+) does (\w+) have than (\w+)\?$"),
    "mark-recall": re.compile(r"How many (\w+) were (found|won)\?$"),
    "mark-add": re.compile(r"How many (\w+) were (found) and (won) together\?$"),
    "mark-sub": re.compile(r"What is the difference between the (\w+) (found) and (won)\?$"),
}


def format_prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question)


def _worked_answer(op: str, item: str, facts: list[tuple[str, int]]) -> tuple[str, int]:
    """Answer text (one step for add/sub, then '#### N') and N, for the queried facts in order.

    Each recalled value appears exactly once in the answer: when the answer restated the facts
    ("Bob has 7 marbles. ... #### 7") a model trained with random masking learned to copy the
    value between the two answer copies instead of recalling it from the context (measured: 100%
    with the other copy visible, 24% without, at K=12), so recall was barely learned at all.
    """
    del item                                        # the unit is in the question only
    if op.endswith("recall"):
        n = facts[0][1]
        return f"#### {n}", n
    (_, a), (_, b) = facts
    n = a + b if op.endswith("add") else a - b
    sign = "+" if op.endswith("add") else "-"
    return f"{a} {sign} {b} = {n}\n#### {n}", n


def _candidate(rng: random.Random, k: int, ops: tuple[str, ...], max_value: int) -> dict:
    item = rng.choice(ITEMS)
    names = rng.sample(NAMES, k)                     # distinct names: every recall is unambiguous
    values = [rng.randint(1, max_value) for _ in names]
    op = rng.choice(ops)
    if op in MARK_OPS:
        return _marked(rng, k, op, item, names, values)
    if op == "recall":
        picked = [rng.randrange(k)]
        query = f"How many {item} does {names[picked[0]]} have?"
    else:
        i, j = rng.sample(range(k), 2)
        if op == "sub" and values[i] < values[j]:     # keep answers >= 0
            i, j = j, i
        picked = [i, j]
        a, b = names[i], names[j]
        query = (f"How many {item} do {a} and {b} have together?" if op == "add"
                 else f"How many more {item} does {a} have than {b}?")
    context = " ".join(f"{nm} has {v} {item}." for nm, v in zip(names, values, strict=True))
    answer, n = _worked_answer(op, item, [(names[p], values[p]) for p in picked])
    return {"question": f"{context} {query}", "answer": answer, "target": str(n), "op": op}


def _marked(rng: random.Random, k: int, op: str, item: str, names: list[str], values: list[int]) -> dict:
    """A marker-keyed question: the asked facts say "found" / "won" (digits), the others "has"
    (values spelled out). add lists its operands in context order, sub is larger - smaller; the two
    facts sit at different positions, which per-head selection can serve from different heads.
    E.g. (K=4) "Ann has three marbles. Bob found 7 marbles. Cy has two marbles. Dee won 5 marbles.
    How many marbles were found and won together?" -> "7 + 5 = 12\n#### 12"."""
    verbs = ["has"] * k
    if op == "mark-recall":
        i, verb = rng.randrange(k), rng.choice(MARKERS)
        verbs[i], picked, query = verb, [i], f"How many {item} were {verb}?"
    else:
        i, j = sorted(rng.sample(range(k), 2))
        verbs[i], verbs[j] = MARKERS if rng.random() < 0.5 else MARKERS[::-1]
        picked = [i, j] if op == "mark-add" or values[i] >= values[j] else [j, i]
        query = (f"How many {item} were found and won together?" if op == "mark-add"
                 else f"What is the difference between the {item} found and won?")
    context = " ".join(f"{nm} {vb} {v if vb != 'has' else WORDS[v]} {item}."
                       for nm, vb, v in zip(names, verbs, values, strict=True))
    answer, n = _worked_answer(op, item, [(names[p], values[p]) for p in picked])
    return {"question": f"{context} {query}", "answer": answer, "target": str(n), "op": op}


def synth_examples(split: str, n: int, seed: int = 0, context_facts: int = DEFAULT_CONTEXT_FACTS,
                   ops: tuple[str, ...] | list[str] | str = DEFAULT_OPS,
                   max_value: int = DEFAULT_MAX_VALUE) -> list[dict]:
    """`n` distinct examples of `split` ("train" | "dev" | "test"), deterministic in all arguments.

    Each is {"question", "answer" (worked, ends in "#### N"), "target" ("N"), "op"}.
    `ops` may be a comma-separated string ("recall,add") for CLI/metadata use.
    """
    check_split(split)
    ops = tuple(o.strip() for o in ops.split(",")) if isinstance(ops, str) else tuple(ops)
    if not ops or any(o not in OPS for o in ops):
        raise ValueError(f"ops must be a non-empty subset of {OPS}, got {ops}")
    k = int(context_facts)
    if not (2 if set(ops) - {"recall", "mark-recall"} else 1) <= k <= len(NAMES):
        raise ValueError(f"context_facts must be in 1..{len(NAMES)} (>= 2 with add/sub), got {k}")
    if not 1 <= int(max_value) <= 9:
        raise ValueError(f"max_value must be in 1..9 (single-digit operands), got {max_value}")
    out = draw(split, n, f"dllm-bench-synth:{int(seed)}:{split}", lambda rng: _candidate(rng, k, ops, int(max_value)))
    assert all(split_of(e["question"]) == split for e in out)   # disjointness by construction
    return out


def solve(question: str) -> dict:
    """Recompute {"answer", "target", "op"} from a synth question's own text (facts + query).

    Used by the oracle backend and as an independent check of generated examples.
    """
    found = [(name, verb, int(v) if v.isdigit() else WORDS.index(v), it)
             for name, verb, v, it in _VERB_FACT.findall(question)]
    by_name = {name: v for name, _, v, _ in found}
    by_verb = {verb: v for _, verb, v, _ in found if verb != "has"}
    items = {it for *_, it in found}
    query = question.rsplit(". ", 1)[-1]
    for op, rx in _QUERIES.items():
        m = rx.search(query)
        if m:
            item, *keys = m.groups()
            table = by_verb if op in MARK_OPS else by_name
            if item not in items or any(key not in table for key in keys):
                break
            vals = [table[key] for key in keys]
            if op == "mark-add":                      # operands in context order
                vals = [v for _, verb, v, _ in found if verb in keys]
            elif op == "mark-sub":
                vals = sorted(vals, reverse=True)
            answer, n = _worked_answer(op, item, [("", v) for v in vals])
            return {"answer": answer, "target": str(n), "op": op}
    raise ValueError(f"not a synth question: {question[-80:]!r}")
