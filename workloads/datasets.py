"""Serving dataset presets (prompt/output token-length models), synthetic prompt ids, JSONL replay.

The dLLM-Serve paper (§6.1) serves LiveBench-coding, OSC and BurstGPT, none of which can be had
offline here, and only token counts matter to a serving engine.
So each preset is a seeded length model built from published numbers, documented next to it, and
prompts are random token ids. All lengths in this module are at full (paper) scale; workloads.serving
applies `length_scale` and the caps.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import burstgpt

Sampler = Callable[[int, np.random.Generator], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class LengthPreset:
    name: str
    prompt_range: tuple[int, int]   # every sampled prompt length lies in this range (full scale)
    output_range: tuple[int, int]   # same for output lengths
    source: str                     # where the numbers come from (printed by describe/serve)
    sample: Sampler                 # (n, rng) -> (prompt_lens, output_lens), int64 arrays


def _is_pos_int(v: object) -> bool:
    """True for 3 or 3.0 (JSON has no int/float distinction), False for bools, 2.5, inf, nan, 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer)):
        return False
    return (not isinstance(v, float) or v.is_integer()) and v >= 1


def _uniform_int(rng: np.random.Generator, lo: int, hi: int, n: int) -> np.ndarray:
    return rng.integers(lo, hi + 1, size=n, dtype=np.int64)


def _truncated_normal_int(rng: np.random.Generator, mean: float, sd: float, lo: int, hi: int,
                          n: int) -> np.ndarray:
    """Normal truncated to [lo, hi] by resampling (not clipping, which would pile mass on the ends)."""
    out = np.rint(rng.normal(mean, sd, size=n))
    bad = (out < lo) | (out > hi)
    while bad.any():
        out[bad] = np.rint(rng.normal(mean, sd, size=int(bad.sum())))
        bad = (out < lo) | (out > hi)
    return out.astype(np.int64)


# LiveBench coding (livebench/livebench, its LiveCodeBench-derived coding category). Prompts are LiveCodeBench statements plus
# examples, constraints and format instructions: ~300-900 tokens. Outputs for code without
# reasoning: ~100-400 tokens (stored model answers of an 8B model: 10-365, mostly 60-200). Only the
# ranges are known, so both are uniform over them. Long prompts, long outputs.
LIVEBENCH_PROMPT = (300, 900)
LIVEBENCH_OUTPUT = (100, 400)


def _livebench(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return _uniform_int(rng, *LIVEBENCH_PROMPT, n), _uniform_int(rng, *LIVEBENCH_OUTPUT, n)


# OSC = OpenAI summarize-from-feedback comparisons (openai/summarize-from-feedback). Posts were filtered to fit 512 GPT-2
# tokens; no published mean, so prompt ~ Normal(350, 100) truncated to [100, 512] (our
# estimate; truncated mean ~340). Reference summaries are 24-48 tokens, max SFT response 53 tokens:
# output uniform over [24, 53]. Mid-length prompts, short outputs.
OSC_PROMPT_MEAN, OSC_PROMPT_SD = 350.0, 100.0
OSC_PROMPT = (100, 512)
OSC_OUTPUT = (24, 53)


def _osc(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    prompt = _truncated_normal_int(rng, OSC_PROMPT_MEAN, OSC_PROMPT_SD, *OSC_PROMPT, n)
    return prompt, _uniform_int(rng, *OSC_OUTPUT, n)


PRESETS: dict[str, LengthPreset] = {
    "livebench": LengthPreset(
        "livebench", LIVEBENCH_PROMPT, LIVEBENCH_OUTPUT,
        "LiveBench coding: prompt U[300,900], output U[100,400] tokens",
        _livebench),
    "osc": LengthPreset(
        "osc", OSC_PROMPT, OSC_OUTPUT,
        "OSC summarization: prompt N(350,100) truncated to [100,512], output U[24,53] tokens",
        _osc),
    "burstgpt": LengthPreset(
        "burstgpt", burstgpt.REQUEST_CLIP, burstgpt.RESPONSE_CLIP,
        "BurstGPT: request lognormal median 400 / mean 620 clipped [1,4096]; response "
        "N(100+0.17*req, 0.6*mean) clipped [1,2000] (BurstGPT README Fig. 4)",
        burstgpt.synthetic_lengths),
}


def random_bounds(input_len: int, output_len: int, range_ratio: float) -> tuple[tuple[int, int],
                                                                                   tuple[int, int]]:
    """vLLM RandomDataset ranges: [floor(L(1-r)), ceil(L(1+r))], lengths at least 1 token."""
    for name, v in (("random input_len", input_len), ("random output_len", output_len)):
        if not _is_pos_int(v):
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if isinstance(range_ratio, bool) or not isinstance(range_ratio, (int, float)) \
            or not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"random range_ratio must be in [0, 1), got {range_ratio!r}")
    r = float(range_ratio)
    prompt = (max(1, math.floor(input_len * (1 - r))), math.ceil(input_len * (1 + r)))
    output = (max(1, math.floor(output_len * (1 - r))), math.ceil(output_len * (1 + r)))
    return prompt, output


def random_preset(input_len: int = 1024, output_len: int = 128, range_ratio: float = 0.0) -> LengthPreset:
    """vLLM-like `random` dataset (defaults = vLLM's --random-input-len 1024, --random-output-len
    128, --random-range-ratio 0.0): lengths uniform over the ranges of `random_bounds`."""
    p, o = random_bounds(input_len, output_len, range_ratio)

    def sample(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return _uniform_int(rng, *p, n), _uniform_int(rng, *o, n)

    return LengthPreset("random", p, o, f"random: prompt U[{p[0]},{p[1]}], output U[{o[0]},{o[1]}] "
                        f"tokens (vLLM --random-input-len/--random-output-len/--random-range-ratio)",
                        sample)


def scale_lengths(lengths: np.ndarray | Sequence[int], scale: float) -> np.ndarray:
    """Multiply token counts by `scale` (e.g. 0.125 for CPU runs), round, and keep >= 1 token."""
    arr = np.asarray(lengths, dtype=np.float64)
    return np.maximum(1, np.rint(arr * float(scale))).astype(np.int64)


def allowed_token_ids(vocab_size: int, special_ids: Iterable[int] = ()) -> np.ndarray:
    """Ids in [0, vocab_size) minus the special ones (mask, eos, bos, pad...)."""
    if not _is_pos_int(vocab_size):
        raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    ids = np.setdiff1d(np.arange(int(vocab_size), dtype=np.int64),
                       np.asarray(list(special_ids), dtype=np.int64))
    if ids.size == 0:
        raise ValueError(f"no ordinary token ids left in a vocab of {vocab_size} after removing "
                         "the special ids")
    return ids


def synthetic_prompt_ids(lengths: Sequence[int], allowed: np.ndarray,
                         rng: np.random.Generator) -> list[list[int]]:
    """One list of uniformly drawn ordinary token ids per requested length."""
    flat = allowed[rng.integers(0, allowed.size, size=int(np.sum(lengths)))]
    cuts = np.cumsum(lengths)[:-1]
    return [part.tolist() for part in np.split(flat, cuts)]


def _positive_int(v: object, key: str, where: str) -> int:
    if not _is_pos_int(v):
        raise ValueError(f"{where}: '{key}' must be an integer >= 1, got {v!r}")
    return int(v)


def load_jsonl(path: str | Path, tokenize: Callable[[str], list[int]] | None = None) -> list[dict]:
    """Read a JSONL workload: one object per line with `output_len` (int >= 1) and either `prompt`
    (text, tokenized with `tokenize`) or `prompt_len` (int >= 1); optional `timestamp` (seconds)
    for trace arrivals. Blank lines are skipped; other keys are ignored.

    Returns dicts {prompt_ids: list[int] | None, prompt_len, output_len, timestamp: float | None,
    line}. Any bad line raises ValueError("<path> line N: <problem>").
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"JSONL {path}: file not found") from None
    except UnicodeDecodeError:
        raise ValueError(f"JSONL {path}: not UTF-8 text") from None
    records = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"JSONL {path} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if "output_len" not in obj:
            raise ValueError(f"{where}: missing 'output_len'")
        output_len = _positive_int(obj["output_len"], "output_len", where)
        ids = None
        if "prompt" in obj and (tokenize is not None or "prompt_len" not in obj):
            if not isinstance(obj["prompt"], str):
                raise ValueError(f"{where}: 'prompt' must be a string")
            if tokenize is None:
                raise ValueError(f"{where}: has 'prompt' text but no tokenizer was given "
                                 "(pass tokenize=..., or give 'prompt_len' instead)")
            ids = [int(t) for t in tokenize(obj["prompt"])]
            if not ids:
                raise ValueError(f"{where}: 'prompt' tokenizes to zero tokens")
            prompt_len = len(ids)
        elif "prompt_len" in obj:
            prompt_len = _positive_int(obj["prompt_len"], "prompt_len", where)
        else:
            raise ValueError(f"{where}: needs 'prompt' (text) or 'prompt_len' (int)")
        ts = obj.get("timestamp")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))
                               or not math.isfinite(ts)):
            raise ValueError(f"{where}: 'timestamp' must be a finite number, got {ts!r}")
        records.append({"prompt_ids": ids, "prompt_len": prompt_len, "output_len": output_len,
                        "timestamp": None if ts is None else float(ts), "line": n})
    if not records:
        raise ValueError(f"JSONL {path}: no records (file is empty)")
    return records
