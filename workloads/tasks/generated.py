"""The generated tasks a model can be trained and evaluated on (`synth`, `synth-cot`): one call
per (task, split, n, seed, knobs), so training, probes and `dllm-bench accuracy` draw from the
same definitions. Knobs a task does not take are ignored (e.g. `ops` for synth-cot)."""
from __future__ import annotations

from workloads.tasks import synth, synth_cot

TASKS: tuple[str, ...] = ("synth", "synth-cot")
# Answer window (answer + EOS padding) a model of the task is trained and decoded with.
WINDOWS = {"synth": 16, "synth-cot": 32}
format_prompt = synth.format_prompt            # both use GSM8K's "Question: ...\nAnswer:"


def check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def knobs_of(task: str, knobs: dict) -> dict:
    """The subset of `knobs` (a training config or a run's settings) that `task` takes."""
    check_task(task)
    names = ("ops", "max_value") if task == "synth" else ("needles", "max_value")
    return {k: knobs[k] for k in names if knobs.get(k) is not None}


def examples(task: str, split: str, n: int, seed: int = 0, context_facts: int | None = None,
             **knobs) -> list[dict]:
    """`n` examples of `task`'s `split` (train | dev | test), GSM8K-shaped dicts."""
    kw = knobs_of(task, knobs)
    if context_facts is not None:
        kw["context_facts"] = context_facts
    if task == "synth":
        return synth.synth_examples(split, n, seed=seed, **kw)
    return synth_cot.examples(split, n, seed=seed, **kw)


def solve(task: str, question: str) -> dict:
    check_task(task)
    return (synth.solve if task == "synth" else synth_cot.solve)(question)
