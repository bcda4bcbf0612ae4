"""One `dllm-bench frontier` run (docs/FRONTIER.md): every configuration (dllm_bench.frontier.configs)
on every model of the task, `--repeats` times, at `--concurrency`; then the rows, the Pareto front,
the goals' verdicts, the table and the plot.

Writes <result-dir>/<run-id>/: config.json, summary.json (rows, verdicts), metrics.csv (one row per
configuration), frontier.png, points/<config>/... (dllm_bench.frontier.rows). Runs in process: one
model load per model, a fresh system per (configuration, repeat) with one unmeasured warm-up
request; the repeats go round every configuration in turn, so a slow spell of the machine is
spread over the configurations rather than landing on one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import typer

from dllm_bench import console, inputs
from dllm_bench.accuracy import points as acc
from dllm_bench.checkpoints.load import load_config, load_tokenizer
from dllm_bench.device_defaults import resolve_device_options
from dllm_bench.errors import UserError
from dllm_bench.frontier import configs, output, pareto
from dllm_bench.frontier import rows as frows
from dllm_bench.frontier.measure import ConcurrentBackend, measure
from dllm_bench.results import atomic_write_csv, atomic_write_json, create_run
from dllm_bench.systems import decoding as system_decoding
from dllm_bench.systems.families import for_family
from dllm_bench.systems.inprocess import InProcess
from dllm_bench.systems.options import RunOptions, check_backends
from dllm_bench.systems.spec import ENGINE, retention_knobs
from dllm_bench.systems.step_budgets import AUTO
from engine import EngineConfig, SamplingParams
from workloads.tasks import generated, synth
from workloads.tasks.local import load_local

# The committed trained models of each generated task: all three training seeds.
TASK_MODELS = {"synth-cot": "synth-cot,synth-cot-s1,synth-cot-s2", "synth": "tiny-math,tiny-math-s1,tiny-math-s2"}
# A trained model named by its seed-0 name stands for its committed seeds (`--seeds` of them).
SEED_FAMILIES = {models.split(",")[0]: models.split(",") for models in TASK_MODELS.values()}
DEFAULT_TASK = "synth-cot"
# Engine limits of every configuration (a variant's own knobs win): the accuracy command's.
ENGINE_DEFAULTS = {"max_num_batched_tokens": 8192, "max_num_logits": 1024}
# Defaults sized for `dllm-bench frontier --model synth-cot` (three seeds) within 30 minutes on
# two CPU cores (docs/FRONTIER.md, "How long it takes"): the test split's first 200 questions
# (the accuracy protocol's), one torch thread (a 0.9M-parameter model's small ops stall two
# OpenMP threads on a shared 2-core machine, as serve's presets found).
LIMIT, CONCURRENCY, REPEATS, THREADS = 200, 8, 3, 1


@dataclass(frozen=True)
class FrontierOptions(RunOptions):
    """The options of `dllm-bench frontier` as given (CLI parameter names); None = the task's
    or the model's default."""
    task: str | None = None
    model: str | None = None
    systems: str | None = None
    decoding: str = configs.DEFAULT_DECODING
    concurrency: int = CONCURRENCY
    limit: int = LIMIT
    repeats: int = REPEATS
    split: str = "test"
    retention: float = 0.5
    seed: int = 0
    data: str | None = None
    num_fewshot: int | None = None
    device: str = "auto"
    memory_budget: str = "auto"
    threads: int | None = THREADS
    seeds: int = 3


@dataclass
class Plan:
    """The resolved run: everything checked before a run directory exists."""
    task: str
    models: list[str]
    paths: list[Path]
    configs: list[configs.Config]
    docs: list[dict] | None
    metadata: dict
    limit: int
    gen_length: int
    block_length: int
    knobs: dict


def resolve(o: FrontierOptions) -> Plan:
    if o.concurrency < 1 or o.repeats < 1:
        raise UserError("--concurrency and --repeats must be >= 1")
    if not 0 < o.retention <= 1:
        raise UserError(f"--retention must be in (0, 1], got {o.retention}")
    if o.split not in ("dev", "test"):
        raise UserError(f"--split must be dev or test, got {o.split!r}")
    if o.threads is not None and o.threads <= 0:
        raise UserError("--threads must be positive")
    limit = inputs.count(o.limit, "--limit", inputs.COUNT_OPTIONS["limit"])
    decodings = system_decoding.parse_list(o.decoding)
    cfgs = configs.plan(o.systems, decodings)
    task = o.task
    if task is not None and task not in acc.TASKS:
        raise UserError(f"--task must be one of {', '.join(acc.TASKS)}, got {task!r}")
    model = o.model or TASK_MODELS.get(task or DEFAULT_TASK)
    if model is None:
        raise UserError(f"--task {task} needs --model: a checkpoint directory (or several, comma-separated)")
    if not 1 <= o.seeds <= 3:
        raise UserError(f"--seeds must be 1, 2 or 3 (the committed training seeds), got {o.seeds}")
    models = [m.strip() for m in model.split(",") if m.strip()]
    if len(models) == 1 and models[0] in SEED_FAMILIES:
        models = SEED_FAMILIES[models[0]][: o.seeds]
    if not models or len(set(models)) != len(models):
        raise UserError(f"--model takes a comma list of distinct presets or directories, got {model!r}")
    paths = [inputs.checkpoint_dir(m, tokenizer=True, why="frontier scores text answers") for m in models]
    families = {load_config(p).model_type for p in paths}
    if len(families) > 1:
        raise UserError(f"--model: the models are of different families ({', '.join(sorted(families))})")
    # the configurations whose system has a version for the family (an unsupported one named in --systems: refused)
    kept = for_family([c.variant for c in cfgs], families.pop(), explicit=bool(o.systems))
    cfgs = [c for c in cfgs if c.variant in kept]
    infos = [acc.model_training_info(p).get("config", {}) for p in paths]
    task = task or infos[0].get("task") or DEFAULT_TASK
    if task not in acc.TASKS:
        raise UserError(f"--task must be one of {', '.join(acc.TASKS)}, got {task!r}")
    windows = {i.get("window") for i in infos}
    if len(windows) > 1:
        raise UserError(f"--model: the models were trained with different answer windows {sorted(map(str, windows))}")
    gen, block, _ = acc.TASK_SHAPES[task]
    window = windows.pop()
    if task in acc.GENERATED and window:
        gen = window                      # a trained model fills the answer window it saw in training
    block = min(block, gen)
    SamplingParams(gen_length=gen, block_length=block, steps=gen)
    if o.num_fewshot is not None and (task != "gsm8k" or not 0 <= o.num_fewshot <= 8):
        raise UserError("--num-fewshot applies to --task gsm8k only, and takes 0..8")
    docs, metadata = None, {}
    try:
        if o.data is not None:
            _, data_rows = load_local(inputs.input_file(o.data, "--data"),
                                      kind="humaneval" if task == "humaneval" else "gsm8k")
            metadata = {f"{task}_path": str(o.data)}
            if task in acc.GENERATED:
                docs = acc.local_synth_docs(data_rows, limit)
        elif task in acc.GENERATED:
            facts = infos[0].get("eval_facts") or synth.DEFAULT_CONTEXT_FACTS
            knobs = generated.knobs_of(task, infos[0]) if infos[0].get("task") == task else {}
            docs = acc.generated_docs(task, o.split, limit, o.seed, facts, knobs)
        elif o.split == "dev":
            raise UserError(f"--split dev with --task {task} needs --data (the built-in data is the test split)")
    except ValueError as e:
        raise UserError(str(e)) from None
    knobs = {"task": task, "split": o.split, "models": models, "model_dirs": [str(p) for p in paths],
             "configurations": [c.label for c in cfgs], "concurrency": o.concurrency, "limit": limit,
             "repeats": o.repeats, "retention": o.retention, "seed": o.seed, "gen_length": gen,
             "block_length": block, "steps": gen, "temperature": 0.0, "data": o.data, "num_fewshot": o.num_fewshot}
    return Plan(task, models, paths, cfgs, docs, metadata, limit, gen, block, knobs)


def _builder(cfg: configs.Config, src: InProcess, o: FrontierOptions, budget: int | None, block_length: int = 32):
    """A fresh system of `cfg` at the run's concurrency (the engine's running cap, a baseline's
    static batch). The engine's token and logit budgets: ENGINE_DEFAULTS on a CPU, scaled with the
    GPU on CUDA (dllm_bench.systems.step_budgets), a variant's knobs winning."""
    def build():
        if cfg.system == ENGINE:
            own = cfg.variant.knob_dict
            b = src.budgets(tokens=own.get("max_num_batched_tokens"), logits=own.get("max_num_logits", AUTO),
                            max_num_seqs=o.concurrency, block_length=block_length, budget_bytes=budget,
                            cpu=(ENGINE_DEFAULTS["max_num_batched_tokens"], ENGINE_DEFAULTS["max_num_logits"]))
            knobs = cfg.engine_knobs({"max_num_batched_tokens": b.max_num_batched_tokens,
                                      "max_num_logits": b.max_num_logits, "retention": o.retention,
                                      "max_num_seqs": o.concurrency, "ridge_rows": b.ridge_rows})
            try:
                ec = EngineConfig(**knobs, sampling=False, memory_budget=budget)
            except ValueError as e:
                raise UserError(f"system {cfg.variant.label!r}: {e}") from None
            return src.engine(ec, label=cfg.label)
        knobs = cfg.baseline_knobs(retention_knobs(o.retention))
        return src.baseline(cfg.system, batch=o.concurrency, knobs=knobs, label=cfg.label)
    return build


def frontier(o: FrontierOptions, *, result_dir: Path, run_id: str | None, as_json: bool) -> None:
    plan = resolve(o)
    dev = resolve_device_options(o.device, o.dtype, o.memory_budget)
    check_backends([c.variant for c in plan.configs], None, str(dev.device), dev.dtype)
    toks = [load_tokenizer(p) for p in plan.paths]
    if o.threads is not None:
        torch.set_num_threads(o.threads)
    knobs = {**plan.knobs, "dtype": dev.dtype, "device": str(dev.device), "memory_budget": dev.budget.bytes,
             "threads": torch.get_num_threads()}
    run_dir = create_run("frontier", knobs, name=f"frontier-{plan.task}", run_id=run_id, root=result_dir)
    con = console.console()
    con.print(f"[bold]dllm-bench frontier[/bold] {plan.task} ({o.split}) · {len(plan.configs)} configurations x "
              f"{len(plan.models)} model(s) x {o.repeats} repeat(s) · {plan.limit} questions · concurrency "
              f"{o.concurrency} → {run_dir}", highlight=False)
    meas: frows.Measurements = {}
    for m, path, tok in zip(plan.models, plan.paths, toks, strict=True):
        src = InProcess(str(path), dev.dtype, str(dev.device))
        for r in range(o.repeats):
            for i, cfg in enumerate(plan.configs):
                be = ConcurrentBackend(None, tok, cfg.point(o.retention), gen_length=plan.gen_length,
                                       block_length=plan.block_length, steps=plan.gen_length, seed=o.seed,
                                       decoding=cfg.decoding, show_progress=not as_json, concurrency=o.concurrency,
                                       label=f"{Path(m).name} r{r} [{i + 1}/{len(plan.configs)}] {cfg.label}",
                                       source=src, build=_builder(cfg, src, o, dev.budget.bytes, plan.block_length))
                x = meas[(cfg.slug, m, r)] = measure(be, plan.task, plan.docs, plan.limit, plan.metadata,
                                                     o.num_fewshot)
                frows.write_point(run_dir, cfg, m, meas, o.repeats)
                if not as_json:
                    con.print(f"  {Path(m).name} r{r} {cfg.label}: {x.result.correct}/{x.result.n} correct, "
                              f"{x.serving['output_throughput']:.1f} tok/s, TPF {x.serving['mean_tpf']:.2f}",
                              markup=False, highlight=False)
        src.release()
    rows = pareto.mark_front([frows.row(c, plan.models, meas, o.repeats) for c in plan.configs])
    verdicts = pareto.verdicts(rows, plan.task)
    title = (f"{plan.task} ({o.split}) · {', '.join(Path(m).name for m in plan.models)} · n={rows[0]['n']} · "
             f"concurrency {o.concurrency}")
    png = output.plot(rows, run_dir / "frontier.png", title)
    doc = {"run_dir": str(run_dir), "task": plan.task, "split": o.split, "models": plan.models, "n": plan.limit,
           "concurrency": o.concurrency, "repeats": o.repeats, "columns": list(output.COLUMNS), "rows": rows,
           "verdicts": verdicts, "plot": str(png)}
    atomic_write_json(run_dir / "summary.json", doc)
    atomic_write_csv(run_dir / "metrics.csv", pd.DataFrame(frows.csv_rows(rows)))
    if as_json:
        typer.echo(json.dumps(doc, default=str))
        return
    con.print(output.table(rows, f"Frontier: {title}", "tok/s = median [min–max] over repeats; accuracy pooled "
                           "over the models [Wilson 95 %]; dim = dominated"))
    for line in output.verdict_lines(verdicts):
        con.print(line, markup=False, highlight=False)
    con.print(f"plot: {png}\nresults: {run_dir}", markup=False, highlight=False)
