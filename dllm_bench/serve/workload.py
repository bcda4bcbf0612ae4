"""The workloads of a `dllm-bench serve` run: one seeded request list per (dataset, rps) point,
built once before any system runs so every system replays exactly the same arrivals.

Also the model facts a workload needs (vocabulary, special ids to keep out of synthetic prompts)
and the worst-request shape a baseline's static batch is profiled for.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from dllm_bench import inputs
from dllm_bench.checkpoints.presets import model_params
from dllm_bench.checkpoints.token_layouts import LAYOUTS
from dllm_bench.errors import UserError
from dllm_bench.repeats import repeat_seeds
from dllm_bench.serve.config import ServeRun
from dllm_bench.serve.task_prompts import TASK_DATASET, task_workload
from dllm_bench.systems.build import WorkloadShape
from engine.config import DTYPES
from engine.models import config_from_pretrained
from workloads.serving import ServingRequest, build_workload, describe


def model_info(model_dir: Path, dtype: str) -> dict:
    try:
        cfg = config_from_pretrained(model_dir)
    except (OSError, ValueError) as e:
        raise UserError(f"model {model_dir}: {e}") from None
    d = cfg.d_model
    n_params = model_params(cfg)
    size = DTYPES[dtype].itemsize
    return {"model_type": cfg.model_type, "vocab_size": cfg.vocab_size, "padded_vocab": cfg.padded_vocab, "d_model": d,
            "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim, "mlp_hidden_size": cfg.mlp_hidden_size,
            "max_sequence_length": cfg.max_sequence_length, "n_params": n_params,
            "weights_bytes": n_params * size,
            "special_ids": sorted({i for i in (cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id,
                                               cfg.bos_token_id) if i is not None})}


def special_ids(info: dict) -> list[int]:
    ids = set(info["special_ids"])
    layout = LAYOUTS.get(info.get("model_type", "llada"))  # a family's synthetic-tokenizer specials too
    ids |= {i for i in (layout.ids(info["vocab_size"]).values() if layout else ()) if i < info["vocab_size"]}
    return sorted(ids)


def preset_requests(p, model_dir: Path, num_prompts: int, seed: int = 0) -> list[ServingRequest]:
    """`num_prompts` requests of a serve preset's dataset at its lengths, as `serve` draws them (the
    arrival times go unused): what `calibrate` and the benchmarks time outside an open loop."""
    info = model_info(model_dir, p.dtype)
    return build_workload(p.dataset, num_prompts=num_prompts, seed=seed, vocab_size=info["vocab_size"],
                          special_ids=special_ids(info), length_scale=p.length_scale, block_length=p.block_length,
                          gen_cap=p.gen_cap, max_prompt_len=p.max_prompt_len, fixed_gen_length=p.gen_length)


def _tokenizer(model_dir: Path):
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the Rust `tokenizers` parser raises bare Exception
        raise UserError(f"cannot load the tokenizer in {model_dir}: {e}") from None
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def make_workloads(run: ServeRun, seed: int) -> dict[tuple[str, float], list[ServingRequest]]:
    """The workload of every (dataset, rps) point for one workload seed; ValueError -> UserError.
    A trace's point is keyed by its offered rate (it has no configured one)."""
    p = run.preset
    tokenize = None
    if run.dataset_path and not str(run.dataset_path).lower().endswith(".csv"):
        tokenize = _tokenizer(run.model_dir)
    special = special_ids(run.model_info)
    rps_list = [math.inf] if run.arrivals == "trace" else run.rps
    if run.num_prompts is None and run.duration is not None and run.arrivals != "trace":
        # --duration draws about rps x duration requests: the same bound as --num-prompts.
        expected = max((r * run.duration for r in rps_list if math.isfinite(r)), default=0)
        if expected > inputs.MAX_COUNT:
            raise UserError(f"--duration {run.duration:g} s at {max(rps_list):g} req/s is about {expected:,.0f} "
                            f"requests per point, over the limit of {inputs.MAX_COUNT:,}")
    out: dict[tuple[str, float], list[ServingRequest]] = {}
    for ds in run.datasets:
        for rps in rps_list:
            if ds == TASK_DATASET:
                out[(ds, rps)] = task_workload(run.model_dir, num_prompts=run.num_prompts, duration=run.duration,
                                               rps=rps, arrivals=run.arrivals, burstiness=run.burstiness,
                                               seed=seed, gen_length=p.gen_length)
                continue
            try:
                wl = build_workload(
                    ds, num_prompts=run.num_prompts, duration=run.duration, rps=rps,
                    burstiness=run.burstiness, arrivals=run.arrivals, seed=seed,
                    vocab_size=run.model_info["vocab_size"], special_ids=special,
                    length_scale=p.length_scale, block_length=p.block_length, gen_cap=p.gen_cap,
                    max_prompt_len=p.max_prompt_len, dataset_path=run.dataset_path,
                    time_scale=run.time_scale, model_filter=run.burstgpt_model, tokenize=tokenize,
                    fixed_gen_length=p.gen_length)
            except ValueError as e:
                raise UserError(str(e)) from None
            if not wl:
                raise UserError(f"the {ds} workload has no requests (raise --duration or --num-prompts)")
            if run.arrivals == "trace":
                offered = describe(wl).get("offered_rps") or math.inf
                rps = round(offered, 6) if math.isfinite(offered) else math.inf
            out[(ds, rps)] = wl
    return out


def build_workloads(run: ServeRun) -> None:
    """run.workloads: the seeded workload of every (dataset, rps) point (repeat 0: the run's seed)."""
    if run.arrivals == "trace":
        run.rps = []  # filled with each trace's offered rate
    run.workloads = make_workloads(run, run.seed)
    if run.arrivals == "trace":
        run.rps = list(dict.fromkeys(r for _, r in run.workloads))


def repeat_workloads(run: ServeRun, repeat: int) -> dict[tuple[str, float], list[ServingRequest]]:
    """The workloads of repeat `repeat` (seed = run seed + repeat, dllm_bench.repeats.repeat_seeds):
    same datasets, rates and lengths rule, other arrivals, lengths and prompt ids."""
    return run.workloads if repeat == 0 else make_workloads(run, repeat_seeds(run.seed, repeat + 1)[-1])


def shape_of(workload: Sequence[ServingRequest], block_length: int, max_requests: int | None = None) -> WorkloadShape:
    """The worst request of a workload and its request count: what a baseline's static batch is
    profiled for."""
    return WorkloadShape(max_prompt_len=max(r.prompt_len for r in workload),
                         max_gen_length=max(r.gen_length for r in workload), block_length=block_length, steps=None,
                         max_requests=max_requests or len(workload))


def workload_shape(run: ServeRun, workloads: dict | None = None) -> WorkloadShape:
    """The worst request over every workload of the run, or of one repeat's `workloads` (serve
    profiles one static batch for all)."""
    wls = run.workloads if workloads is None else workloads
    return shape_of([r for wl in wls.values() for r in wl], run.preset.block_length,
                    max(len(wl) for wl in wls.values()))
