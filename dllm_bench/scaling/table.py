"""`dllm-bench models similarity`'s output: the scale-similarity table (similarity.py) on stdout,
as a Rich table or Markdown (docs/SCALING.md), with the CPU's measured ridge when asked."""
from __future__ import annotations

import typer

from dllm_bench.console import console, md_table, print_df
from dllm_bench.errors import UserError
from dllm_bench.scaling.similarity import measure_cpu, similarity_table

FLOATS = {"lm_head_over_body": "{:.3f}", "logit_row_over_kv_token": "{:.2f}", "prompt_over_block": "{:.1f}",
          "attention_share": "{:.3f}", "blocks_per_request": "{:.1f}", "weights_over_budget": "{:.2f}",
          "request_kv_over_free": "{:.3f}", "dllm-cache step share": "{:.2f}", "reuse AI (1 req)": "{:.0f}",
          "reuse AI (n req)": "{:.0f}", "ridge": "{:.0f}"}


def similarity(markdown: bool, cpu_peak: bool, threads: int) -> None:
    """The scale-similarity table on stdout; with `cpu_peak` this CPU measured with `threads`."""
    if threads < 1:
        raise UserError(f"--threads must be >= 1, got {threads}")
    cpu = measure_cpu(threads) if cpu_peak else None
    df = similarity_table(cpu)
    if markdown:
        typer.echo(md_table(df, FLOATS), nl=False)
    else:
        print_df(console(stderr=False), df, "scale similarity (ratios at each workload; capacities for a "
                 "256+256-token request)", FLOATS, drop=())
    if cpu is not None:
        typer.echo(f"cpu ridge: {cpu.matmul_flops / 1e9:.0f} GFLOP/s float32 matmul / "
                   f"{cpu.bandwidth / 1e9:.1f} GB/s copy, measured now with {threads} threads", err=True)
