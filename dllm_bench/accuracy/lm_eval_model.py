"""lm-eval 0.4.13 integration: the `dllm_bench` model, pluggable generation backends, offline tasks.

A backend is `Callable[[list[str], dict], list[str]]`: prompts + lm-eval gen_kwargs (`until`,
`max_gen_toks`, `temperature`, ...) -> one completion per prompt; `make_backend(model_args)` picks
one from `BACKENDS` (an oracle, or the engine/baselines on a preset or checkpoint). lm-eval does
not discover third-party models, so either the .pth hook `make install` writes
(dllm_bench.accuracy.lm_eval_hook) registers this model when lm-eval is imported, or lm-eval runs
through this module (`main`), which registers it and adds our task directory. From Python:
`run_lm_eval("dllm_gsm8k", backend, limit=5)`. `--model_args`, tasks: docs/ACCURACY.md ("lm-eval").
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lm_eval
from lm_eval.__main__ import cli_evaluate
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.tasks import TaskManager

from dllm_bench.accuracy.backend import engine_backend
from dllm_bench.checkpoints.presets import PRESETS
from workloads.tasks import gsm8k, humaneval, synth
from workloads.tasks.local import load_local

TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
TASK_NAMES = ("dllm_gsm8k", "dllm_synth", "dllm_humaneval")
MODEL_NAME = "dllm_bench"

Backend = Callable[[list[str], dict], list[str]]
BackendFactory = Callable[[dict], Backend]


# --------------------------------------------------------------------------- oracle backend
def _question_of(prompt: str) -> str:
    """The question of the last "Question: ...\\nAnswer:" block (few-shot exemplars come first)."""
    q = prompt.rsplit("Question: ", 1)[-1]
    return q[: -len("\nAnswer:")] if q.endswith("\nAnswer:") else q


def _oracle_answerer(task: str, data: str | None) -> Callable[[str], str]:
    """prompt -> gold completion ("" when the prompt is not one of the task's)."""
    if task == "gsm8k" or (task == "synth" and data):
        rows = load_local(data, kind="gsm8k")[1] if data else gsm8k.load_gsm8k()
        gold = {r["question"]: r["answer"] for r in rows}
        return lambda prompt: (" " + gold[q]) if (q := _question_of(prompt)) in gold else ""
    if task == "synth":                # synth answers are a function of the question's own facts
        def solve(prompt: str) -> str:
            try:
                return " " + synth.solve(_question_of(prompt))["answer"]
            except ValueError:
                return ""
        return solve
    if task == "humaneval":
        problems = load_local(data, kind="humaneval")[1] if data else humaneval.load_problems()
        # keyed on the stripped prompt: lm-eval may trim the trailing newline of a context
        gold = {p["prompt"].rstrip(): p.get("canonical_solution", "") for p in problems}
        return lambda prompt: gold.get(prompt.rstrip(), "")
    raise ValueError(f"oracle task must be one of {ORACLE_TASKS}, got {task!r}")


ORACLE_TASKS = ("gsm8k", "synth", "humaneval")


def _oracle_backend(model_args: dict) -> Backend:
    """`model=oracle:<gsm8k|synth|humaneval>[,data=PATH]` (or `model=oracle` for all three): answers
    each prompt with its task's gold answer (HumanEval: the canonical solution), so a correct
    pipeline scores exactly 1.0. An unknown prompt gets "" (scored wrong), never an exception."""
    task = str(model_args.get("model", "")).partition(":")[2]
    if model_args.get("data") and not task:
        raise ValueError("oracle with data=PATH needs its task: model=oracle:<gsm8k|synth|humaneval>")
    answerers = [_oracle_answerer(t, model_args.get("data")) for t in ([task] if task else ORACLE_TASKS)]

    def answer(prompt: str) -> str:
        return next((a for f in answerers if (a := f(prompt))), "")

    return lambda prompts, gen_kwargs: [answer(p) for p in prompts]


def _engine_backend(model_args: dict) -> Backend:
    """`model=<preset|checkpoint dir>[,retention=0.1,selection=head,cache=...,system=...]`: the
    serving engine (or a baseline) on a real checkpoint; see dllm_bench.accuracy.backend.engine_backend."""
    return engine_backend(model_args)


def _is_checkpoint_spec(model: str) -> bool:
    """A preset name or an existing checkpoint directory (-> the engine backend by default)."""
    return model in PRESETS or (Path(model).expanduser() / "config.json").is_file()


# Extend this registry to add backends (the engine, baselines); keys are backend names.
BACKENDS: dict[str, BackendFactory] = {"oracle": _oracle_backend, "engine": _engine_backend}


def make_backend(model_args: dict) -> Backend:
    """The backend for `model_args`; ValueError for an unknown one. The factory in `BACKENDS` named
    by `model_args["backend"]`, else by the part of `model_args["model"]` before ":" (e.g.
    `model=oracle:gsm8k`); without `backend=`, a model that is a preset name or a checkpoint
    directory runs on the engine (`model=tiny-math,retention=0.1,selection=head`: sparse cache at
    r = 0.1, head-centric; no retention = the dense engine in exact mode; `system=sparse-dllm` etc.
    for baselines)."""
    model = str(model_args.get("model", ""))
    name = str(model_args.get("backend") or model.partition(":")[0])
    factory = BACKENDS.get(name)
    if factory is None and not model_args.get("backend") and model and _is_checkpoint_spec(model):
        factory = BACKENDS["engine"]
    if factory is None:
        raise ValueError(f"no generation backend {name!r} (from model_args {model_args}); available: "
                         f"{sorted(BACKENDS)} -- e.g. model=oracle:gsm8k. Engine backends register "
                         f"themselves in dllm_bench.accuracy.lm_eval_model.BACKENDS.")
    return factory(dict(model_args))


def truncate_at_stops(text: str, until: list[str] | str | None) -> str:
    """Cut at the earliest stop string: dLLMs generate a fixed-length canvas and are cut post hoc."""
    stops = [until] if isinstance(until, str) else list(until or [])
    cut = min((i for i in (text.find(s) for s in stops if s) if i != -1), default=len(text))
    return text[:cut]


# --------------------------------------------------------------------------- the lm-eval model
class DllmBenchLM(LM):
    """Generation-only lm-eval model over a backend. `model_args` go to `make_backend`, except
    `max_batch` (prompts per backend call; 0 = all requests sharing gen_kwargs in one call, so an
    engine can schedule them itself). lm-eval's own batch_size/device are accepted and ignored:
    the CLI default batch_size=1 would otherwise serialise a continuous-batching engine."""

    def __init__(self, backend: Backend | None = None, max_batch: int = 0, batch_size: Any = None,
                 max_batch_size: Any = None, device: Any = None, **model_args: Any) -> None:
        super().__init__()
        self.model_args = model_args
        self.backend = backend if backend is not None else make_backend(model_args)
        self.max_batch = int(max_batch)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        # lm-eval hands over the requests of *all* tasks at once; group by gen_kwargs so each
        # backend call has one set of generation settings, then restore the request order.
        args = [r.args for r in requests]
        groups: dict[str, list[int]] = {}
        for i, (_, gen_kwargs) in enumerate(args):
            groups.setdefault(json.dumps(gen_kwargs, sort_keys=True, default=str), []).append(i)
        out: list[str | None] = [None] * len(args)
        for idxs in groups.values():
            gen_kwargs = dict(args[idxs[0]][1])
            step = self.max_batch or len(idxs)
            for s in range(0, len(idxs), step):
                chunk = idxs[s: s + step]
                texts = self.backend([args[i][0] for i in chunk], dict(gen_kwargs))
                if len(texts) != len(chunk):
                    raise RuntimeError(f"backend returned {len(texts)} completions for {len(chunk)} prompts")
                for i, t in zip(chunk, texts, strict=True):
                    out[i] = truncate_at_stops(t, gen_kwargs.get("until"))
        return out  # type: ignore[return-value]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("dllm_bench is a generation-only model: loglikelihood tasks "
                                  "(multiple choice, perplexity) are not supported; use generate_until "
                                  "tasks such as dllm_gsm8k, dllm_synth, dllm_humaneval")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("dllm_bench is a generation-only model: loglikelihood_rolling "
                                  "(perplexity) is not supported")


# Registered only under the real module name: `python -m` runs this file as __main__ first and a
# second class under the same alias would make lm-eval's registry raise.
if __name__ != "__main__":
    DllmBenchLM = register_model(MODEL_NAME)(DllmBenchLM)


def run_lm_eval(task: str | list[str], backend: Backend | dict | str, limit: int | float | None = None,
                num_fewshot: int | None = None, metadata: dict | None = None,
                log_samples: bool = False) -> dict:
    """Evaluate our offline task(s) in-process; returns lm-eval's result dict (`res["results"][task]`
    has "exact_match,strict-match", "exact_match,flexible-extract" or "pass@1,none").

    `backend`: a Backend callable, a model_args dict, or a model spec string ("oracle:gsm8k").
    `metadata`: loader knobs, e.g. {"synth_n": 100, "gsm8k_path": "x.jsonl"} (see the YAMLs).
    """
    tasks = [task] if isinstance(task, str) else list(task)
    if callable(backend):
        lm = DllmBenchLM(backend=backend)
    else:
        lm = DllmBenchLM(**(backend if isinstance(backend, dict) else {"model": backend}))
    # include_defaults=False: skip indexing lm-eval's ~15k built-in tasks (~7 s), ours only.
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=metadata or {})
    res = lm_eval.simple_evaluate(
        model=lm, tasks=tasks, task_manager=tm, limit=limit, num_fewshot=num_fewshot,
        bootstrap_iters=0, log_samples=log_samples, confirm_run_unsafe_code=True,
        metadata=metadata or {},
    )
    if res is None:
        raise RuntimeError("lm_eval.simple_evaluate returned no results")
    return res


def main(argv: list[str] | None = None) -> None:
    """`python -m dllm_bench.accuracy.lm_eval_model <lm-eval run flags>`: lm-eval's CLI with our model
    registered and our task directory on the include path (the way without `make install`'s .pth:
    lm-eval 0.4.13 scans no entry points, so pyproject's `lm_eval` group alone registers nothing).
    Every `lm-eval run` flag works, e.g. `--model dllm_bench --model_args model=oracle:humaneval
    --tasks dllm_humaneval --confirm_run_unsafe_code --limit 5`; set HF_DATASETS_OFFLINE=1
    HF_HUB_OFFLINE=1 to be sure nothing is fetched."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--include_path" not in args and not any(a.startswith("--include_path=") for a in args):
        args += ["--include_path", str(TASKS_DIR)]
    sys.argv = ["lm-eval", *args]
    cli_evaluate()


if __name__ == "__main__":
    from dllm_bench.accuracy.lm_eval_model import main as _main  # the registered copy of this module

    _main()
