"""`dllm-bench accuracy`: accuracy per (selection, retention) of the engine's sparse KV cache, the
dense (r = 1, exact LLaDA) reference and optionally baseline systems (paper §6.4, Fig. 6), run
by dllm_bench.accuracy.run.accuracy (docs/ACCURACY.md)."""
from __future__ import annotations

import typer

from dllm_bench import inputs
from dllm_bench.accuracy.run import AccuracyOptions, accuracy
from dllm_bench.commands import budget_flag
from dllm_bench.commands.serve_flags import AsJson, CudaGraphs, DecodingPolicy, ResultDir, TensorParallelSize
from engine.decoding import FIXED


def register(app: typer.Typer) -> None:
    @app.command("accuracy")
    def accuracy_cmd(
        task: str | None = typer.Option(None, help="synth-cot (GSM8K-shaped worked answers) | synth (short answers) | gsm8k | humaneval (default: the --model's training task, else synth-cot)."),
        model: str | None = typer.Option(None, "--model", "-m", help="Preset name or HF LLaDA checkpoint directory; a comma list = several trained models (seeds) of one task, reported per seed and as mean ± spread (default: the committed model trained on the task: synth-cot for synth-cot, tiny-math otherwise)."),
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
        cuda_graphs: CudaGraphs = None,
        decoding: DecodingPolicy = FIXED,
        memory_budget: budget_flag.EnginePoints = "auto",
        threads: int | None = typer.Option(None, help="torch threads (CPU); with --tensor-parallel-size shared out "
                                           "among an engine point's ranks (baselines use them all)."),
        tensor_parallel_size: TensorParallelSize = None,
        max_num_seqs: int = typer.Option(64, help="Engine: concurrent requests."),
        batch: int = typer.Option(32, help="Baselines: static batch size."),
        r1: bool = typer.Option(True, "--r1/--no-r1", help="Also run the engine's sparse cache at r = 1.0."),
        chat: bool = typer.Option(False, "--chat/--no-chat", help="Wrap prompts in the tokenizer's chat template."),
        result_dir: ResultDir = None,
        run_id: str | None = typer.Option(None, help="Run directory name (default: timestamp-accuracy-<task>)."),
        json_out: AsJson = False,
    ) -> None:
        """Accuracy vs KV retention: head-centric vs uniform selection, dense reference, baselines."""
        result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
        accuracy(AccuracyOptions.pick(locals()), result_dir=result_dir, run_id=run_id, as_json=json_out)
