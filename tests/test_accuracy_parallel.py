"""`dllm-bench accuracy --tensor-parallel-size N` and the lm-eval backend's `tensor_parallel_size`
(docs/ACCURACY.md, docs/PARALLEL.md): every engine point runs on 2 gloo ranks of its own, started
for it and stopped after it, and gives exactly the completions of one process in float64; the
baselines stay on one device; a size that cannot run is one UserError before anything is
spawned; no worker outlives a point, the run, or a point that fails."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

import engine
from dllm_bench.accuracy import backend as acc_backend
from dllm_bench.accuracy.run import AccuracyOptions, accuracy
from dllm_bench.errors import UserError
from tests.test_parallel_cli import _workers

# dense, two sparse selections and a baseline over the same 4 questions of tiny-math's own task
RUN = dict(model="tiny-math", task="synth", limit=4, retention="0.3", selection="head,uniform", r1=False,
           dtype="float64", system="engine,sparse-dllm")
POINTS = ["dense", "head-r0.3", "uniform-r0.3", "sparse-dllm-r0.3"]


def _samples(run_dir, point):
    return [json.loads(x) for x in (run_dir / "points" / point / "samples.jsonl").read_text().splitlines()]


@pytest.fixture
def builds(monkeypatch):
    """Each tensor-parallel engine built, with the workers alive when it was asked for."""
    seen = []
    real = engine.open

    def spy(cfg, model=None, runner=None, **kw):
        if cfg.tensor_parallel_size > 1:
            seen.append((cfg.tensor_parallel_size, cfg.cache, cfg.selection, _workers(os.getpid())))
        return real(cfg, model, runner, **kw)
    monkeypatch.setattr(engine, "open", spy)
    return seen


def test_tp2_gives_tp1_completions_and_stops_every_points_ranks(tmp_path, builds):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)          # shared out: 2 ranks x 1 thread; restored for the baseline
    try:
        accuracy(AccuracyOptions(**RUN, tensor_parallel_size=2), result_dir=tmp_path, run_id="tp2", as_json=True)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    accuracy(AccuracyOptions(**RUN), result_dir=tmp_path, run_id="tp1", as_json=True)

    # one engine per engine point, each on fresh ranks: the previous point's were gone
    assert [(n, c, s) for n, c, s, _ in builds] == [(2, "none", "head"), (2, "sparse", "head"), (2, "sparse", "uniform")]
    assert all(alive == [] for *_, alive in builds)
    assert _workers(os.getpid()) == [] and not dist.is_initialized()

    tp1, tp2 = tmp_path / "tp1", tmp_path / "tp2"
    for p in POINTS:
        a, b = _samples(tp1, p), _samples(tp2, p)
        assert [(s["question"], s["token_ids"], s["completion"]) for s in a] == \
               [(s["question"], s["token_ids"], s["completion"]) for s in b], p
    rows = {r["point"]: r for r in json.loads((tp2 / "summary.json").read_text())["points"]}
    assert [rows[p]["tensor_parallel_size"] for p in POINTS] == [2, 2, 2, 1]
    assert all("tensor_parallel_size" not in r for r in json.loads((tp1 / "summary.json").read_text())["points"])
    cfg = json.loads((tp2 / "config.json").read_text())["config"]
    assert cfg["tensor_parallel_size"] == 2 and cfg["threads_per_rank"] == 1


def test_a_failing_point_stops_its_ranks(tmp_path, builds):
    """A request the model cannot hold (prompt + 4096 > 4096 positions) fails the dense point after
    its ranks started: one UserError, and the ranks are gone."""
    with pytest.raises(UserError, match="^dense: "):
        accuracy(AccuracyOptions(**{**RUN, "limit": 1}, gen_length=4096, tensor_parallel_size=2),
                 result_dir=tmp_path, run_id="long", as_json=True)
    assert len(builds) == 1
    assert _workers(os.getpid()) == [] and not dist.is_initialized()


@pytest.mark.parametrize("tp, says", [(3, "tensor-parallel size 3 does not divide n_heads = 4"),
                                      (0, "--tensor-parallel-size must be >= 1")])
def test_a_bad_size_is_one_error_before_any_spawn(tp, says, tmp_path, builds):
    from typer.testing import CliRunner

    from tests.test_accuracy import _app

    r = CliRunner().invoke(_app(), ["--model", "tiny-math", "--limit", "2", "--tensor-parallel-size", str(tp),
                                    "--result-dir", str(tmp_path)])
    assert isinstance(r.exception, UserError) and says in str(r.exception)
    assert "\n" not in str(r.exception)
    assert builds == [] and not any(tmp_path.iterdir()) and not dist.is_initialized()


def test_under_torchrun_it_is_one_error(tmp_path, builds, monkeypatch):
    """torchrun's processes are one group for the whole command; a point's ranks cannot be."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="without torchrun"):
        accuracy(AccuracyOptions(**RUN, tensor_parallel_size=2), result_dir=tmp_path, run_id="tr", as_json=True)
    assert builds == [] and not any(tmp_path.iterdir()) and not dist.is_initialized()


def test_lm_eval_backend_tensor_parallel_size(builds):
    """model_args tensor_parallel_size=2: the same completions as one process, its ranks stopped
    after the call; a baseline or a size that does not split is refused before any spawn."""
    prompts = ["Question: Mia has 3 apples. How many apples does Mia have?\nAnswer:",
               "Question: Tom has 7 pens and 2 cups. How many cups does Tom have?\nAnswer:"]
    args = {"model": "tiny-math", "dtype": "float64", "retention": "0.5", "selection": "uniform"}
    tp2 = acc_backend.engine_backend({**args, "tensor_parallel_size": "2"})
    assert tp2.model is None and tp2.tensor_parallel_size == 2
    got = tp2(prompts, {"max_gen_toks": 16})
    assert len(builds) == 1 and _workers(os.getpid()) == [] and not dist.is_initialized()
    tp1 = acc_backend.engine_backend(args)
    assert got == tp1(prompts, {"max_gen_toks": 16})
    assert [o.token_ids for o in tp2.outputs] == [o.token_ids for o in tp1.outputs]
    with pytest.raises(ValueError, match="applies to the engine only"):
        acc_backend.engine_backend({**args, "system": "llada", "tensor_parallel_size": "2"})
    with pytest.raises(UserError, match="does not divide"):
        acc_backend.engine_backend({**args, "tensor_parallel_size": "3"})
    assert len(builds) == 1
