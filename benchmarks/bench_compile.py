"""Does `torch.compile` of the model's per-layer math pay on this CPU?

Times one layer's non-attention math (RMSNorm, Q/K/V projections and RoPE; the output
projection, RMSNorm and SwiGLU MLP) eager vs `torch.compile(dynamic=True)` at the row counts of
the engine's steps on a preset: a Reuse step of N requests (N x block rows) and a Refresh step of
whole canvases. Attention is left out: it is SDPA in both cases and takes the step's index
tensors, which change every step. Prints eager / compiled ms per layer and the speed-up, the
compile time, and the largest difference between the two outputs.

    python benchmarks/bench_compile.py --preset similar-1024 --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from dllm_bench.checkpoints.load import load_model


def layer_math(block, rope_at):
    def run(x: torch.Tensor, positions: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        q, k, v = block.qkv(x, positions, rope_at(positions))
        h = x + block.attn_out(a)
        return h + block.mlp(h), q, k, v
    return run


def timed(fn, *args, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="similar-1024")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="32,128,256,728,2912", help="row counts (Reuse: requests x block; Refresh: canvases)")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(a.preset, a.dtype, "cpu")
    block, d = model.blocks[0], model.config.d_model
    rope_at = lambda pos: model.rope.at(pos, model.dtype)  # noqa: E731
    eager = layer_math(block, rope_at)
    compiled = torch.compile(layer_math(block, rope_at), dynamic=True)
    console = Console()
    table = Table(title=f"one layer's non-attention math, {a.preset} {a.dtype}, {a.threads} threads, median of {a.reps}")
    for col in ("rows", "eager ms", "compiled ms", "eager / compiled", "max |diff|"):
        table.add_column(col, justify="right")
    g = torch.Generator().manual_seed(0)
    first = True
    with torch.no_grad():
        for n in (int(r) for r in a.rows.split(",")):
            x = torch.randn(n, d, generator=g).to(model.dtype)
            attn = torch.randn(n, d, generator=g).to(model.dtype)
            pos = torch.arange(n) % model.config.max_sequence_length
            t = time.perf_counter()
            ref, out = eager(x, pos, attn), compiled(x, pos, attn)
            diff = max((r - o).abs().max().item() for r, o in zip(ref, out, strict=True))
            if first:
                console.print(f"first compiled call (compilation): {time.perf_counter() - t:.1f} s")
                first = False
            compiled(x, pos, attn)                                      # a new shape may recompile once
            te, tc = timed(eager, x, pos, attn, reps=a.reps), timed(compiled, x, pos, attn, reps=a.reps)
            table.add_row(str(n), f"{te:.2f}", f"{tc:.2f}", f"{te / tc:.2f}x", f"{diff:.1e}")
    console.print(table)


if __name__ == "__main__":
    main()
