"""The engine's serving throughput at saturation on one checkpoint, written against the engine
API that has not changed since the first engine (`EngineConfig`, `LLMEngine.generate`), so the
same file measures any two commits of the engine:

    python benchmarks/bench_saturation.py --model ~/.cache/dllm-bench/models/similar-1024
    git worktree add /tmp/before 1ca940b
    PYTHONPATH=/tmp/before python benchmarks/bench_saturation.py --model ~/.cache/dllm-bench/models/similar-1024

Every request arrives at t = 0 (the engine's continuous batching decides the steps), greedy,
one token per step. Prompts are random ids drawn from a fixed seed, so both commits decode the
same work; the script prints which engine it imported, the wall time and output tokens/s, and
the tokens' hash (equal hashes: both commits produced the same tokens).
"""
from __future__ import annotations

import argparse
import hashlib
import time

import torch

import engine
from engine import EngineConfig, LLMEngine, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF LLaDA checkpoint directory")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=600)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--cache", default="sparse", help="none | dual | sparse")
    ap.add_argument("--retention", type=float, default=0.5)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-num-logits", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    cfg = EngineConfig(model=a.model, dtype=a.dtype, device="cpu", attention_backend="sdpa", cache=a.cache,
                       retention=a.retention, max_num_batched_tokens=a.max_num_batched_tokens,
                       max_num_logits=a.max_num_logits, max_num_seqs=a.prompts, sampling=False)
    eng = LLMEngine(cfg)
    mc = eng.model.config
    hi = min(mc.mask_token_id, mc.eos_token_id, mc.vocab_size) - 1
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, hi, (a.prompt_len,), generator=g).tolist() for _ in range(a.prompts)]
    params = SamplingParams(gen_length=a.gen, steps=a.gen, block_length=a.block)

    eng.generate(prompts[:1], SamplingParams(gen_length=a.block, steps=a.block, block_length=a.block))  # warm-up
    t = time.perf_counter()
    outs = eng.generate(prompts, params)
    wall = time.perf_counter() - t
    digest = hashlib.sha256(repr([o.token_ids for o in outs]).encode()).hexdigest()[:12]
    print(f"engine from {engine.__file__}")
    print(f"{a.prompts} requests x {a.prompt_len} prompt tokens, gen {a.gen}, block {a.block}, cache {a.cache}, "
          f"{a.dtype}, {a.threads} threads: wall {wall:.2f} s, {a.prompts * a.gen / wall:.2f} output tok/s, "
          f"tokens sha256 {digest}")


if __name__ == "__main__":
    main()
