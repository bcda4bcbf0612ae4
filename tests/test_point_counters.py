"""A point's counters are its own: the system's warm-up request (serve runs one before every
point) leaves the point's step, request-step, stall and deferral counts untouched, so a measured
point's stats are the simulated point's, which has no warm-up."""
from __future__ import annotations

import torch

from dllm_bench.serve.loadgen import run_open_loop, step_stats_summary
from dllm_bench.systems.build import warm_up
from engine import EngineConfig, LLMEngine, SamplingParams
from tests.helpers import tiny_model
from workloads.serving import build_workload

BLOCK = 8


def test_a_points_request_steps_leave_out_the_warm_up():
    engine = LLMEngine(EngineConfig(dtype="float32", device="cpu", sampling=False, kv_pool_tokens=400,
                                    max_num_batched_tokens=96, max_num_logits=20), model=tiny_model(torch.float32))
    warm_up(engine, [5] * 8, BLOCK)
    wl = build_workload("livebench", num_prompts=4, rps=float("inf"), seed=3, vocab_size=298, special_ids=[],
                        length_scale=0.05, block_length=BLOCK, gen_cap=16)
    res = run_open_loop(engine, wl, lambda item: SamplingParams(gen_length=item.gen_length, steps=item.gen_length,
                                                                block_length=BLOCK))
    st = step_stats_summary(res["stats"])
    # every member of every step of the point is a Refresh or a Reuse of one of its requests
    assert st["refresh_request_steps"] + st["reuse_request_steps"] == st["batched_requests"]
    assert st["reuse_request_steps"] == sum(r.gen_length for r in wl) - st["refresh_request_steps"]
