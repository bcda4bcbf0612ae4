"""Loaders and scorers for the YAML tasks beside this file (`!function utils.<name>`).

lm-eval imports this file by path and calls `custom_dataset(**metadata, **dataset_kwargs)`: the
metadata holds the YAML's own `metadata` (version, ...) plus whatever the run passes (CLI
`--metadata '{"synth_n": 100}'` or `TaskManager(metadata=...)`), so every loader takes **kwargs and
reads only its own prefixed keys. All data is local: nothing here touches the network.
"""
from __future__ import annotations

import datasets

from workloads.tasks import gsm8k, humaneval, synth
from workloads.tasks.local import load_local


def _as_dataset(rows: list[dict]) -> datasets.DatasetDict:
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def _gsm8k_rows(path) -> list[dict]:
    if path:
        _, rows = load_local(path, kind="gsm8k")
        return [{"question": r["question"], "answer": r["answer"]} for r in rows]
    return gsm8k.load_gsm8k()


def load_gsm8k(gsm8k_path: str | None = None, **_: object) -> datasets.DatasetDict:
    return _as_dataset(_gsm8k_rows(gsm8k_path))


def gsm8k_fewshot() -> list[dict]:
    """The 8 CoT exemplars (fewshot_config.samples), identical to gsm8k.build_prompt's."""
    return gsm8k.fewshot_docs()


def load_synth(synth_n: int = 500, synth_seed: int = 0,
               synth_context_facts: int = synth.DEFAULT_CONTEXT_FACTS, synth_ops: str = ",".join(synth.DEFAULT_OPS),
               synth_max_value: int = synth.DEFAULT_MAX_VALUE, synth_path: str | None = None,
               **_: object) -> datasets.DatasetDict:
    if synth_path:
        return _as_dataset(_gsm8k_rows(synth_path))
    rows = synth.synth_examples("test", int(synth_n), seed=int(synth_seed),
                                context_facts=int(synth_context_facts), ops=synth_ops,
                                max_value=int(synth_max_value))
    return _as_dataset(rows)


def load_humaneval(humaneval_path: str | None = None, **_: object) -> datasets.DatasetDict:
    if humaneval_path:
        _, problems = load_local(humaneval_path, kind="humaneval")
    else:
        problems = humaneval.load_problems()
    keys = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
    # canonical_solution is optional in local files; a missing one is only the (unused) target.
    return _as_dataset([{k: p.get(k, "") or "" for k in keys} for p in problems])


def humaneval_process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """pass@1 of the single greedy completion (already cut at `until` by the model adapter)."""
    completion = humaneval.truncate_completion(results[0])   # idempotent; guards other LMs
    return {"pass@1": float(humaneval.check(doc, completion, humaneval.DEFAULT_TIMEOUT))}
