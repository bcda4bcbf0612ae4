"""`make bench-simulate`: how long simulating LLaDA-8B serving takes (the goal: a 2,000-request
trace at 4 req/s for all five systems on the H100 profile in under 60 s on one core).

One run: BurstGPT lengths (our length model), gen 256 = steps, block 32, Poisson arrivals;
engine with the paper's L40S knobs, baselines at the largest static batch the memory model fits.
Prints, per system, the simulated throughput and the CPU and wall seconds the simulation took,
then the totals. CPU seconds are this process's (one core); wall seconds include whatever else
the machine is running.
"""
from __future__ import annotations

import argparse
import time

import torch

from dllm_bench.metrics.serving import summarize
from dllm_bench.simulate.hardware import load
from dllm_bench.simulate.paper import setting as paper
from dllm_bench.simulate.simulator import simulate_point
from dllm_bench.systems.spec import parse_system

SYSTEMS = ("engine", "llada", "fast-dllm", "dllm-cache", "sparse-dllm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h100")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rps", type=float, default=4.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    hw = load(a.hardware)
    wl = paper.workload("burstgpt", a.requests, rps=a.rps)
    setup = paper.setup(hw)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    print(f"simulating {a.requests} requests at {a.rps:g} req/s on {hw.name}: LLaDA-8B, gen 256, block 32")
    for name in SYSTEMS:
        c, w = time.process_time(), time.perf_counter()
        s = summarize(simulate_point(parse_system(name), setup, wl, paper.BLOCK)["result"])
        print(f"  {name:12s} {s['output_throughput']:8.1f} tok/s simulated, mean E2EL {s['mean_e2el_ms'] / 1e3:8.1f} s"
              f"  | {time.process_time() - c:6.1f} s CPU, {time.perf_counter() - w:6.1f} s wall")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(f"total: {cpu:.1f} s CPU (goal < 60 s on one core: {'met' if cpu < 60 else 'MISSED'}), {wall:.1f} s wall")


if __name__ == "__main__":
    main()
