"""One `dllm-bench accuracy` run (paper §6.4, Fig. 6; docs/ACCURACY.md): accuracy per (selection,
retention) of the engine's sparse KV cache, the dense (r = 1, exact mode) reference and
optionally baseline systems.

Writes <result-dir>/<run-id>/ (config.json, summary.json, metrics.csv, points/<point>/
{summary.json, samples.jsonl}, fig6_accuracy_vs_retention.png for sweeps); prints a Rich table
with the scoring rule and the dev split's choice, or one JSON document with --json. Progress
bars (one per point, over finished samples) go to stderr.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import typer

from dllm_bench import inputs
from dllm_bench.accuracy import points as acc
from dllm_bench.accuracy import report
from dllm_bench.accuracy.backend import PointBackend
from dllm_bench.accuracy.evaluate import eval_lm_eval_point, eval_synth_point
from dllm_bench.accuracy.protocol import UPSTREAM_RULE, load_dev_choice
from dllm_bench.checkpoints.load import load_tokenizer
from dllm_bench.device_defaults import DeviceOptions, cuda_graphs_on, resolve_device_options
from dllm_bench.errors import UserError
from dllm_bench.results import create_run
from dllm_bench.systems import decoding as system_decoding
from dllm_bench.systems.build import rank_threads as rank_threads_of
from dllm_bench.systems.inprocess import InProcess
from dllm_bench.systems.options import RunOptions, parallel_only
from engine import SamplingParams
from engine.decoding import FIXED
from workloads.tasks import generated, synth
from workloads.tasks.local import load_local

# The GSM8K-shaped task (worked multi-step answers) is the default: on the short-answer `synth`
# task the mean-query rule's verdict is the opposite of synth-cot's and of the paper's setting
# (docs/ACCURACY.md), so a bare `dllm-bench accuracy` must not read it.
DEFAULT_TASK = "synth-cot"
# The committed model trained on each generated task; any other task starts from tiny-math.
TASK_MODELS = {"synth": "tiny-math", "synth-cot": "synth-cot"}
RULES = {"mean": "the block's queries averaged, then each context token scored (dLLM-Serve's and "
                 "Sparse-dLLM's code: the paper's rule)",
         "max": "each context token scored by the block query that wants it most"}


@dataclass(frozen=True)
class AccuracyOptions(RunOptions):
    """The options of `dllm-bench accuracy` as given (names are the CLI parameters'); None = the
    task's or the model's default. The run options (device, dtype, ...) are RunOptions'."""
    task: str | None = None
    model: str | None = None
    split: str = "test"
    dev_run: str | None = None
    retention: str = "0.1,0.2,0.3,0.4,0.5"
    selection: str = "head,uniform"
    score_query: str = "mean"
    system: str = "engine"
    limit: int = 200
    gen_length: int | None = None
    block_length: int | None = None
    steps: int | None = None
    seed: int = 0
    synth_facts: int | None = None
    data: str | None = None
    num_fewshot: int | None = None
    device: str = "auto"
    memory_budget: str = "auto"
    max_num_seqs: int = 64
    batch: int = 32
    r1: bool = True
    chat: bool = False
    decoding: str = FIXED


def _floats(spec: str, flag: str) -> list[float]:
    try:
        vals = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated numbers, got {spec!r}") from None
    if not vals:
        raise UserError(f"{flag} is empty")
    return vals


def _names(spec: str, flag: str, allowed: tuple[str, ...]) -> list[str]:
    vals = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [v for v in vals if v not in allowed]
    if not vals or bad:
        raise UserError(f"{flag} takes a comma list of {', '.join(allowed)}; got {spec!r}")
    return list(dict.fromkeys(vals))


def device_options(device: str, dtype: str | None, memory_budget: str, max_num_seqs: int,
                   batch: int, cuda_graphs: bool | None = None) -> tuple[DeviceOptions, dict]:
    """Device, dtype and the run's one memory budget (measured once, here, before a model is
    loaded), and the keywords every point's system is built with (accuracy.backend.point_system):
    the engine's CUDA graphs resolved for the device (on for CUDA unless --no-cuda-graphs)."""
    opts = resolve_device_options(device, dtype, memory_budget)
    return opts, {"max_num_seqs": max_num_seqs, "batch": batch, "memory_budget": opts.budget.bytes,
                  "cuda_graphs": cuda_graphs_on(cuda_graphs, opts.device)}


def protocol_lines(score_queries: list[str], chosen: dict | None) -> list[str]:
    """What the figures are read under: each scoring rule measured, and what the dev split chose
    (or that no dev run was given, so the verdict stands under the upstream rule)."""
    lines = [f"scoring rule {q}: {RULES[q]}" for q in score_queries]
    if chosen:
        picks = ", ".join(f"{sel}: {c['score_query']}" for sel, c in chosen["choice"].items())
        lines.append(f"dev split (run {chosen['dev_run']}) chose {picks}")
    else:
        lines.append(f"dev split: no choice made (no --dev-run), so the verdict is read under the upstream rule "
                     f"({UPSTREAM_RULE}); to choose, run `--split dev --score-query mean,max --run-id DEV`, then "
                     "this command with `--score-query mean,max --dev-run DEV`")
    return lines


def ranks_text(res, tp: int) -> str:
    """Where a point ran, in a tensor-parallel run's lines (nothing in a one-device run's)."""
    n = res.tensor_parallel_size or 1
    return parallel_only(tp, parallel_only(n, f" · {n} ranks", " · one device (baseline)"))


def decoding_text(res) -> str:
    """What a point decoded with, and the tokens per forward it got (a --decoding run's lines)."""
    if res.decoding_note:
        return " · fixed (no parallel decoding upstream)"
    return f" · {res.decoding}, TPF {res.decoding_stats.get('tpf_mean') or 0:.2f}"


def accuracy(o: AccuracyOptions, *, result_dir: Path, run_id: str | None, as_json: bool) -> None:
    """Check every option (before any run directory), then measure, write and print each point."""
    if o.max_num_seqs <= 0 or o.batch <= 0:
        raise UserError("--max-num-seqs and --batch must be positive")
    dev_opts, system_kw = device_options(o.device, o.dtype, o.memory_budget, o.max_num_seqs, o.batch, o.cuda_graphs)
    dtype = dev_opts.dtype
    decoding = system_decoding.parse(o.decoding)
    retentions = _floats(o.retention, "--retention")
    if any(not 0 < r <= 1 for r in retentions):
        raise UserError(f"--retention values must be in (0, 1], got {o.retention!r}")
    retentions = sorted(dict.fromkeys(retentions))
    selections = _names(o.selection, "--selection", acc.SELECTIONS)
    systems = _names(o.system, "--system", acc.SYSTEMS)
    score_queries = _names(o.score_query, "--score-query", acc.SCORE_QUERIES)
    limit = inputs.count(o.limit, "--limit", inputs.COUNT_OPTIONS["limit"])
    if o.threads is not None:
        if o.threads <= 0:
            raise UserError("--threads must be positive")
        torch.set_num_threads(o.threads)
    tp = 1 if o.tensor_parallel_size is None else o.tensor_parallel_size
    if tp < 1:
        raise UserError(f"--tensor-parallel-size must be >= 1, got {tp}")
    task = o.task
    if task is not None and task not in acc.TASKS:
        raise UserError(f"--task must be one of {', '.join(acc.TASKS)}, got {task!r}")
    model = o.model if o.model is not None else TASK_MODELS.get(task or DEFAULT_TASK, "tiny-math")
    models = [m.strip() for m in model.split(",") if m.strip()]
    if not models or len(set(models)) != len(models):
        raise UserError(f"--model takes a comma list of distinct presets or directories, got {model!r}")
    split = o.split
    if split not in ("dev", "test"):
        raise UserError(f"--split must be dev or test, got {split!r}")
    paths = [inputs.checkpoint_dir(m, tokenizer=True, why="accuracy needs text prompts") for m in models]
    infos = [acc.model_training_info(p) for p in paths]
    # Each checkpoint's systems (a size that cannot run is one error here, before anything runs);
    # the process's threads are shared out among an engine point's ranks (baselines keep them all).
    sources = [InProcess(str(p), dtype, str(dev_opts.device), tp, in_turn=True) for p in paths]
    rank_threads = rank_threads_of(tp)
    tcfg = infos[0].get("config", {})
    task = task or tcfg.get("task") or DEFAULT_TASK
    if task not in acc.TASKS:
        raise UserError(f"--task must be one of {', '.join(acc.TASKS)}, got {task!r}")
    if split == "dev" and task not in acc.GENERATED and o.data is None:
        raise UserError(f"--split dev with --task {task} needs --data (a dev set, e.g. questions of GSM8K's "
                        "train split): the built-in data is the test split")
    windows = {i.get("config", {}).get("window") for i in infos}
    if len(windows) > 1:
        raise UserError(f"--model: the models were trained with different answer windows {sorted(map(str, windows))}")
    g0, b0, _ = acc.TASK_SHAPES[task]
    window = windows.pop()
    if task in acc.GENERATED and window:
        g0 = window                       # a trained model fills the answer window it saw in training
    gen_length = o.gen_length or g0
    block_length = o.block_length or min(b0, gen_length)
    steps = o.steps or gen_length
    try:
        SamplingParams(gen_length=gen_length, block_length=block_length, steps=steps)
    except ValueError as e:
        raise UserError(str(e)) from None

    facts = o.synth_facts or tcfg.get("eval_facts") or synth.DEFAULT_CONTEXT_FACTS
    task_knobs = generated.knobs_of(task, tcfg) if task in acc.GENERATED and tcfg.get("task") == task else {}
    if o.num_fewshot is not None and (task != "gsm8k" or not 0 <= o.num_fewshot <= 8):
        raise UserError("--num-fewshot applies to --task gsm8k only, and takes 0..8")
    docs, metadata, chosen, rows = None, {}, None, []
    try:
        if o.data is not None:
            _, rows = load_local(o.data, kind="humaneval" if task == "humaneval" else "gsm8k")
            metadata = {f"{task}_path": str(o.data)}
            if task in acc.GENERATED:
                docs = acc.local_synth_docs(rows, limit)
        elif task in acc.GENERATED:
            docs = acc.generated_docs(task, split, limit, o.seed, facts, task_knobs)
        if o.dev_run is not None:
            d = Path(o.dev_run) if Path(o.dev_run).is_dir() else result_dir / o.dev_run
            chosen = load_dev_choice(d, task, models)
    except ValueError as e:
        raise UserError(str(e)) from None
    toks = [load_tokenizer(p) for p in paths]
    if any(t is None for t in toks):
        raise UserError(f"{paths[toks.index(None)]} has no tokenizer files: accuracy needs text prompts")
    points = acc.plan_points(systems, selections, retentions, include_r1=o.r1, score_queries=score_queries)
    knobs = dict(task=task, model=model, models=models, model_dirs=[str(p) for p in paths],
                 training_seeds=[i.get("config", {}).get("seed") for i in infos], systems=systems,
                 selections=selections, retentions=retentions, score_queries=score_queries, limit=limit,
                 gen_length=gen_length, block_length=block_length, steps=steps, seed=o.seed, dtype=dtype,
                 device=str(dev_opts.device), memory_budget=dev_opts.budget.bytes,
                 memory_budget_source=dev_opts.budget.to_dict(), threads=torch.get_num_threads(),
                 max_num_seqs=o.max_num_seqs, batch=o.batch, cuda_graphs=system_kw["cuda_graphs"],
                 chat=o.chat, temperature=0.0, remasking="low_confidence", decoding=str(decoding),
                 tensor_parallel_size=tp, points=[p.name for p in points])
    knobs.update(parallel_only(tp, {"threads_per_rank": rank_threads}, {}))
    if o.data is not None:
        knobs.update(data=str(o.data), data_rows=len(rows), split=split)
    elif task in acc.GENERATED:
        knobs["split"] = split
        knobs[task] = dict(split=split, seed=o.seed, n=limit, context_facts=facts, **task_knobs)
    else:
        knobs["split"] = "test"
    if chosen:
        knobs["dev_choice"] = chosen
    if task == "gsm8k":
        knobs["num_fewshot"] = 8 if o.num_fewshot is None else o.num_fewshot
    run_dir = create_run("accuracy", knobs, name=f"accuracy-{task}-{knobs['split']}", run_id=run_id,
                         root=result_dir)

    results = []
    extra = {"task": task, "model": model, "models": models, "split": knobs["split"], "decoding": str(decoding)}
    if chosen:
        extra["dev_choice"] = chosen
    for m, tok, src in zip(models, toks, sources, strict=True):
        label = m if len(models) > 1 else ""
        dense_acc = None
        for i, p in enumerate(points):
            backend = PointBackend(None, tok, p, gen_length=gen_length, block_length=block_length, steps=steps,
                                   seed=o.seed, chat=o.chat, system_kw=system_kw, show_progress=not as_json,
                                   decoding=decoding, source=src,
                                   label=f"{label + ' ' if label else ''}[{i + 1}/{len(points)}] {p.name}")
            try:
                if task in acc.GENERATED:
                    res = eval_synth_point(backend, docs)
                else:
                    res = eval_lm_eval_point(task, backend, limit, metadata=metadata, num_fewshot=o.num_fewshot)
            except ValueError as e:     # a request that can never run (too long for the model, ...)
                raise UserError(f"{p.name}: {e}") from None
            res.model = label
            res.tensor_parallel_size = parallel_only(tp, backend.tensor_parallel_size, None)
            if p.role == "dense":
                dense_acc = res.accuracy
            results.append(res)
            report.write_point(run_dir, res, dense_acc)
            report.write_run_tables(run_dir, results, {**extra, "metric": res.metric})
            if not as_json:
                typer.echo(f"  {label + ' ' if label else ''}{p.name:>16}: {res.correct}/{res.n} = "
                           f"{report.pct(res.accuracy)}% [{report.pct(res.ci_low)}, {report.pct(res.ci_high)}]  "
                           f"({res.elapsed_s:.1f}s){decoding_text(res) if not decoding.fixed else ''}"
                           f"{ranks_text(res, tp)}", err=True)
        src.release()
    plot = None
    if sum(1 for r in results if r.point.retention < 1.0) >= 2:
        plot = report.plot_fig6(results, run_dir / "fig6_accuracy_vs_retention.png",
                                f"{task} ({knobs['split']}) · {model} · n={results[0].n} · {results[0].metric}")
    summary = json.loads((run_dir / "summary.json").read_text())
    protocol = protocol_lines(score_queries, chosen)
    if not decoding.fixed:
        protocol.append(f"decoding {decoding}: the engine runs it, Fast-dLLM under its threshold/factor rule; "
                        "a system without the rule upstream runs fixed (its rows say decoding fixed)")
    protocol.extend(parallel_only(tp, [
        f"tensor parallelism: every engine point (the dense reference too) on {tp} ranks of its own, "
        f"{rank_threads} thread(s) each on a CPU, started for the point and stopped after it; baselines on one device"],
        []))
    if as_json:
        typer.echo(json.dumps({"run_dir": str(run_dir), "task": task, "model": model, "models": models,
                               "split": knobs["split"], "n": results[0].n, "metric": results[0].metric,
                               "tensor_parallel_size": tp,
                               "points": summary["points"], "seeds": summary.get("seeds"),
                               "analysis": summary["analysis"], "dev_choice": chosen,
                               "scoring_rules": {q: RULES[q] for q in score_queries}, "protocol": protocol,
                               "plot": str(plot) if plot else None}))
        return
    report.print_table(results, summary, task, model, run_dir, plot, protocol)
