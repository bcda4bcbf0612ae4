"""`make bench-gauges`: how closely a speed gauge follows the time of a serving request on this
machine: the GEMM gauge `serve` and `calibrate` read (dllm_bench.serve.speed_gauge), and the
candidate it was compared with, one forward of the served model over 64 tokens.

For `--seconds`, over and over: read both gauges, then time one request of the preset's workload
served by one system, back to back, on the same model, dtype and threads as `serve` (the median
of 3 requests; the sum of their step times, as `calibrate` times steps). Then, per gauge: the
correlation of log(request time) with log(gauge reading), and the spread of the request time
(90th / 10th percentile) before and after dividing it by the gauge. A gauge that follows the
machine's speed as the request feels it narrows the spread; one that does not leaves it, or
widens it. The last lines show the three timings over the run, so a change of the machine's
state is visible (docs/SIMULATE.md, "Which gauge").
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.commands.calibrate import timed_steps
from dllm_bench.serve.presets import preset_for
from dllm_bench.serve.speed_gauge import SpeedGauge, median_time
from dllm_bench.serve.workload import preset_requests
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.simulator import DTYPE_BYTES, TORCH_DTYPES
from dllm_bench.systems.spec import parse_system
from engine.models.llada import load_llada
from engine.sampling import SamplingParams

FORWARD_TOKENS = 64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--system", default="sparse-dllm")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between rounds")
    ap.add_argument("--gen", type=int, default=None,
                    help="tokens to generate (default: the preset's first request; cpu-default: try 32)")
    a = ap.parse_args()
    p = preset_for(a.preset, None)
    torch.set_num_threads(p.threads)
    dtype, dev = TORCH_DTYPES[p.dtype], torch.device(p.device)
    model_dir = resolve_model(p.model)
    mdl = load_llada(model_dir, dtype, dev)
    shape = ModelShape.from_config(mdl.config, DTYPE_BYTES[p.dtype])
    req = preset_requests(p, model_dir, 1)[0]
    gen = a.gen or req.gen_length
    params = SamplingParams(gen_length=gen, steps=gen, block_length=p.block_length)
    v = parse_system(a.system)
    gemm = SpeedGauge(shape.d, shape.ffn, dtype, 5, device=dev)
    ids = torch.randint(0, mdl.config.vocab_size, (1, FORWARD_TOKENS), generator=torch.Generator().manual_seed(0)).to(dev)

    def forward() -> float:
        with torch.inference_mode():
            return median_time(lambda: mdl(ids), 5)

    def request() -> float:
        return float(np.median([sum(dt for _, dt in timed_steps(v, 1, mdl, shape, [req.prompt_ids], params, p, dev))
                                for _ in range(3)]))

    print(f"{a.preset} ({p.model}, {p.dtype}, {p.threads} threads), {v.label}: one request of {len(req.prompt_ids)} "
          f"+ {gen} tokens, for {a.seconds:g} s")
    rows, end = [], time.perf_counter() + a.seconds
    while time.perf_counter() < end:
        rows.append((time.perf_counter(), gemm.read(), forward(), request()))
        time.sleep(a.pause)
    t, g, f, r = (np.array(x) for x in zip(*rows, strict=True))

    def spread(x):
        return float(np.percentile(x, 90) / np.percentile(x, 10))

    print(f"{len(rows)} rounds; request {r.min() * 1e3:.3g}-{r.max() * 1e3:.3g} ms, spread (p90/p10) {spread(r):.3f}")
    for name, x in (("GEMM gauge", g), ("forward", f)):
        c = float(np.corrcoef(np.log(r), np.log(x))[0, 1])
        print(f"  {name:14s} {x.min() * 1e3:.3g}-{x.max() * 1e3:.3g} ms; correlation with the request (log) "
              f"{c:+.2f}; request / gauge spread {spread(r / x):.3f}")
    print("over the run (medians of each tenth): seconds, GEMM ms, forward ms, request ms")
    for part in np.array_split(np.arange(len(rows)), min(10, len(rows))):
        print(f"  {t[part[0]] - t[0]:6.0f}  {np.median(g[part]) * 1e3:8.3f}  {np.median(f[part]) * 1e3:8.3f}  "
              f"{np.median(r[part]) * 1e3:9.2f}")


if __name__ == "__main__":
    main()
