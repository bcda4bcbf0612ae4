"""`cache=auto` against both pure modes on the simulator (the real scheduler on a virtual clock,
deterministic): the paper preset (LLaDA-8B's shape) on the fitted `h100` profile at budgets from
room for every request dual (80 GiB) down to where only sparse KV batches well (20 GiB), and the
CPU defaults; 64 requests at once, and at the finite rates where the first requests arrive to an
empty queue. In every cell `engine` (auto) reaches at least 98 % of the better of
`engine:cache=dual` and `engine:cache=sparse` (the 2 %: near the rule's crossover, and with only a
few requests running at once, the mode a full pool favours can be the slightly slower one)."""
from __future__ import annotations

import pytest

from dllm_bench.serve.options import ServeOptions
from dllm_bench.simulate import hardware
from dllm_bench.simulate.options import simulation
from dllm_bench.simulate.simulator import simulate_point

SYSTEMS = "engine,engine:cache=dual,engine:cache=sparse"
PAPER = dict(preset="paper", model="llada-8b")


def _throughputs(profile: str, rps: str = "inf", **options) -> dict[str, float]:
    """Output tokens per simulated second of each system, 64 requests at `rps` (inf: at t = 0)."""
    run, setup = simulation(ServeOptions(systems=SYSTEMS, num_prompts=64, rps=rps, **options), hardware.load(profile))
    (wl,) = run.workloads.values()
    out = {}
    for v in run.systems:
        res = simulate_point(v, setup, wl, run.preset.block_length)["result"]
        assert len(res["records"]) == 64 and not (res["rejected"] or res["unfinished"])
        out[v.label] = sum(r["output_len"] for r in res["records"]) / res["duration"]
    return out


@pytest.mark.parametrize("profile, options", [
    ("h100", PAPER | {"memory_budget": "80GiB"}),     # every request fits dual: dual wins, auto is dual
    ("h100", PAPER | {"memory_budget": "24GiB"}),     # ~13 dual / 25 sparse: dual still wins
    ("h100", PAPER | {"memory_budget": "22GiB"}),     # 8 / 16: sparse wins by ~10 %
    ("h100", PAPER | {"memory_budget": "20GiB"}),     # 4 / 8: sparse wins by ~40 %
    pytest.param("cpu", {"preset": "cpu-default"}, marks=pytest.mark.slow),   # builds the model's KV profile once
    # Arrivals over time: the first requests find an empty queue, yet the pool is weighed full.
    ("h100", PAPER | {"memory_budget": "20GiB", "rps": "2"}),
    ("h100", PAPER | {"memory_budget": "20GiB", "rps": "4"}),
    ("h100", PAPER | {"memory_budget": "22GiB", "rps": "4"}),
], ids=["h100-80GiB", "h100-24GiB", "h100-22GiB", "h100-20GiB", "cpu-default",
        "h100-20GiB-rps2", "h100-20GiB-rps4", "h100-22GiB-rps4"])
def test_auto_is_at_least_as_fast_as_the_better_pure_mode(profile, options):
    t = _throughputs(profile, **options)
    best = max(t["engine:cache=dual"], t["engine:cache=sparse"])
    assert t["engine"] >= 0.98 * best, t
