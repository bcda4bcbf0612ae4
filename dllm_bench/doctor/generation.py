"""One request through the engine on the device, token for token against LLaDA's own sampler
(baselines.reference_llada, float64 on the CPU), on the committed trained tiny model.

The engine in exact mode (cache=none) must reproduce the reference exactly in float64, on any
device: a difference is a broken kernel, dtype path or install, never rounding. On a GPU the
request runs a second time the way a GPU serves (bfloat16, the varlen kernel where there is one); a
tiny model's near-ties may flip there, so that row warns rather than fails.
"""
from __future__ import annotations

import torch

from baselines.reference_llada import reference_generate
from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.doctor.checks import FAIL, OK, SKIP, WARN, Check
from engine.attention import choose_backend
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.models import load_model
from engine.sampling import SamplingParams

MODEL = "tiny-math"
PROMPT_LEN, GEN, BLOCK = 12, 16, 8


def _model_dir():
    return resolve_model(MODEL)


def _prompt(cfg) -> list[int]:
    special = {cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id}
    ids = [i for i in range(3, cfg.vocab_size, 7) if i not in special]
    return ids[:PROMPT_LEN]


def _engine_tokens(model, dtype: str, dev: torch.device, backend: str, prompt, params) -> list[int]:
    # A fixed pool: cache=none stores no KV, and profiling one for a budget is serve's business.
    cfg = EngineConfig(dtype=dtype, device=str(dev), cache="none", attention_backend=backend, kv_pool_tokens=256,
                       max_num_logits=GEN)
    return LLMEngine(cfg, model=model).generate([prompt], params)[0].token_ids


def _first_difference(a: list[int], b: list[int]) -> str:
    if len(a) != len(b):
        return f"{len(a)} tokens against {len(b)}"
    i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    n = sum(x != y for x, y in zip(a, b))
    return f"{n} of {len(a)} tokens differ, first at position {i}: {a[i]} against {b[i]}"


def generation_checks(dev: torch.device) -> list[Check]:
    path = _model_dir()
    params = SamplingParams(gen_length=GEN, steps=GEN, block_length=BLOCK)
    ref_model = load_model(path, torch.float64, torch.device("cpu"))
    prompt = _prompt(ref_model.config)
    ref, _ = reference_generate(ref_model, prompt, params)
    model = ref_model if dev.type == "cpu" else load_model(path, torch.float64, dev)
    got = _engine_tokens(model, "float64", dev, "sdpa", prompt, params)
    data = {"model": MODEL, "prompt_len": len(prompt), "tokens": got, "reference": ref}
    where = "the CPU" if dev.type == "cpu" else str(dev)
    if got == ref:
        first = Check("generate", OK, f"one {MODEL} request on {where} (engine, float64): {len(got)} tokens equal "
                      "to the reference sampler's (baselines/reference_llada.py, float64 on the CPU)", data)
    else:
        first = Check("generate", FAIL, f"one {MODEL} request on {where} (engine, float64) differs from the "
                      f"reference sampler: {_first_difference(got, ref)}", data)
    if dev.type != "cuda":
        return [first, Check("generate bf16", SKIP, "no CUDA device: CPU runs serve in float32")]
    del model
    half = load_model(path, torch.bfloat16, dev)
    got16 = _engine_tokens(half, "bfloat16", dev, "auto", prompt, params)
    backend = choose_backend("auto", dev, torch.bfloat16).name
    data16 = {"tokens": got16, "reference": ref, "backend": backend}
    if got16 == ref:
        return [first, Check("generate bf16", OK, f"the same request in bfloat16 ({backend}): tokens equal", data16)]
    return [first, Check("generate bf16", WARN, f"the same request in bfloat16 ({backend}): "
                         f"{_first_difference(got16, ref)} (near-ties of a tiny model can flip in bf16; "
                         "the float64 row is the exactness check)", data16)]
