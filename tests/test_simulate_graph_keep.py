"""The simulator's timed keep of CUDA graphs: on a GPU profile a bucket keeps its graph only if its
simulated replay (padded to the bucket, with the profile's graph term) costs less than the same
step eager and unpadded (engine.graphs.keeps on the two prices), decided once where the engine
decides it, on the step the engine times there. A profile where graphs lose keeps none and runs
as --no-cuda-graphs; one where they win keeps them; a run recorded before the rule (no
`graph_keep` in its config.json: the committed H100 run) is replayed with every graph kept."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dllm_bench.errors import UserError
from dllm_bench.serve.options import ServeOptions
from dllm_bench.simulate.clock import VirtualClock
from dllm_bench.simulate.cost_model import HostCost, ModelShape
from dllm_bench.simulate.fit import measured, replay
from dllm_bench.simulate.hardware import load
from dllm_bench.simulate.options import simulation
from dllm_bench.simulate.runners import CostRunner
from dllm_bench.simulate.simulator import simulate_point
from dllm_bench.simulate.work import warm_up_requests
from engine.config import EngineConfig
from engine.graphs import keeps
from engine.request import Phase
from tests.helpers import tiny_config
from tests.test_cuda_simulate import _no_cuda

REPO = Path(__file__).resolve().parent.parent
H100_RUN = REPO / "tests" / "data" / "h100-2026-11-26"
BLOCK = 4


def _paper_points(monkeypatch, hw, n: int = 12) -> dict[str, dict]:
    """The paper's engine (cache=sparse) with and without graphs on `hw`: label -> simulate_point's output."""
    _no_cuda(monkeypatch)
    sim, setup = simulation(ServeOptions(preset="paper", systems="engine:cache=sparse,engine:cache=sparse,cuda_graphs=false",
                                         num_prompts=n, rps="inf", length_scale=0.25), hw)
    wl = next(iter(sim.workloads.values()))
    return {v.label: simulate_point(v, setup, wl, sim.preset.block_length) for v in sim.systems}


def _result(out: dict) -> tuple:
    r = out["result"]
    return r["duration"], [(x["request_id"], x["finished_time"]) for x in r["records"]]


def test_a_profile_where_graphs_lose_keeps_none_and_runs_as_without_graphs(monkeypatch):
    # The unfitted rtx4090 has no host time for a graph to save: a replay costs what the eager step
    # does (the warm-up's step fills its bucket), so no bucket keeps its graph.
    on, off = _paper_points(monkeypatch, load("rtx4090")).values()
    g = on["info"]["graphs"]
    assert on["info"]["graph_keep"] == "timed" and g["eager"] and not g["kept"]
    assert on["info"]["graphs_captured_at_warm_up"] == len(g["eager"])
    assert off["info"]["graph_keep"] is None
    assert _result(on) == _result(off)


def test_a_profile_where_graphs_win_keeps_them(monkeypatch):
    # A host-bound profile whose replay saves 8 ms of a step's 10 ms host time: every bucket keeps
    # its graph, and 8 requests (steps that fill their buckets, then fewer) run faster than eager.
    hw = load("rtx4090")
    hw = replace(hw, host={**hw.host, "engine": HostCost(c_step=10e-3, c_graph=-8e-3)})
    on, off = _paper_points(monkeypatch, hw, n=8).values()
    g = on["info"]["graphs"]
    assert g["kept"] and not g["eager"]
    assert on["result"]["duration"] < off["result"]["duration"]


def _runner(keep, charged: list) -> CostRunner:
    cfg = EngineConfig(dtype="float32", device="cpu", sampling=False, max_num_seqs=8, max_num_batched_tokens=64,
                       max_num_logits=32, cache="dual", cuda_graphs=True)
    model = tiny_config()
    return CostRunner(model, cfg, ModelShape.from_config(model, 4), lambda fw: charged.append(fw) or 1e-3,
                      VirtualClock(), graphs=True, keep=keep)


def _reuse(n: int, runner: CostRunner) -> list:
    reqs = warm_up_requests(n, "dual", 6 + BLOCK, BLOCK, 6, runner.model_config.mask_token_id, "cpu")
    return [(r, Phase.REUSE) for r in reqs]


def test_each_bucket_is_decided_once_on_the_step_its_engine_times():
    # 0.1 ms per query row; a replay saves 0.5 ms: one dummy (4 rows) costs less than it saves,
    # three cost more. A bucket first met in the point is decided on that step, padded vs not.
    price = lambda fw: 1e-4 * fw.query_tokens - 5e-4 * fw.graph  # noqa: E731
    asked, charged = [], []
    runner = _runner(lambda key, graph, eager: asked.append((graph.n_seq, len(graph.passes[0].segs)))
                     or keeps(price(graph), price(eager)), charged)
    runs = [(n, runner.run(_reuse(n, runner)).graph, charged[-1].capture) for n in (3, 5, 8, 4)]
    # 3 -> bucket 4 (1 dummy): kept, captured; 5 -> bucket 8 (3 dummies): eager, though captured;
    # 8 -> bucket 8: still eager; 4 -> bucket 4: its graph, nothing captured again
    assert runs == [(3, True, True), (5, False, True), (8, False, False), (4, True, False)]
    assert asked == [(3, 4), (5, 8)]                                  # priced once per bucket, never charged
    assert [len(fw.passes[0].segs) for fw in charged] == [4, 5, 8, 4]
    assert runner.decisions == {"kept": [[4, 16, BLOCK]], "eager": [[8, 16, BLOCK]]}


def test_warm_up_decides_its_buckets_on_full_ones_and_keep_all_keeps_every_one():
    price = lambda fw: 1e-4 * fw.query_tokens - 5e-4 * fw.graph  # noqa: E731
    asked, charged = [], []
    runner = _runner(lambda key, graph, eager: asked.append(graph.n_seq) or keeps(price(graph), price(eager)),
                     charged)
    assert runner.capture_graphs(BLOCK, 6, 8, lambda slots: True) == 4          # buckets 1, 2, 4, 8
    assert asked == [1, 2, 4, 8] and not charged                               # full: no dummies priced
    assert [k[0] for k in runner.decisions["kept"]] == [1, 2, 4, 8]
    assert runner.run(_reuse(5, runner)).graph and not charged[-1].capture      # taken at warm-up
    everything = _runner(None, [])                                             # keep-all: no price asked
    assert everything.run(_reuse(5, everything)).graph


def test_a_run_without_graph_keep_is_replayed_with_every_graph_kept(tmp_path):
    assert measured.graph_keep(H100_RUN) == "all"
    for rule in ("timed", "all"):
        d = tmp_path / rule
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"config": {"graph_keep": rule}}))
        assert measured.graph_keep(d) == rule
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"config": {"graph_keep": "some"}}))
    with pytest.raises(UserError, match="graph_keep must be timed or all"):
        measured.graph_keep(tmp_path / "bad")
    # The committed run's graphs engine on the fitted h100, whose replays cost more than eager
    # steps (c_graph > 0): replayed as it ran, with its graphs; the timed rule would keep none.
    (point,) = [p for p in measured.load([H100_RUN]) if p.label == "engine"]
    hw = load("h100")
    assert point.graph_keep == "all" and hw.host["dllm-bench/engine"].c_graph > 0
    assert any(fw.graph for fw in replay.replay(point, hw).forwards)
    assert not any(fw.graph for fw in replay.replay(replace(point, graph_keep="timed"), hw).forwards)



def test_a_recording_around_the_real_runner_follows_its_decisions():
    # calibrate's host fit wraps the engine's own runner: on CUDA a bucket whose graph timed slower
    # ran eager and unpadded, and its Forward must say so; plain calls on a CPU pad every bucket.
    from engine.step import StepStats

    class Inner:
        model = None

        def __init__(self, device: str, graph: bool):
            self.device, self.graph = torch.device(device), graph

        def run(self, batch):
            return StepStats(0, 0, 0, 0, len(batch), graph=self.graph)

    for device, graph, padded_to in (("cuda", False, 5), ("cuda", True, 8), ("cpu", False, 8)):
        charged = []
        runner = _runner(None, charged)
        runner.inner = Inner(device, graph)
        assert runner.run(_reuse(5, runner)).graph is graph
        assert (len(charged[-1].passes[0].segs), charged[-1].graph) == (padded_to, padded_to == 8)
