"""Serving workloads: a list of ServingRequest (prompt, lengths, arrival, dLLM gen_length).

Entry point `build_workload` combines an arrival process (workloads.arrivals) with a dataset: a
synthetic length preset (datasets.PRESETS, or the vLLM-like `random`), or a file replay
(`dataset_path`: a BurstGPT CSV, or JSONL). Everything is seeded: the same arguments give the
same workload. CPU runs cannot afford paper lengths, so `length_scale` shrinks every token count
before the caps (rules in `build_workload`). A dLLM decodes a fixed-size canvas, so a trace's
output length is mapped to a `gen_length` (`gen_length_for`), or `fixed_gen_length` gives every
request the same one, as the paper's Table 3 does (256 tokens for all workloads). The options:
docs/SERVE.md ("Options").
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import arrivals as arr
from . import burstgpt, datasets

DATASETS = ("livebench", "osc", "burstgpt", "random", "custom")
# Independent random streams per concern (workloads.arrivals uses stream 0), so that e.g. changing the
# dataset does not change arrival times, and changing lengths does not change which rows replay.
_LENGTH_STREAM, _PROMPT_STREAM, _ROW_STREAM = 1, 2, 3


@dataclass
class ServingRequest:
    request_id: str
    prompt_ids: list[int] | None   # None when built without a vocab (lengths-only dry runs)
    prompt_len: int                # tokens actually sent (after length_scale and max_prompt_len)
    output_len: int                # the dataset's/trace's output length, after length_scale
    arrival: float                 # seconds from the start of the run
    gen_length: int                # dLLM canvas length derived from output_len (or fixed)
    source: str                    # e.g. "osc:synthetic", "burstgpt:trace.csv:line 17:GPT-4"
    trace_prompt_len: int          # unscaled lengths as the dataset/trace gave them
    trace_output_len: int


def _check_pos_int(v: object, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


def gen_length_for(output_len: int, block_length: int, cap: int | None = None) -> int:
    """Map a trace output length to a dLLM gen_length.

    Round up to a multiple of `block_length`, at least one block; if `cap` is given, cap it at
    `cap` rounded down to a block multiple (a cap below one block is an error, not silently 0).
    """
    block_length = _check_pos_int(block_length, "block_length")
    if isinstance(output_len, bool) or not isinstance(output_len, (int, np.integer)) or output_len < 0:
        raise ValueError(f"output_len must be an integer >= 0, got {output_len!r}")
    blocks = max(1, -(-int(output_len) // block_length))
    if cap is not None:
        cap_blocks = _check_pos_int(cap, "gen cap") // block_length
        if cap_blocks < 1:
            raise ValueError(f"gen cap {cap} is smaller than one block ({block_length} tokens)")
        blocks = min(blocks, cap_blocks)
    return blocks * block_length


def describe_gen_mapping(block_length: int, cap: int | None = None,
                         fixed_gen_length: int | None = None) -> str:
    """One human-readable line stating how output lengths become gen_length (printed by serve)."""
    if fixed_gen_length is not None:
        return (f"gen_length = {fixed_gen_length} for every request (fixed, as in the paper's "
                f"Table 3), whatever the dataset's output length")
    b = block_length
    capped = cap is not None
    top = gen_length_for(10**9, b, cap) if capped else None
    rule = f"gen_length = ceil(output_len / {b}) * {b}, at least {b} (one block)"
    if capped:
        rule += f", capped at {top} (gen cap {cap} rounded down to a block multiple)"
    examples = [1, b, b + 1] + ([top + 1] if capped else [])
    shown = ", ".join(f"{o}->{gen_length_for(o, b, cap)}" for o in examples)
    return f"{rule}; e.g. output_len {shown}"


def _file_rows(dataset_path: Path, model_filter: str | None,
               tokenize: Callable[[str], list[int]] | None) -> tuple[list[dict], str]:
    """Rows {prompt_ids, prompt_len, output_len, timestamp, label} from a CSV or JSONL file."""
    if dataset_path.suffix.lower() == ".csv":
        df = burstgpt.load_burstgpt_csv(dataset_path, model_filter=model_filter)
        rows = [{"prompt_ids": None, "prompt_len": max(1, int(r.request_tokens)),
                 "output_len": int(r.response_tokens), "timestamp": float(r.timestamp),
                 "label": f"line {r.line}" + (f":{r.model}" if r.model else "")}
                for r in df.itertuples(index=False)]
        return rows, "csv"
    if model_filter is not None:
        raise ValueError("model_filter only applies to BurstGPT CSV files")
    rows = datasets.load_jsonl(dataset_path, tokenize=tokenize)
    for r in rows:
        r["label"] = f"line {r['line']}"
    return rows, "jsonl"


def build_workload(dataset: str, *, num_prompts: int | None = None, duration: float | None = None,
                   rps: float = math.inf, burstiness: float = 1.0, arrivals: str = "poisson",
                   seed: int = 0, vocab_size: int | None = None, special_ids: Iterable[int] = (),
                   length_scale: float = 1.0, block_length: int = 32, gen_cap: int | None = 256,
                   max_prompt_len: int | None = None, dataset_path: str | Path | None = None,
                   time_scale: float = 1.0, model_filter: str | None = None,
                   tokenize: Callable[[str], list[int]] | None = None,
                   random_input_len: int = 1024, random_output_len: int = 128,
                   random_range_ratio: float = 0.0,
                   fixed_gen_length: int | None = None) -> list[ServingRequest]:
    """Build a seeded serving workload, sorted by arrival.

    dataset: one of DATASETS ('custom' only with dataset_path). With `dataset_path` the lengths
    (and, for JSONL `prompt` lines, the prompts) come from the file, `dataset` is only a label.
    arrivals: 'poisson' | 'gamma' | 'trace' ('trace' replays the file's timestamps / time_scale and
    takes rows in time order; the others sample rows with the row stream of `seed`, with
    replacement only when more requests than rows are needed).
    vocab_size/special_ids: synthetic prompt ids are drawn uniformly from [0, vocab_size) minus
    special_ids; vocab_size=None leaves prompt_ids None (lengths only).
    rps/burstiness/seed drive 'poisson'/'gamma' arrivals and are unused by 'trace' (except seed,
    which also seeds lengths and prompt ids). fixed_gen_length (a block multiple) overrides the
    output_len -> gen_length mapping and gen_cap for every request.
    length_scale multiplies every prompt and output token count (rounded, at least 1 token) before
    the caps (a single LLaDA-8B-shaped request takes tens of seconds on 2 CPU cores); real prompt
    text from a JSONL file is never cut by the scale (only its output length is scaled), only by
    `max_prompt_len`. `gen_cap` and `max_prompt_len` are absolute token counts, applied after it.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    if arrivals not in arr.ARRIVAL_KINDS:
        raise ValueError(f"unknown arrival process {arrivals!r}; choose one of "
                         f"{', '.join(arr.ARRIVAL_KINDS)}")
    if isinstance(length_scale, bool) or not isinstance(length_scale, (int, float)) \
            or not (math.isfinite(length_scale) and length_scale > 0):
        raise ValueError(f"length_scale must be a finite number > 0, got {length_scale!r}")
    if max_prompt_len is not None:
        max_prompt_len = _check_pos_int(max_prompt_len, "max_prompt_len")
    gen_length_for(0, block_length, gen_cap)  # validate block_length / gen_cap up front
    if fixed_gen_length is not None and (_check_pos_int(fixed_gen_length, "fixed_gen_length")
                                         % block_length):
        raise ValueError(f"fixed_gen_length {fixed_gen_length} is not a multiple of "
                         f"block_length {block_length}")
    allowed = None if vocab_size is None else datasets.allowed_token_ids(vocab_size, special_ids)

    if dataset_path is None:
        if dataset == "custom":
            raise ValueError("dataset 'custom' needs a dataset_path (BurstGPT CSV or JSONL)")
        if arrivals == "trace":
            raise ValueError("trace arrivals need a dataset_path with timestamps "
                             "(a BurstGPT CSV, or JSONL lines with 'timestamp')")
        if model_filter is not None:
            raise ValueError("model_filter only applies to a BurstGPT CSV given as dataset_path")
        times = arr.generate_arrivals(arrivals, rps, burstiness=burstiness,
                                      num_prompts=num_prompts, duration=duration, seed=seed)
        preset = (datasets.random_preset(random_input_len, random_output_len, random_range_ratio)
                  if dataset == "random" else datasets.PRESETS[dataset])
        p, o = preset.sample(len(times), np.random.default_rng([seed, _LENGTH_STREAM]))
        rows = [{"prompt_ids": None, "prompt_len": int(a), "output_len": int(b)}
                for a, b in zip(p, o, strict=True)]
        labels = [f"{dataset}:synthetic"] * len(rows)
    else:
        path = Path(dataset_path)
        file_rows, kind = _file_rows(path, model_filter, tokenize)
        if arrivals == "trace":
            missing = [r["line"] for r in file_rows if r["timestamp"] is None]
            if missing:
                raise ValueError(f"{path}: trace arrivals need a 'timestamp' on every line "
                                 f"(line {missing[0]} has none)")
            if kind == "jsonl":  # the CSV loader already sorts; keep arrival i with row i
                file_rows = sorted(file_rows, key=lambda r: r["timestamp"])
            times = arr.trace_arrivals([r["timestamp"] for r in file_rows], time_scale=time_scale,
                                       num_prompts=num_prompts, duration=duration)
            rows = file_rows[: len(times)]
        else:
            times = arr.generate_arrivals(arrivals, rps, burstiness=burstiness,
                                          num_prompts=num_prompts, duration=duration, seed=seed)
            rng = np.random.default_rng([seed, _ROW_STREAM])
            n = len(times)
            idx = rng.choice(len(file_rows), size=n, replace=n > len(file_rows))
            rows = [file_rows[i] for i in idx]
        labels = [f"{dataset}:{path.name}:{r['label']}" for r in rows]

    prompt_rng = np.random.default_rng([seed, _PROMPT_STREAM])
    trace_p = np.array([r["prompt_len"] for r in rows], dtype=np.int64)
    trace_o = np.array([r["output_len"] for r in rows], dtype=np.int64)
    out_len = datasets.scale_lengths(trace_o, length_scale)
    # Real (tokenized) prompts keep their length; synthetic ones are scaled.
    real = [r["prompt_ids"] is not None for r in rows]
    p_len = np.where(real, trace_p, datasets.scale_lengths(trace_p, length_scale))
    if max_prompt_len is not None:
        p_len = np.minimum(p_len, max_prompt_len)
    synth_idx = [i for i, is_real in enumerate(real) if not is_real]
    synth_ids: dict[int, list[int]] = {}
    if allowed is not None and synth_idx:
        drawn = datasets.synthetic_prompt_ids(p_len[synth_idx], allowed, prompt_rng)
        synth_ids = dict(zip(synth_idx, drawn, strict=True))

    workload = []
    for i, r in enumerate(rows):
        if real[i]:
            # Keep the tail when cutting: instructions/questions ("TL;DR:") sit at the end.
            ids = r["prompt_ids"][-int(p_len[i]):]
        else:
            ids = synth_ids.get(i)
        g = fixed_gen_length or gen_length_for(int(out_len[i]), block_length, gen_cap)
        workload.append(ServingRequest(
            request_id=f"{dataset}-{i}", prompt_ids=ids, prompt_len=int(p_len[i]),
            output_len=int(out_len[i]), arrival=float(times[i]), gen_length=int(g),
            source=labels[i], trace_prompt_len=int(trace_p[i]), trace_output_len=int(trace_o[i])))
    return workload


def _stats(prefix: str, values: np.ndarray) -> dict:
    return {f"{prefix}_mean": float(values.mean()), f"{prefix}_min": int(values.min()),
            f"{prefix}_max": int(values.max()), f"{prefix}_total": int(values.sum())}


def describe(workload: list[ServingRequest]) -> dict:
    """Summary for printing/saving: counts, length stats, offered rate and arrival span.

    offered_rps = (n - 1) / span, the rate estimate for a process whose first arrival is at t=0;
    inf when every request arrives at once, None for a single request.
    """
    n = len(workload)
    if n == 0:
        return {"num_requests": 0}
    t = np.array([w.arrival for w in workload])
    span = float(t.max() - t.min())
    out = {"num_requests": n, "duration_s": span,
           "offered_rps": None if n == 1 else (math.inf if span == 0 else (n - 1) / span)}
    for key in ("prompt_len", "output_len", "gen_length"):
        out.update(_stats(key, np.array([getattr(w, key) for w in workload], dtype=np.int64)))
    out["with_prompt_ids"] = sum(w.prompt_ids is not None for w in workload)
    out["datasets"] = dict(Counter(w.source.split(":", 1)[0] for w in workload))
    return out
