"""`simulate --validate` pins each system to what its measured points ran with; a capacity serve
measured for each workload (a baseline's max-fit batch: 3 requests of one seed's lengths fit the
budget, all 4 of another's) is pinned per workload seed, so every seed's point is simulated with
its own batch, not the first point's."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from dllm_bench.simulate.fit.measured import pins
from dllm_bench.simulate.run import _pinned
from dllm_bench.simulate.simulator import simulate_point
from dllm_bench.systems.spec import parse_system
from tests.helpers import tiny_model
from tests.test_simulate import BLOCK, _setup
from workloads.serving import build_workload


def _run(tmp_path: Path, batches: dict[int, int]) -> Path:
    d = tmp_path / "measured"
    (d / "points").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"kind": "serve", "config": {}}))
    for seed, b in batches.items():
        p = d / "points" / f"livebench__fast-dllm__rpsinf{'__r' + str(seed) if seed else ''}"
        p.mkdir()
        (p / "summary.json").write_text(json.dumps({
            "system": "fast-dllm", "system_name": "fast-dllm", "dataset": "livebench", "rps": "inf",
            "workload_seed": seed, "max_batch_size": b, "scenario_kind": "max-fit", "knobs": {"fast_dllm_cache": "dual"}}))
    return d


def test_a_batch_measured_per_workload_is_pinned_per_seed(tmp_path):
    pinned = pins([_run(tmp_path, {0: 3, 1: 4})])
    setup = _setup(tiny_model(torch.float32))
    setup.pinned = pinned
    assert setup.pin_info("fast-dllm", 0)["max_batch_size"] == 3
    assert setup.pin_info("fast-dllm", 1)["max_batch_size"] == 4
    assert setup.pin_info("fast-dllm", 7)["max_batch_size"] == 3           # a seed not measured: the first point's
    assert "static batch B=3 (seed 0), 4 (seed 1)" in _pinned(pinned["fast-dllm"])
    # one output length (one block) for all: a static batch of B holds any B of them
    wl = build_workload("livebench", num_prompts=6, rps=float("inf"), seed=3, vocab_size=298, special_ids=[],
                        length_scale=0.05, block_length=BLOCK, gen_cap=BLOCK)
    for seed, b in ((0, 3), (1, 4)):
        out = simulate_point(parse_system("fast-dllm"), setup, wl, BLOCK, keep_steps=True, seed=seed)
        assert out["info"]["max_batch_size"] == b
        assert max(out["result"]["stats"]["batch_sizes"]) == b                # the batch really ran that size
    assert _pinned(pins([_run(tmp_path / "one", {0: 5, 1: 5})])["fast-dllm"]).startswith("static batch B=5,")
