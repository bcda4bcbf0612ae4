"""A trained model's own task as a serving workload (`--dataset task`): prompts drawn from the
test split of the task the checkpoint was trained on (synth, synth-cot; its training.json), in
the accuracy command's prompt format and tokenization, each decoding the answer window it was
trained with. With them a trained model serves the questions it has learned, so its
confidences, and with them what parallel decoding commits per step, are real rather than those
of random prompt ids.
"""
from __future__ import annotations

import json
from pathlib import Path

from dllm_bench.checkpoints.load import encode_prompt, load_tokenizer
from dllm_bench.checkpoints.presets import PRESETS as MODEL_PRESETS
from dllm_bench.checkpoints.store import asset_dir
from dllm_bench.errors import UserError
from workloads.arrivals import generate_arrivals
from workloads.serving import ServingRequest
from workloads.tasks import generated, synth

TASK_DATASET = "task"


def training_config(model: str | Path | None) -> dict:
    """The training config of a committed or trained checkpoint (`dllm-bench train`'s
    training.json), {} for anything else; never makes a preset's checkpoint."""
    if model is None:
        return {}
    path = Path(str(model)).expanduser()
    if not path.is_dir():
        preset = MODEL_PRESETS.get(str(model))
        if preset is None or not preset.asset:
            return {}
        path = asset_dir(preset)
    try:
        cfg = json.loads((path / "training.json").read_text(encoding="utf-8")).get("config") or {}
    except (OSError, ValueError):
        return {}
    return cfg if cfg.get("task") in generated.TASKS else {}


def task_workload(model_dir: Path, *, num_prompts: int | None, duration: float | None, rps: float,
                  arrivals: str, burstiness: float, seed: int, gen_length: int | None) -> list[ServingRequest]:
    """The first questions of the model's task's test split (seed `seed`), arriving as `arrivals`
    at `rps`; gen_length = `gen_length` or the model's answer window."""
    cfg = training_config(model_dir)
    if not cfg:
        raise UserError(f"--dataset {TASK_DATASET} serves a trained model's own task: {model_dir} has no "
                        "training.json of a generated task (synth, synth-cot)")
    tok = load_tokenizer(model_dir)
    if tok is None:
        raise UserError(f"--dataset {TASK_DATASET}: {model_dir} has no tokenizer files")
    times = generate_arrivals(arrivals, rps, burstiness=burstiness, num_prompts=num_prompts, duration=duration,
                              seed=seed)
    task = cfg["task"]
    docs = generated.examples(task, "test", len(times), seed=seed, context_facts=cfg.get("eval_facts"),
                              **generated.knobs_of(task, cfg))
    gen = gen_length or cfg.get("window") or generated.WINDOWS[task]
    out = []
    for i, (d, t) in enumerate(zip(docs, times, strict=True)):
        ids = encode_prompt(tok, synth.format_prompt(d["question"]), False)
        out.append(ServingRequest(request_id=f"{TASK_DATASET}-{i}", prompt_ids=ids, prompt_len=len(ids),
                                  output_len=gen, arrival=float(t), gen_length=int(gen),
                                  source=f"{task}:test:{i}", trace_prompt_len=len(ids), trace_output_len=gen))
    return out
