"""Accuracy tasks: vendored GSM8K, lm-eval-exact scoring, HumanEval checker, synth task, lm-eval adapter."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import time

import pytest
import yaml

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")   # conftest sets these too; nothing may be fetched
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from workloads.tasks import gsm8k, humaneval, scoring, synth  # noqa: E402
from workloads.tasks.local import load_local  # noqa: E402

GSM8K_SHA256 = "b18774b41a57f26fc41bcdd8eff6a210c696edfc3828829e03b28927cdb6c58e"


# ---------------------------------------------------------------------------------------- GSM8K data
def test_gsm8k_file_identity_and_order():
    assert hashlib.sha256(gsm8k.DATA_FILE.read_bytes()).hexdigest() == GSM8K_SHA256 == gsm8k.DATA_SHA256
    rows = gsm8k.load_gsm8k()
    assert len(rows) == gsm8k.NUM_PROBLEMS == 1319
    assert all(set(r) == {"question", "answer"} for r in rows)
    assert rows[0]["question"].startswith("Janet’s ducks lay 16 eggs per day.")
    assert gsm8k.gold_number(rows[0]["answer"]) == "18"
    assert rows[-1]["question"].startswith("Henry and 3 of his friends order 7 pizzas for lunch.")
    assert gsm8k.gold_number(rows[-1]["answer"]) == "14"
    lic = (gsm8k.DATA_FILE.parent / "GSM8K_LICENSE.txt").read_text()
    assert "MIT License" in lic and "Copyright (c) 2021 OpenAI" in lic


def test_gsm8k_prompt():
    p8 = gsm8k.build_prompt("How many?", 8)
    assert p8.startswith("Question: There are 15 trees in the grove.")
    assert p8.endswith("\n\nQuestion: How many?\nAnswer:")
    assert p8.count("Question: ") == 9 and p8.count("\n#### ") == 8
    assert "#### 39\n\nQuestion: Jason had 20 lollipops." in p8
    assert gsm8k.build_prompt("How many?", 0) == "Question: How many?\nAnswer:"
    with pytest.raises(ValueError):
        gsm8k.build_prompt("x", 9)


# ---------------------------------------------------------------------------------------- scoring
@pytest.mark.parametrize("text, reference, strict, flexible, em", [
    ("So 1000 + 234 = 1234.\n#### 1,234", "#### 1234", "1,234", "1,234", (1, 1)),
    ("She has 7 - 12 = -5.\n#### -5", "x\n#### -5", "-5", "-5", (1, 1)),
    ("It costs $18.", "#### 18", "[invalid]", "$18.", (0, 1)),              # no "####": strict fails
    ("The answer is 5.", "#### 5", "[invalid]", "5.", (0, 1)),              # "5." is a 2-char match
    ("3 + 4 = 7 and 7 * 2 = 14", "#### 14", "[invalid]", "14", (0, 1)),     # flexible: LAST number
    ("#### 12\nthen 13", "#### 12", "12", "13", (1, 0)),                    # strict: FIRST "#### "
    ("#### $1,000", "#### 1000", "[invalid]", "$1,000", (0, 1)),            # strict needs a digit/sign
    ("total -1,234.50", "#### -1234.50", "[invalid]", "-1,234.50", (0, 1)),
    ("no number here", "#### 3", "[invalid]", "[invalid]", (0, 0)),
    ("#### 7", "7", "7", "7", (1, 1)),                                      # reference may be bare
])
def test_gsm8k_scoring_hand_cases(text, reference, strict, flexible, em):
    assert scoring.extract_strict(text) == strict
    assert scoring.extract_flexible(text) == flexible
    s = scoring.score_gsm8k(text, reference)
    assert (s["strict-match"], s["flexible-extract"]) == em


def test_scoring_matches_lm_eval_implementation():
    """Pin our re-implementation to lm-eval 0.4.13's filter and metric code and its gsm8k.yaml."""
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter

    ref = yaml.safe_load(open(os.path.join(os.path.dirname(__import__("lm_eval").__file__),
                                           "tasks", "gsm8k", "gsm8k.yaml")))
    m = ref["metric_list"][0]
    assert list(scoring.REGEXES_TO_IGNORE) == m["regexes_to_ignore"]
    assert (scoring.IGNORE_CASE, scoring.IGNORE_PUNCTUATION) == (m["ignore_case"], m["ignore_punctuation"])
    filt = {f["name"]: f["filter"][0] for f in ref["filter_list"]}
    assert filt["strict-match"]["regex_pattern"] == scoring.STRICT_PATTERN
    assert filt["flexible-extract"]["regex_pattern"] == scoring.FLEXIBLE_PATTERN
    texts = ["#### 1,234", "x $18. y", "A 5.", "-3 and -4", "#### -0.5.", "none", "", "$$ 12,,3 .."]
    refs = ["#### 1234", "#### 18", "5", "#### -4", "#### -0.5", "#### 1", "#### 0", "#### 123"]
    for name, group in (("strict-match", 0), ("flexible-extract", -1)):
        rx = RegexFilter(regex_pattern=filt[name]["regex_pattern"], group_select=group)
        theirs = [r[0] for r in rx.apply([[t] for t in texts], [{}] * len(texts))]
        assert theirs == [scoring.extract(t, name) for t in texts]
        for p, r in zip(theirs, refs, strict=True):
            em = exact_match_hf_evaluate([p], [r], regexes_to_ignore=m["regexes_to_ignore"],
                                         ignore_case=True, ignore_punctuation=False)["exact_match"]
            assert em == scoring.exact_match(p, r)


# ---------------------------------------------------------------------------------------- HumanEval
@pytest.fixture(scope="module")
def problems():
    return humaneval.load_problems()


def test_humaneval_canonical_pass_and_wrong_fails(problems):
    assert len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0"
    for p in problems[:3]:
        assert humaneval.build_prompt(p) == p["prompt"]
        assert humaneval.check(p, p["canonical_solution"], timeout=3.0)
    r = humaneval.check_result(problems[0], "    return None\n", timeout=3.0)
    assert r["passed"] is False and r["result"].startswith("failed")


@pytest.mark.parametrize("body", [
    "    while True:\n        pass\n",
    # swallows the SIGALRM TimeoutException, so only the parent's kill ends it
    "    while True:\n        try:\n            pass\n        except BaseException:\n            pass\n",
])
def test_humaneval_infinite_loop_is_a_failed_sample(problems, body):
    t0 = time.monotonic()
    r = humaneval.check_result(problems[2], body, timeout=1.0)
    assert r == {"passed": False, "result": "timed out"}
    assert time.monotonic() - t0 < 1.0 + 1 + 3     # alarm (1 s) / kill at timeout + 1 s, never a hang


def test_humaneval_truncation(problems):
    text = "    return x\n\n\ndef helper():\n    pass\nprint(1)\n"
    assert humaneval.truncate_completion(text) == "    return x\n\n"
    assert humaneval.truncate_completion("    if __name__:\n        return 1") == "    if __name__:\n        return 1"
    assert all(humaneval.truncate_completion(p["canonical_solution"]) == p["canonical_solution"]
               for p in problems)          # no canonical solution is damaged by the stops
    task = yaml.safe_load(re.sub(r"!function \S+", "null",
                                 open(_tasks_dir() + "/dllm_humaneval.yaml").read()))
    assert tuple(task["generation_kwargs"]["until"]) == humaneval.STOP_SEQUENCES


# ---------------------------------------------------------------------------------------- synth
_FACT = re.compile(r"(\w+) (?:has|found|won) (\w+) (\w+)\.")


_WORDS = "zero one two three four five six seven eight nine".split()


def _recompute(question: str) -> int:
    """Independent of synth.solve: parse the facts, then the query, then do the arithmetic."""
    facts = {n: int(v) for n, v in re.findall(r"(\w+) has (\d) \w+\.", question)}
    marked = re.findall(r"\w+ (found|won) (\d) \w+\.", question)          # in context order
    spelled = re.findall(r"\w+ has (\w+) \w+\.", question)
    q = question.rsplit(". ", 1)[1]
    if m := re.fullmatch(r"How many \w+ does (\w+) have\?", q):
        return facts[m.group(1)]
    if m := re.fullmatch(r"How many \w+ do (\w+) and (\w+) have together\?", q):
        return facts[m.group(1)] + facts[m.group(2)]
    if m := re.fullmatch(r"How many more \w+ does (\w+) have than (\w+)\?", q):
        return facts[m.group(1)] - facts[m.group(2)]
    assert all(w in _WORDS for w in spelled)             # mark-*: every distractor is spelled out
    if m := re.fullmatch(r"How many \w+ were (found|won)\?", q):
        assert len(marked) == 1 and marked[0][0] == m.group(1)  # only the asked fact is marked
        return int(marked[0][1])
    assert sorted(v for v, _ in marked) == ["found", "won"]
    a, b = (int(d) for _, d in marked)
    if re.fullmatch(r"How many \w+ were found and won together\?", q):
        return a + b
    assert re.fullmatch(r"What is the difference between the \w+ found and won\?", q)
    return abs(a - b)


def test_synth_determinism_and_disjointness():
    a = synth.synth_examples("train", 300, seed=3)
    assert a == synth.synth_examples("train", 300, seed=3)
    assert synth.synth_examples("train", 100, seed=3) == a[:100]      # prefix-stable in n
    assert a != synth.synth_examples("train", 300, seed=4)
    train = {e["question"] for e in synth.synth_examples("train", 3000, seed=0)}
    test = {e["question"] for e in synth.synth_examples("test", 500, seed=0)}
    test_other_seed = {e["question"] for e in synth.synth_examples("test", 200, seed=1)}
    assert len(train) == 3000 and len(test) == 500
    assert not train & test and not train & test_other_seed
    assert all(synth.split_of(q) == "test" for q in test)


@pytest.mark.parametrize("k", [2, 3, synth.DEFAULT_CONTEXT_FACTS])
def test_synth_answers_and_format(k):
    assert {e["op"] for e in synth.synth_examples("test", 100, seed=0)} == set(synth.DEFAULT_OPS)
    exs = synth.synth_examples("test", 300, seed=0, context_facts=k, ops=synth.OPS)
    assert {e["op"] for e in exs} == set(synth.OPS)
    for e in exs:
        n = _recompute(e["question"])
        assert n >= 0 and e["target"] == str(n)
        if e["op"].endswith("recall"):
            assert e["answer"] == f"#### {n}"                      # the recalled value, once
        else:                                                      # operands once, then the result
            a, sign, b, eq, res = e["answer"].split("\n")[0].split()
            assert (sign, eq, int(res)) == ("+" if e["op"].endswith("add") else "-", "=", n)
            assert e["answer"] == f"{a} {sign} {b} = {n}\n#### {n}" and (int(a) + int(b) if sign == "+" else int(a) - int(b)) == n
        assert scoring.score_gsm8k(" " + e["answer"], e["answer"]) == {"strict-match": 1.0,
                                                                       "flexible-extract": 1.0}
        assert len(_FACT.findall(e["question"])) == k
        assert synth.solve(e["question"]) == {k: e[k] for k in ("answer", "target", "op")}
    assert synth.format_prompt("Q") == "Question: Q\nAnswer:"


def test_synth_knobs():
    exs = synth.synth_examples("train", 50, seed=0, context_facts=4, ops="recall", max_value=3)
    assert all(e["op"] == "recall" and len(_FACT.findall(e["question"])) == 4 for e in exs)
    assert all(1 <= int(v) <= 3 for e in exs for _, v, _ in _FACT.findall(e["question"]))
    for bad in ({"context_facts": 1, "ops": "add"}, {"context_facts": 1, "ops": "pos-sub"}, {"context_facts": 999}, {"max_value": 10},
                {"ops": "mul"}):
        with pytest.raises(ValueError):
            synth.synth_examples("train", 5, **bad)
    with pytest.raises(ValueError):
        synth.synth_examples("dev", 5)


# ---------------------------------------------------------------------------------------- --data
def test_local_loader(tmp_path, problems):
    g = tmp_path / "g.jsonl"
    g.write_text("".join(json.dumps(r) + "\n" for r in gsm8k.load_gsm8k(limit=3)))
    assert load_local(g) == ("gsm8k", gsm8k.load_gsm8k(limit=3))
    h = tmp_path / "h.jsonl.gz"
    with gzip.open(h, "wt") as f:
        f.write("".join(json.dumps(p) + "\n" for p in problems[:2]))
    kind, rows = load_local(h)
    assert kind == "humaneval" and [r["task_id"] for r in rows] == ["HumanEval/0", "HumanEval/1"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n" + json.dumps(problems[0]) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_local(bad)
    with pytest.raises(ValueError):
        load_local(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------------------------- lm-eval
def _tasks_dir() -> str:
    from dllm_bench.accuracy.lm_eval_model import TASKS_DIR
    return str(TASKS_DIR)


def test_adapter_backend_plumbing():
    from dllm_bench.accuracy import lm_eval_model as ad

    calls = []

    def backend(prompts, gen_kwargs):
        calls.append((list(prompts), gen_kwargs))
        return [p.upper() + " STOP tail" for p in prompts]

    class Req:
        def __init__(self, ctx, kw):
            self.args = (ctx, kw)

    a, b = {"until": ["STOP"]}, {"until": ["TAIL"]}
    lm = ad.DllmBenchLM(backend=backend, max_batch=2)
    out = lm.generate_until([Req("x", a), Req("y", b), Req("z", a), Req("w", a)])
    assert out == ["X ", "Y STOP tail", "Z ", "W "]          # request order kept, cut at `until`
    assert [len(p) for p, _ in calls] == [2, 1, 1]            # grouped by gen_kwargs, max_batch=2
    with pytest.raises(NotImplementedError, match="generation-only"):
        lm.loglikelihood([])
    with pytest.raises(ValueError, match="no generation backend"):
        ad.make_backend({"model": "/some/checkpoint"})
    assert callable(ad.make_backend({"model": "oracle:synth"}))


def test_lm_eval_offline_oracle_scores_one():
    from lm_eval.api.registry import get_model

    from dllm_bench.accuracy.lm_eval_model import DllmBenchLM, run_lm_eval

    assert get_model("dllm_bench") is DllmBenchLM
    res = run_lm_eval(["dllm_gsm8k", "dllm_synth", "dllm_humaneval"], "oracle", limit=5)["results"]
    for t in ("dllm_gsm8k", "dllm_synth"):
        assert res[t]["exact_match,strict-match"] == 1.0 and res[t]["exact_match,flexible-extract"] == 1.0
    assert res["dllm_humaneval"]["pass@1,none"] == 1.0


def test_lm_eval_scores_equal_scoring_module():
    """Same completions scored by lm-eval (YAML filters + metric) and by workloads.tasks.scoring agree."""
    from dllm_bench.accuracy.lm_eval_model import run_lm_eval

    docs = gsm8k.load_gsm8k(limit=5)
    fakes = ["#### {n}", "The answer is {n}.", "#### 0\nso {n}", "${n}.", "nothing"]
    by_q = {d["question"]: (f.format(n=gsm8k.gold_number(d["answer"])), d["answer"])
            for d, f in zip(docs, fakes, strict=True)}

    def backend(prompts, gen_kwargs):
        return [by_q[p.rsplit("Question: ", 1)[1][: -len("\nAnswer:")]][0] for p in prompts]

    res = run_lm_eval("dllm_gsm8k", backend, limit=5, num_fewshot=0)["results"]["dllm_gsm8k"]
    ours = scoring.aggregate([scoring.score_gsm8k(c, a) for c, a in by_q.values()])
    assert res["exact_match,strict-match"] == pytest.approx(ours["strict-match"]) == 0.2
    assert res["exact_match,flexible-extract"] == pytest.approx(ours["flexible-extract"]) == 0.8


def test_bare_lm_eval_cli_finds_model_and_tasks(tmp_path):
    """`make install` writes dllm_bench_lm_eval.pth, so lm-eval's own CLI, with no --include_path
    and no wrapper, resolves `--model dllm_bench` and our offline tasks; lm-eval's built-in models
    stay registered next to ours."""
    import subprocess
    import sys
    import sysconfig
    from pathlib import Path

    pth = Path(sysconfig.get_paths()["purelib"]) / "dllm_bench_lm_eval.pth"
    if not pth.is_file():
        pytest.skip("dllm_bench_lm_eval.pth not installed (set up with `make install`)")
    exe = Path(sys.executable).parent / "lm_eval"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([str(exe), "--model", "dllm_bench", "--model_args", "model=oracle:gsm8k",
                        "--tasks", "dllm_gsm8k", "--limit", "2"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [line for line in p.stdout.splitlines() if "strict-match" in line]
    assert rows and rows[0].split("|")[7].strip() == "1"          # the oracle's answers score 1.0
    q = subprocess.run([sys.executable, "-c", "from lm_eval.api.registry import get_model, model_registry; "
                        "get_model('dummy'); print(sorted(k for k in model_registry.keys() if k in ('dllm_bench', 'hf')))"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert q.returncode == 0 and q.stdout.strip() == "['dllm_bench', 'hf']", q.stderr[-2000:]
