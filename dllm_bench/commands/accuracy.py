"""`dllm-bench accuracy`: accuracy per (selection, retention) of the engine's sparse KV cache, the
dense (r = 1, exact LLaDA) reference and optionally baseline systems (paper §6.4, Fig. 6).

Writes results/runs/<run-id>/ (config.json, summary.json, metrics.csv, points/<point>/
{summary.json, samples.jsonl}, fig6_accuracy_vs_retention.png for sweeps); prints a Rich table,
or one JSON document with --json. Progress bars (one per point, over finished samples) go to stderr.
"""
from __future__ import annotations

import json
from pathlib import Path

import typer

from dllm_bench import inputs
from dllm_bench.accuracy import points as acc
from dllm_bench.accuracy import report, seeds
from dllm_bench.accuracy.backend import PointBackend
from dllm_bench.accuracy.protocol import load_dev_choice
from dllm_bench.checkpoints.load import load_model, load_tokenizer
from dllm_bench.device_defaults import DeviceOptions, resolve_device_options
from dllm_bench.errors import UserError
from dllm_bench.results import create_run, results_root
from engine import SamplingParams
from workloads.tasks import generated, synth
from workloads.tasks.local import load_local


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
                   batch: int) -> tuple[DeviceOptions, dict]:
    """Device, dtype and the run's one memory budget (measured once, here, before a model is
    loaded), and the keywords every point's system is built with (accuracy.backend.point_system)."""
    opts = resolve_device_options(device, dtype, memory_budget)
    return opts, {"max_num_seqs": max_num_seqs, "batch": batch, "memory_budget": opts.budget.bytes}


def _fmt_pct(x: float) -> str:
    return f"{100 * x:.1f}"


def register(app: typer.Typer) -> None:
    @app.command()
    def accuracy(
        task: str | None = typer.Option(None, help="synth | synth-cot | gsm8k | humaneval (default: the model's training task, else synth)."),
        model: str = typer.Option("tiny-math", "--model", "-m", help="Preset name or HF LLaDA checkpoint directory; a comma list = several trained models (seeds) of one task, reported per seed and as mean ± spread."),
        split: str = typer.Option("test", help="test (reported figures) or dev (where choices are made): the generated tasks' own splits; with --data, what the file is."),
        dev_run: str | None = typer.Option(None, help="A dev-split run (id or dir) of the same task and models: its choice of --score-query per selection is recorded with this run."),
        retention: str = typer.Option("0.1,0.2,0.3,0.4,0.5", help="Retention ratio(s) r in (0, 1], comma list."),
        selection: str = typer.Option("head,uniform", help="Engine sparse selection(s): head, uniform."),
        score_query: str = typer.Option("mean", help="Which block queries score context tokens for selection: mean (upstream), max, or both (comma list)."),
        system: str = typer.Option("engine", help="engine | llada | fast-dllm | dllm-cache | sparse-dllm (comma list)."),
        limit: int = typer.Option(200, help="Samples per point (synth, synth-cot: the first N of the split)."),
        gen_length: int | None = typer.Option(None, help="Tokens generated (default: a trained model's answer window on synth, else the task's)."),
        block_length: int | None = typer.Option(None, help="Block length (default: the task's)."),
        steps: int | None = typer.Option(None, help="Denoising steps (default: the task's; one token per step)."),
        seed: int = typer.Option(0, help="synth test-slice seed; request seed."),
        synth_facts: int | None = typer.Option(None, help="synth / synth-cot context_facts (default: the model's training probe, else 16)."),
        data: str | None = typer.Option(None, help="Local data instead of the built-in: a JSONL(.gz) file or a Hugging Face datasets directory (save_to_disk); GSM8K-shaped (question, answer with '#### N') for gsm8k/synth, HumanEval-shaped for humaneval."),
        num_fewshot: int | None = typer.Option(None, help="gsm8k: CoT exemplars in the prompt, 0..8 (default 8)."),
        dtype: str | None = typer.Option(None, help="float64 | float32 | bfloat16 (default: bfloat16 on CUDA, float32 on CPU)"),
        device: str = typer.Option("auto", help="auto | cpu | cuda"),
        memory_budget: str = typer.Option("auto", "--memory-budget", help="Engine points: bytes for weights+activations+KV "
                                          "(e.g. 20GiB), auto = free GPU memory x 0.9 measured once at the start "
                                          "(on CPU: no budget), or none."),
        threads: int | None = typer.Option(None, help="torch threads (CPU)."),
        max_num_seqs: int = typer.Option(64, help="Engine: concurrent requests."),
        batch: int = typer.Option(32, help="Baselines: static batch size."),
        r1: bool = typer.Option(True, "--r1/--no-r1", help="Also run the engine's sparse cache at r = 1.0."),
        chat: bool = typer.Option(False, "--chat/--no-chat", help="Wrap prompts in the tokenizer's chat template."),
        run_id: str | None = typer.Option(None, help="Run directory name (default: timestamp-accuracy-<task>)."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    ) -> None:
        """Accuracy vs KV retention: head-centric vs uniform selection, dense reference, baselines."""
        import torch

        from dllm_bench.accuracy.evaluate import eval_lm_eval_point, eval_synth_point

        run_id = inputs.run_id(run_id)
        if max_num_seqs <= 0 or batch <= 0:
            raise UserError("--max-num-seqs and --batch must be positive")
        opts, system_kw = device_options(device, dtype, memory_budget, max_num_seqs, batch)  # before any run dir
        dtype = opts.dtype
        retentions = _floats(retention, "--retention")
        if any(not 0 < r <= 1 for r in retentions):
            raise UserError(f"--retention values must be in (0, 1], got {retention!r}")
        retentions = sorted(dict.fromkeys(retentions))
        selections = _names(selection, "--selection", acc.SELECTIONS)
        systems = _names(system, "--system", acc.SYSTEMS)
        score_queries = _names(score_query, "--score-query", acc.SCORE_QUERIES)
        if limit <= 0:
            raise UserError("--limit must be positive")
        if threads is not None:
            if threads <= 0:
                raise UserError("--threads must be positive")
            torch.set_num_threads(threads)
        if task is not None and task not in acc.TASKS:
            raise UserError(f"--task must be one of {', '.join(acc.TASKS)}, got {task!r}")
        models = [m.strip() for m in model.split(",") if m.strip()]
        if not models or len(set(models)) != len(models):
            raise UserError(f"--model takes a comma list of distinct presets or directories, got {model!r}")
        if split not in ("dev", "test"):
            raise UserError(f"--split must be dev or test, got {split!r}")
        paths = [inputs.checkpoint_dir(m, tokenizer=True, why="accuracy needs text prompts") for m in models]
        infos = [acc.model_training_info(p) for p in paths]
        tcfg = infos[0].get("config", {})
        task = task or tcfg.get("task") or "synth"
        if task not in acc.TASKS:
            raise UserError(f"--task must be one of {', '.join(acc.TASKS)}, got {task!r}")
        if split == "dev" and task not in acc.GENERATED and data is None:
            raise UserError(f"--split dev with --task {task} needs --data (a dev set, e.g. questions of GSM8K's "
                            "train split): the built-in data is the test split")
        windows = {i.get("config", {}).get("window") for i in infos}
        if len(windows) > 1:
            raise UserError(f"--model: the models were trained with different answer windows {sorted(map(str, windows))}")
        g0, b0, s0 = acc.TASK_SHAPES[task]
        window = windows.pop()
        if task in acc.GENERATED and window:
            g0 = window                       # a trained model fills the answer window it saw in training
        gen_length = gen_length or g0
        block_length = block_length or min(b0, gen_length)
        steps = steps or gen_length
        try:
            SamplingParams(gen_length=gen_length, block_length=block_length, steps=steps)
        except ValueError as e:
            raise UserError(str(e)) from None

        facts = synth_facts or tcfg.get("eval_facts") or synth.DEFAULT_CONTEXT_FACTS
        task_knobs = generated.knobs_of(task, tcfg) if task in acc.GENERATED and tcfg.get("task") == task else {}
        if num_fewshot is not None and (task != "gsm8k" or not 0 <= num_fewshot <= 8):
            raise UserError("--num-fewshot applies to --task gsm8k only, and takes 0..8")
        docs, metadata, chosen = None, {}, None
        try:
            if data is not None:

                _, rows = load_local(data, kind="humaneval" if task == "humaneval" else "gsm8k")
                metadata = {f"{task}_path": str(data)}
                if task in acc.GENERATED:
                    docs = acc.local_synth_docs(rows, limit)
            elif task in acc.GENERATED:
                docs = acc.generated_docs(task, split, limit, seed, facts, task_knobs)
            if dev_run is not None:

                d = Path(dev_run) if Path(dev_run).is_dir() else results_root() / dev_run
                chosen = load_dev_choice(d, task, models)
        except ValueError as e:
            raise UserError(str(e)) from None
        toks = [load_tokenizer(p) for p in paths]
        if any(t is None for t in toks):
            raise UserError(f"{paths[toks.index(None)]} has no tokenizer files: accuracy needs text prompts")
        points = acc.plan_points(systems, selections, retentions, include_r1=r1, score_queries=score_queries)
        knobs = dict(task=task, model=model, models=models, model_dirs=[str(p) for p in paths],
                     training_seeds=[i.get("config", {}).get("seed") for i in infos], systems=systems,
                     selections=selections, retentions=retentions, score_queries=score_queries, limit=limit,
                     gen_length=gen_length, block_length=block_length, steps=steps, seed=seed, dtype=dtype,
                     device=str(opts.device), memory_budget=opts.budget.bytes,
                     memory_budget_source=opts.budget.to_dict(), threads=torch.get_num_threads(),
                     max_num_seqs=max_num_seqs, batch=batch,
                     chat=chat, temperature=0.0, remasking="low_confidence", points=[p.name for p in points])
        if data is not None:
            knobs.update(data=str(data), data_rows=len(rows), split=split)
        elif task in acc.GENERATED:
            knobs["split"] = split
            knobs[task] = dict(split=split, seed=seed, n=limit, context_facts=facts, **task_knobs)
        else:
            knobs["split"] = "test"
        if chosen:
            knobs["dev_choice"] = chosen
        if task == "gsm8k":
            knobs["num_fewshot"] = 8 if num_fewshot is None else num_fewshot
        run_dir = create_run("accuracy", knobs, name=f"accuracy-{task}-{knobs['split']}", run_id=run_id)

        results = []
        extra = {"task": task, "model": model, "models": models, "split": knobs["split"]}
        if chosen:
            extra["dev_choice"] = chosen
        for m, tok in zip(models, toks, strict=True):
            mdl = load_model(m, dtype, str(opts.device))
            label = m if len(models) > 1 else ""
            dense_acc = None
            for i, p in enumerate(points):
                backend = PointBackend(mdl, tok, p, gen_length=gen_length, block_length=block_length, steps=steps,
                                           seed=seed, chat=chat, system_kw=system_kw,
                                           show_progress=not json_out,
                                           label=f"{label + ' ' if label else ''}[{i + 1}/{len(points)}] {p.name}")
                try:
                    if task in acc.GENERATED:
                        res = eval_synth_point(backend, docs)
                    else:
                        res = eval_lm_eval_point(task, backend, limit, metadata=metadata, num_fewshot=num_fewshot)
                except ValueError as e:     # a request that can never run (too long for the model, ...)
                    raise UserError(f"{p.name}: {e}") from None
                res.model = label
                if p.role == "dense":
                    dense_acc = res.accuracy
                results.append(res)
                report.write_point(run_dir, res, dense_acc)
                report.write_run_tables(run_dir, results, {**extra, "metric": res.metric})
                if not json_out:
                    typer.echo(f"  {label + ' ' if label else ''}{p.name:>16}: {res.correct}/{res.n} = "
                               f"{_fmt_pct(res.accuracy)}% [{_fmt_pct(res.ci_low)}, {_fmt_pct(res.ci_high)}]  "
                               f"({res.elapsed_s:.1f}s)", err=True)
            del mdl
        plot = None
        if sum(1 for r in results if r.point.retention < 1.0) >= 2:
            plot = report.plot_fig6(results, run_dir / "fig6_accuracy_vs_retention.png",
                                    f"{task} ({knobs['split']}) · {model} · n={results[0].n} · {results[0].metric}")
        summary = json.loads((run_dir / "summary.json").read_text())
        if json_out:
            typer.echo(json.dumps({"run_dir": str(run_dir), "task": task, "model": model, "models": models,
                                   "split": knobs["split"], "n": results[0].n, "metric": results[0].metric,
                                   "points": summary["points"], "seeds": summary.get("seeds"),
                                   "analysis": summary["analysis"], "dev_choice": chosen,
                                   "plot": str(plot) if plot else None}))
            return
        _print_table(results, summary, task, model, run_dir, plot)


def _print_table(results, summary, task, model, run_dir, plot) -> None:
    """The run's table: one row per point; with several models the accuracy is their mean, the CI
    the Wilson interval of the pooled counts, then the spread across seeds and each seed."""
    import shutil

    from rich.console import Console
    from rich.table import Table


    con = Console(width=shutil.get_terminal_size((120, 24)).columns)   # 120 when not a terminal
    spread = seeds.spreads(results)
    several = any(len(s.models) > 1 for s in spread.values())
    pooled = seeds.pooled(results)
    dense = pooled[0]
    other = next(iter(dense.other), None)
    n_each = results[0].n
    who = f"{len(spread[dense.point.name].models)} models, " if several else ""
    t = Table(title=f"accuracy · {task} ({summary.get('split', 'test')}) · {model} · {who}n = {n_each} per point"
                    f"{' and model' if several else ''} · {dense.metric} · Wilson 95% CI")
    cols = [("point", "left"), ("system", "left"), ("r", "right"), ("correct", "right"), ("acc %", "right"),
            ("95% CI", "right")]
    cols += [("seed sd", "right"), ("seed min-max", "right"), ("per seed %", "left")] if several else []
    cols += [("flex %", "right")] if other else []
    cols += [("/dense", "right"), ("s", "right")]
    for c, j in cols:
        t.add_column(c, justify=j, no_wrap=True)
    for r in pooled:
        p, sp = r.point, spread[r.point.name]
        sysname = p.system if p.system != "engine" else f"engine:{p.cache}"
        cells = [p.name, sysname, f"{p.retention:g}", f"{r.correct}/{r.n}", _fmt_pct(r.accuracy),
                 f"{_fmt_pct(r.ci_low)}-{_fmt_pct(r.ci_high)}"]
        if several:
            cells += [_fmt_pct(sp.sd), f"{_fmt_pct(sp.low)}-{_fmt_pct(sp.high)}",
                      " ".join(_fmt_pct(a) for a in sp.accuracies)]
        if other:
            cells.append(_fmt_pct(r.other[other]["accuracy"]))
        cells += [f"{r.accuracy / dense.accuracy:.2f}" if dense.accuracy else "-", f"{r.elapsed_s:.0f}"]
        t.add_row(*cells, style="bold" if p.role == "dense" else None)
    con.print(t)
    analysis = summary.get("analysis", {})
    for sel in ("head", "uniform", "head-max", "uniform-max", "sparse-dllm"):
        a = analysis.get(sel)
        if a:
            m = a["min_retention_95pct_dense"]
            con.print(f"{sel}: smallest r reaching 95% of dense ({_fmt_pct(analysis['target_95'])}%): "
                      f"{m if m is not None else 'none of the swept r'}")
    for sel, c in (summary.get("dev_choice") or {}).get("choice", {}).items():
        con.print(f"{sel}: score_query chosen on dev run {summary['dev_choice']['dev_run']}: {c['score_query']}")
    con.print(f"[dim]run: {run_dir}" + (f" · figure: {plot}" if plot else "") + "[/dim]")
