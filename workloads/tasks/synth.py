"""`synth`: a GSM8K-format synthetic task family that a ~3-5M-parameter masked-diffusion model can
learn on a CPU in minutes, and whose answers hinge on a few specific context tokens (so dropping
KV entries, retention r << 1, visibly costs accuracy).

Design (why): measured here, a 3.4M model learns ONE arithmetic step over single-digit operands
(60-76% in 6-8 CPU minutes) but not multi-digit or multi-step problems. So each example is:

    context  = K facts "<Name> has <d> <item>." (K distinct names, one shared item, d in 1..9)
    query    = recall one value | add two recalled values | subtract two recalled values
    answer   = "#### N" (recall) | "a + b = N\n#### N" (add/sub): each recalled value once

e.g. (K=4) question: "Ann has 3 marbles. Bob has 7 marbles. Cy has 2 marbles. Dee has 5 marbles.
How many marbles do Bob and Dee have together?"  answer: "7 + 5 = 12\\n#### 12"

* Learnable: the only skills are associative recall (name -> the digit two tokens later) and a
  single-digit add/sub table; the operands are written out before the result, so the arithmetic
  itself is one visible step. No recalled value is written twice (see `_worked_answer`).
* KV-sensitive: the answer depends on 1-2 facts (6 tokens each) at random positions among the
  other K-1 (distractors); the default K=32 gives ~206 prompt tokens with a digit-splitting BPE
  trained on this corpus (K=8: 62, 16: 110, 48: 302, 64: 398), answers <= 12 tokens (one 32-token
  block). Retention 0.1 keeps ~21 prompt tokens: enough for the needed facts only if the selection
  finds them, and two-fact queries reward per-head selection (heads can retrieve different names).
* Knobs: `context_facts` (K, length and retrieval difficulty), `ops` (recall < add < sub),
  `max_value` (operand range; keep <= 9), so training can use a curriculum (small K first).
* Splits: a question belongs to train or test by a stable hash of its text (10% test), so train
  and test are disjoint for every seed, n and knob setting; generation asserts it.
"""
from __future__ import annotations

import hashlib
import random
import re

# Short, common first names: a BPE tokenizer trained on this corpus keeps each as one token, so
# the recall key is a single token (the easiest form of associative recall).
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
OPS: tuple[str, ...] = ("recall", "add", "sub")
SPLITS: tuple[str, ...] = ("train", "test")
TEST_PERCENT = 10                       # share of the question space assigned to the test split
DEFAULT_CONTEXT_FACTS = 32
DEFAULT_MAX_VALUE = 9
PROMPT_TEMPLATE = "Question: {question}\nAnswer:"   # same as GSM8K (lm-eval's gsm8k doc_to_text)

_FACT = re.compile(r"(\w+) has (\d+) (\w+)\.")
_QUERIES = {
    "recall": re.compile(r"How many (\w+) does (\w+) have\?$"),
    "add": re.compile(r"How many (\w+) do (\w+) and (\w+) have together\?$"),
    "sub": re.compile(r"How many more (\w+) does (\w+) have than (\w+)\?$"),
}


def format_prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question)


def split_of(question: str) -> str:
    """The split a question belongs to: a pure function of its text, hence disjoint splits."""
    h = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big")
    return "test" if h % 100 < TEST_PERCENT else "train"


def _worked_answer(op: str, item: str, facts: list[tuple[str, int]]) -> tuple[str, int]:
    """Answer text (one step for add/sub, then '#### N') and N, for the queried facts in order.

    Each recalled value appears exactly once in the answer: when the answer restated the facts
    ("Bob has 7 marbles. ... #### 7") a model trained with random masking learned to copy the
    value between the two answer copies instead of recalling it from the context (measured: 100%
    with the other copy visible, 24% without, at K=12), so recall was barely learned at all.
    """
    del item                                        # the unit is in the question only
    if op == "recall":
        n = facts[0][1]
        return f"#### {n}", n
    (_, a), (_, b) = facts
    n = a + b if op == "add" else a - b
    sign = "+" if op == "add" else "-"
    return f"{a} {sign} {b} = {n}\n#### {n}", n


def _candidate(rng: random.Random, k: int, ops: tuple[str, ...], max_value: int) -> dict:
    item = rng.choice(ITEMS)
    names = rng.sample(NAMES, k)                     # distinct names: every recall is unambiguous
    values = [rng.randint(1, max_value) for _ in names]
    op = rng.choice(ops)
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


def synth_examples(split: str, n: int, seed: int = 0, context_facts: int = DEFAULT_CONTEXT_FACTS,
                   ops: tuple[str, ...] | list[str] | str = OPS,
                   max_value: int = DEFAULT_MAX_VALUE) -> list[dict]:
    """`n` distinct examples of `split` ("train" | "test"), deterministic in all arguments.

    Each is {"question", "answer" (worked, ends in "#### N"), "target" ("N"), "op"}.
    `ops` may be a comma-separated string ("recall,add") for CLI/metadata use.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    ops = tuple(o.strip() for o in ops.split(",")) if isinstance(ops, str) else tuple(ops)
    if not ops or any(o not in OPS for o in ops):
        raise ValueError(f"ops must be a non-empty subset of {OPS}, got {ops}")
    k = int(context_facts)
    if not (2 if set(ops) - {"recall"} else 1) <= k <= len(NAMES):
        raise ValueError(f"context_facts must be in 1..{len(NAMES)} (>= 2 with add/sub), got {k}")
    if not 1 <= int(max_value) <= 9:
        raise ValueError(f"max_value must be in 1..9 (single-digit operands), got {max_value}")
    # One stream per (seed, split): the test set does not change with the size of the train set.
    # random.Random(str) seeds via sha512, independent of PYTHONHASHSEED.
    rng = random.Random(f"dllm-bench-synth:{int(seed)}:{split}")
    out: list[dict] = []
    seen: set[str] = set()
    budget = 200 * n + 10_000                        # stop degenerate (tiny) question spaces
    while len(out) < n:
        budget -= 1
        if budget < 0:
            raise ValueError(f"could not draw {n} distinct {split} examples with these knobs")
        ex = _candidate(rng, k, ops, int(max_value))
        if split_of(ex["question"]) != split or ex["question"] in seen:
            continue
        seen.add(ex["question"])
        out.append(ex)
    assert all(split_of(e["question"]) == split for e in out)   # disjointness by construction
    return out


def solve(question: str) -> dict:
    """Recompute {"answer", "target", "op"} from a synth question's own text (facts + query).

    Used by the oracle backend and as an independent check of generated examples.
    """
    facts = {name: int(v) for name, v, _ in _FACT.findall(question)}
    items = {it for _, _, it in _FACT.findall(question)}
    query = question.rsplit(". ", 1)[-1]
    for op, rx in _QUERIES.items():
        m = rx.search(query)
        if m:
            item, *names = m.groups()
            if item not in items or any(nm not in facts for nm in names):
                break
            answer, n = _worked_answer(op, item, [(nm, facts[nm]) for nm in names])
            return {"answer": answer, "target": str(n), "op": op}
    raise ValueError(f"not a synth question: {question[-80:]!r}")
