"""Decode prompts with the engine or a baseline, every prompt at once (the engine batches them
continuously, a baseline in static batches of `batch`), and report the outputs: `generate(o)`
returns the run's document, `print_run` shows it. The system comes from dllm_bench.systems
(InProcess: one device, or the engine over `tensor_parallel_size` ranks)."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from baselines import SYSTEMS
from dllm_bench import console, inputs
from dllm_bench.checkpoints.load import encode_prompt, load_tokenizer, parse_ids
from dllm_bench.errors import UserError
from dllm_bench.systems import decoding as system_decoding
from dllm_bench.systems.inprocess import InProcess
from dllm_bench.systems.options import RunOptions, check_engine_only, resolve
from dllm_bench.systems.spec import ENGINE, system_names
from dllm_bench.systems.step_budgets import AUTO
from engine import EngineConfig, SamplingParams
from engine.decoding import Decoding

BASELINE_FLAGS = ("threshold", "fast_dllm_cache", "prompt_interval", "gen_interval", "transfer_ratio", "keep_ratio",
                  "kernel_size")


@dataclass(frozen=True)
class GenerateOptions(RunOptions):
    """`generate`'s options as given (field names are its CLI parameters')."""
    model: str = "tiny"
    prompt: list[str] | None = None
    prompt_ids: list[str] | None = None
    gen_length: int = 64
    block_length: int = 32
    steps: int | None = None
    temperature: float = 0.0
    remasking: str = "low_confidence"
    seed: int = 0
    system: str = ENGINE
    cache: str = "none"
    retention: float = 0.5
    selection: str = "head"
    max_num_logits: int | None = None
    max_num_batched_tokens: int | None = None
    no_logit_budget: bool = False
    scheduler: str = "phase"
    batch: int = 8
    threshold: float | None = None
    fast_dllm_cache: str | None = None
    prompt_interval: int | None = None
    gen_interval: int | None = None
    transfer_ratio: float | None = None
    keep_ratio: float | None = None
    kernel_size: int | None = None
    chat: bool = True


def build_params(gen_length, steps, block_length, temperature, remasking, seed, decoding=Decoding()) -> SamplingParams:
    try:
        return SamplingParams(gen_length=gen_length, steps=steps, block_length=block_length,
                              temperature=temperature, remasking=remasking, seed=seed, decoding=decoding)
    except ValueError as e:
        raise UserError(str(e)) from None


def baseline_knobs(system: str, **given) -> dict:
    """Only the knobs the user set that this system has (a baseline's others are its upstream
    defaults; the engine has none of them)."""
    known = SYSTEMS[system].knobs if system in SYSTEMS else {}
    extra = {k: v for k, v in given.items() if v is not None and k not in known}
    if extra:
        raise UserError(f"--{next(iter(extra)).replace('_', '-')} does not apply to system {system!r}")
    return {k: v for k, v in given.items() if v is not None}


def run_all(system, prompts: list[list[int]], params: SamplingParams, show_progress: bool):
    """Every prompt through the system at once (continuous batching in the engine)."""
    with console.progress(enabled=show_progress) as progress:
        task = progress.add_task("generate", total=len(prompts))
        try:
            return system.generate(prompts, params, lambda done, _total: progress.update(task, completed=done))
        except ValueError as e:  # a request the system can never run (e.g. longer than the model)
            raise UserError(str(e)) from None


def generate(o: GenerateOptions, *, show_progress: bool = True) -> dict:
    """Run `o`: the run's document (outputs, their texts, the system's stats and settings)."""
    if o.system not in system_names():
        raise UserError(f"--system must be one of {', '.join(system_names())}, got {o.system!r}")
    setup = resolve(o, memory_budget="none")
    setup.apply_threads()
    check_engine_only(setup.tensor_parallel_size, o.system)
    if not o.prompt and not o.prompt_ids:
        raise UserError("give at least one --prompt or --prompt-ids")
    if o.batch <= 0:
        raise UserError("--batch must be positive")
    dec = system_decoding.require(o.system, setup.decoding)
    if dec.knobs and o.threshold is not None:
        raise UserError("give the parallel-decoding rule once: --decoding or --threshold")
    params = build_params(o.gen_length, o.gen_length if o.steps is None else o.steps, o.block_length, o.temperature,
                          o.remasking, o.seed, dec.decoding)
    if o.max_num_batched_tokens is not None and o.max_num_batched_tokens < 1:
        raise UserError(f"--max-num-batched-tokens must be >= 1, got {o.max_num_batched_tokens}")
    logits = None if o.no_logit_budget else (AUTO if o.max_num_logits is None else o.max_num_logits)
    try:
        cfg = EngineConfig(cache=o.cache, retention=o.retention, selection=o.selection, dtype=setup.dtype,
                           max_num_logits=1024 if logits == AUTO else logits,
                           max_num_batched_tokens=o.max_num_batched_tokens or EngineConfig.max_num_batched_tokens,
                           scheduler=o.scheduler, device=str(setup.device), cuda_graphs=setup.cuda_graphs)
    except ValueError as e:
        raise UserError(str(e)) from None
    knobs = {**baseline_knobs(o.system, **{k: getattr(o, k) for k in BASELINE_FLAGS}), **dec.knobs}
    path = inputs.checkpoint_dir(o.model, tokenizer=bool(o.prompt), why="give prompts with --prompt-ids")
    tok = load_tokenizer(path)
    prompts = [parse_ids(s) for s in (o.prompt_ids or [])]
    for text in o.prompt or []:
        if not text.strip():
            raise UserError("empty prompt")
        prompts.append(encode_prompt(tok, text, o.chat))
    src = InProcess(str(path), setup.dtype, str(setup.device), setup.tensor_parallel_size)
    budgets = None
    if o.system == ENGINE:   # on CUDA the step budgets scale with the GPU unless given
        budgets = src.budgets(tokens=o.max_num_batched_tokens, logits=logits, max_num_seqs=cfg.max_num_seqs,
                              block_length=o.block_length, longest_canvas=max(map(len, prompts)) + o.gen_length,
                              cpu=(cfg.max_num_batched_tokens, cfg.max_num_logits))
        cfg = dataclasses.replace(cfg, max_num_batched_tokens=budgets.max_num_batched_tokens,
                                  max_num_logits=budgets.max_num_logits,
                                  ridge_rows=budgets.ridge_rows or cfg.ridge_rows)
        system = src.engine(cfg)
        if budgets.tokens_rule and show_progress:
            console.console().print(budgets.describe(), style="dim", highlight=False)
    else:
        system = src.baseline(o.system, batch=o.batch, knobs=knobs)
    t0 = time.perf_counter()
    with system:
        outs = run_all(system, prompts, params, show_progress=show_progress)
        elapsed = time.perf_counter() - t0
        stats = system.stats()
    engine = budgets is not None
    if engine:                      # the engine's attention backend and why, once
        console.console().print(system.attention.line, markup=False, highlight=False)
    texts = [tok.decode(x.token_ids, skip_special_tokens=True) if tok is not None else None for x in outs]
    return dict(
        outputs=[dict(tokens=x.token_ids, text=t, nfe=x.nfe, tpf=x.tokens_per_forward,
                      steps_per_block=x.steps_per_block, prompt_tokens=len(x.prompt_ids), cache=x.cache)
                 for x, t in zip(outs, texts, strict=True)],
        model=str(path), system=o.system, dtype=setup.dtype, elapsed_s=elapsed,
        cuda_graphs=cfg.cuda_graphs if engine else None,
        step_budgets=dict(max_num_batched_tokens=cfg.max_num_batched_tokens,
                          max_num_logits=cfg.max_num_logits) if engine else None,
        params=dict(gen_length=params.gen_length, steps=params.steps, block_length=params.block_length,
                    temperature=params.temperature, remasking=params.remasking, seed=params.seed,
                    decoding=str(params.decoding)),
        tensor_parallel_size=setup.tensor_parallel_size,
        stats={k: v for k, v in stats.items() if not isinstance(v, list)},
    )


def print_run(doc: dict) -> None:
    """Each output under a rule with its shape, then the run's throughput line."""
    con = console.console(stderr=False)
    for i, x in enumerate(doc["outputs"]):
        con.rule(f"output {i} · {x['prompt_tokens']} prompt tokens · nfe {x['nfe']} · {x['tpf']:.2f} tokens/forward")
        con.print(x["text"] if x["text"] is not None else x["tokens"], markup=False, highlight=False)
    n_tok = sum(len(x["tokens"]) for x in doc["outputs"])
    elapsed = doc["elapsed_s"]
    con.print(f"[dim]{doc['system']} · {len(doc['outputs'])} request(s) · {n_tok} tokens in {elapsed:.2f}s "
              f"({n_tok / max(elapsed, 1e-9):.1f} tok/s)[/dim]")

