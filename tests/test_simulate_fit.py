"""`simulate --fit`: a profile's step terms fitted to measured serve runs. The fit recovers the
terms a synthetic run was made with (from its per-step times within 2 %, from its totals alone
within 5 %); on the committed H100 run (tests/data/h100-2026-11-26) the built-in `h100` profile
it makes predicts every cell within 10 % and each system left out of the fit within 20 %; every
simulated GPU figure says how far its profile is off a real run."""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from dllm_bench.errors import UserError
from dllm_bench.simulate import hardware
from dllm_bench.simulate.cost_model import Efficiency, HostCost
from dllm_bench.simulate.fit import measured, replay, solve, terms
from dllm_bench.simulate.fit import run as fit_run
from tests.helpers import run_cli
from workloads.serving import ServingRequest

REPO = Path(__file__).resolve().parent.parent
H100_RUN = REPO / "tests" / "data" / "h100-2026-11-26"
LLADA_8B = {"d_model": 4096, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32, "mlp_hidden_size": 12288,
            "vocab_size": 126464, "padded_vocab": 126464, "max_sequence_length": 4096}
BASE = hardware.Hardware(name="gpu", kind="gpu", peak_flops=700e12, bandwidth=2.8e12, memory_bytes=80e9,
                         efficiency=Efficiency(u_c=0.9, u_m=0.9, u_attn=0.7, c_op=5e-6, c_attn=1e-5))
TRUTH = terms.Terms(device=1.3, host={
    terms.ENGINE: HostCost(c_step=3e-3, c_seq=0.6e-3, c_refresh=4e-3, c_logit=1e-6, c_graph=-1e-3, c_capture=0.2,
                           c_start=0.3),
    terms.STATIC: HostCost(c_step=2e-3, c_seq=0.3e-3, c_refresh=2e-3, c_logit=2e-6)})
ENGINE = {"max_num_batched_tokens": 1500, "max_num_logits": 512, "max_num_seqs": 16, "retention": 0.5,
          "cache": "sparse"}


def _run_dir(tmp_path: Path, **recorded) -> Path:
    d = tmp_path / "measured"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"kind": "serve", "config": {"model": LLADA_8B, "preset": {"dtype": "bfloat16", "block_length": 32},
                                       "memory_budget": 76e9, **recorded}}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _point(run_dir: Path, label: str, knobs: dict, info: dict, n: int, seed: int) -> measured.MeasuredPoint:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(100, 500, (n,), generator=g).tolist()
    reqs = [ServingRequest(f"r{i}", [measured.FILLER_TOKEN] * p, p, 64, 0.0, 64, "synthetic", p, 64)
            for i, p in enumerate(lens)]
    return measured.MeasuredPoint(run_dir, label, label, label.split(":")[0], "livebench", float("inf"), knobs, info,
                                  reqs, {}, {r.request_id: 0.0 for r in reqs}, 0.0, 0.0, 32,
                                  graph_capture=measured.graph_capture(run_dir), graph_keep=measured.graph_keep(run_dir))


def _measure(point: measured.MeasuredPoint, truth: terms.Terms) -> measured.MeasuredPoint:
    """The point as a machine obeying `truth` would record it: its steps, block times and totals."""
    prof = terms.profile(BASE, truth, [point.system], "truth")
    rep = replay.replay(point, prof)
    ends = [s + c for s, c in zip(rep.starts, rep.costs)]
    blocks = {rid: [ends[e] for e in idx] for rid, idx in rep.blocks.items()}
    steps = [{"step": i, "wall_ms": c * 1e3, "requests": fw.n_seq, "logit_rows": fw.rows, "graph": fw.graph,
              "padded_requests": len(fw.passes[0].segs) if fw.graph else fw.n_seq}
             for i, (fw, c) in enumerate(zip(rep.forwards, rep.costs))]
    return replace(point, block_times=blocks, steps=steps, duration=max(ends),
                   mean_e2el=sum(b[-1] for b in blocks.values()) / len(blocks))


def _points(tmp_path: Path, truth: terms.Terms, **recorded) -> list[measured.MeasuredPoint]:
    d = _run_dir(tmp_path, **recorded)
    specs = [("engine", {**ENGINE, "cuda_graphs": True}, {"kv_pool_tokens": 60000}, 12, 0),
             ("engine:cuda_graphs=False", {**ENGINE, "cuda_graphs": False}, {"kv_pool_tokens": 60000}, 12, 0),
             ("engine:max_num_batched_tokens=700", {**ENGINE, "max_num_batched_tokens": 700, "cuda_graphs": True},
              {"kv_pool_tokens": 60000}, 6, 1),
             ("fast-dllm", {}, {"max_batch_size": 5}, 8, 2),
             ("sparse-dllm", {"keep_ratio": 0.5}, {"max_batch_size": 8}, 8, 3),
             ("sparse-dllm:batch=3", {"keep_ratio": 0.5}, {"max_batch_size": 3}, 6, 4)]
    return [_measure(_point(d, *s), truth) for s in specs]


def _close(got: terms.Terms, want: terms.Terms, rel: float, columns: list[str]) -> None:
    g, w = got.vector(columns), want.vector(columns)
    for c, a, b in zip(columns, g, w, strict=True):
        assert a == pytest.approx(b, rel=rel, abs=1e-12), c


def test_the_fit_recovers_the_terms_a_run_was_made_with_from_its_steps(tmp_path):
    points = _points(tmp_path, TRUTH)
    reps = [replay.replay(p, BASE) for p in points]
    cols = solve.columns_for(reps)
    assert {"engine.c_graph", "engine.c_capture", "engine.c_start", "static-batch.c_refresh"} <= set(cols)
    assert "static-batch.c_graph" not in cols                  # no baseline replays a CUDA graph
    rows = [solve.observe(r, solve.features(r, terms.device_model(BASE, replay.setup_for(r.point, BASE).shape), cols))
            for r in reps]
    assert {r.evidence for r in rows} == {"steps"}
    _close(solve.solve(rows, cols, lam=0.0), TRUTH, 0.02, cols)
    # the same through the whole fit (rounds of replays), and the profile it writes charges the truth
    f = fit_run.fit(points, BASE, "fitted", evidence="steps", lam=0.0)
    _close(f.terms, TRUTH, 0.02, cols)
    assert all(abs(c[m + "_err"]) < 1e-6 for c in f.cells for m, _, _ in fit_run.METRICS)


def test_a_run_that_captured_graphs_at_warm_up_is_fitted_without_a_capture_term_in_its_points(tmp_path):
    # Its config.json says so (serve records it): its points replay graphs (c_graph) but capture none,
    # so no capture term enters the fit and the rest is recovered as before; what the machine took to
    # capture (TRUTH's c_capture) was spent at warm-up, outside every measured point.
    points = _points(tmp_path, TRUTH, graph_capture="warm-up")
    assert {p.graph_capture for p in points} == {"warm-up"}
    reps = [replay.replay(p, BASE) for p in points]
    assert any(fw.graph for r in reps for fw in r.forwards)
    assert not any(fw.capture for r in reps for fw in r.forwards)
    cols = solve.columns_for(reps)
    assert "engine.c_graph" in cols and "engine.c_capture" not in cols
    f = fit_run.fit(points, BASE, "fitted", evidence="steps", lam=0.0)
    _close(f.terms, TRUTH, 0.02, cols)
    assert all(abs(c[m + "_err"]) < 1e-6 for c in f.cells for m, _, _ in fit_run.METRICS)
    # a run recorded before the field (the old code) captured inside its points; an unknown value is refused
    assert measured.graph_capture(_run_dir(tmp_path / "old")) == "in-point"
    with pytest.raises(UserError, match="graph_capture must be warm-up or in-point"):
        measured.graph_capture(_run_dir(tmp_path / "bad", graph_capture="later"))


def test_a_traced_run_under_the_timed_keep_is_replayed_with_the_graphs_it_replayed(tmp_path):
    # On TRUTH (a replay 1 ms cheaper) the machine kept every bucket's graph; BASE prices a replay as
    # an eager step (no host time), so by prices the fit's first replay would keep none and never
    # see c_graph. The steps say which buckets replayed graphs: those are kept, and TRUTH is recovered.
    points = _points(tmp_path, TRUTH, graph_capture="warm-up", graph_keep="timed")
    graphs = [p for p in points if p.graph_keep == "timed" and p.graphs_replayed]
    assert len(graphs) == 2                              # the two engines with graphs
    reps = [replay.replay(p, BASE) for p in points]
    assert {fw.graph for r in reps if r.point in graphs for fw in r.forwards} == {True, False}
    f = fit_run.fit(points, BASE, "fitted", evidence="steps", lam=0.0)
    cols = solve.columns_for(reps)
    assert "engine.c_graph" in cols
    _close(f.terms, TRUTH, 0.02, cols)
    # untraced, the same points are kept by the prices of the profile replaying them: none on BASE
    untraced = replace(graphs[0], steps=None)
    assert untraced.graphs_replayed is None
    assert not any(fw.graph for fw in replay.replay(untraced, BASE).forwards)


def test_the_fit_recovers_the_terms_from_totals_and_block_times(tmp_path):
    # Totals alone (duration, mean E2EL: two numbers a point) hold fewer numbers than there are
    # terms: the truth here has the terms they can tell apart, the rest are where the prior holds them.
    truth = terms.Terms(device=1.25, host={terms.ENGINE: HostCost(c_step=4e-3, c_seq=0.5e-3),
                                           terms.STATIC: HostCost(c_seq=1e-3)})
    points = _points(tmp_path, truth)
    cols = ["device", "engine.c_step", "engine.c_seq", "static-batch.c_seq"]
    f = fit_run.fit(points, BASE, "fitted", evidence="totals", lam=1e-4)
    assert set(f.evidence.values()) == {"totals"}
    _close(f.terms, truth, 0.05, cols)
    f = fit_run.fit(points, BASE, "fitted", evidence="blocks", lam=0.0)
    assert set(f.evidence.values()) == {"blocks"}
    _close(f.terms, truth, 0.02, cols)


@pytest.fixture
def flash_standin(monkeypatch):
    """The flash-attn stand-in of tests/standins (runs on the CPU in bf16): keys read in place."""
    import sys

    monkeypatch.syspath_prepend(str(REPO / "tests" / "standins"))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    yield
    monkeypatch.undo()
    sys.modules.pop("flash_attn", None)


@pytest.mark.parametrize("cache, keys", [("sparse", "gathered"), ("auto", "gathered"), ("sparse", "in place")])
def test_graph_padding_and_warm_up_captures_are_the_engines(cache, keys, request):
    # The real engine on this CPU with cuda_graphs=True pads exactly as on a GPU (plain calls for
    # replays), after the warm-up capture serve makes: the simulator pads the same steps to the same
    # buckets, takes the same graphs at warm-up and captures the same others in the point. Keys are
    # gathered under padded SDPA (fp32) and read in place by a packed kernel (the flash-attn stand-in, bf16).
    # Plain calls here keep every bucket (no timing without CUDA): the simulator is pinned to keep them all.
    from dllm_bench.serve.loadgen import run_open_loop
    from dllm_bench.simulate.clock import VirtualClock, VirtualTimed
    from dllm_bench.simulate.cost_model import ModelShape
    from dllm_bench.simulate.simulator import SimSetup, simulate_point
    from dllm_bench.systems.build import WARM_UP_PROMPT, warm_up_batch
    from dllm_bench.systems.spec import parse_system
    from engine import EngineConfig, LLMEngine, SamplingParams
    from tests.helpers import tiny_model
    from workloads.serving import build_workload

    in_place = keys == "in place"
    if in_place:
        request.getfixturevalue("flash_standin")
    dtype, backend = ("bfloat16", "flash_attn") if in_place else ("float32", "sdpa")
    model = tiny_model(getattr(torch, dtype))
    wl = build_workload("livebench", num_prompts=7, rps=float("inf"), seed=1, vocab_size=298, special_ids=[],
                        length_scale=0.05, block_length=8, gen_cap=16)
    knobs = dict(max_num_batched_tokens=200, max_num_logits=20, max_num_seqs=8, retention=0.5, cuda_graphs=True,
                 cache=cache, attention_backend=backend)
    eng = LLMEngine(EngineConfig(dtype=dtype, device="cpu", sampling=False, kv_pool_tokens=400, **knobs), model=model)
    graphs = eng.runner.graphs
    assert eng.capture_graphs(8, len(wl[0].prompt_ids[:WARM_UP_PROMPT]), warm_up_batch(len(wl), None)) > 0
    at_warm_up = len(graphs.entries)
    clock = VirtualClock()
    params = lambda it: SamplingParams(gen_length=it.gen_length, steps=it.gen_length, block_length=8)  # noqa: E731
    run_open_loop(VirtualTimed(eng, clock, lambda: []), wl, params, clock=clock.now, sleep=clock.sleep)
    assert graphs.replays > 0 and graphs.dummies > 0
    assert {k[1] == 0 for k in graphs.entries} == {in_place}             # static keys: 0 = read in place
    seen = []
    cfg = model.config
    setup = SimSetup(cfg, ModelShape.from_config(cfg, 4), hardware.load("h100"), dtype, {"engine": "engine"},
                     memory_budget=1e12, engine_defaults=knobs, real_capacity=lambda v, seed=None: {"kv_pool_tokens": 400},
                     cost_fn=lambda fw: seen.append(fw) or 1e-3, pinned={"engine": {"graph_keep": "all"}})
    info = simulate_point(parse_system("engine"), setup, wl, 8)["info"]
    assert info["graph_capture"] == "warm-up" and info["graphs_captured_at_warm_up"] == at_warm_up
    padded = [fw for fw in seen if fw.graph]
    assert len(padded) == graphs.replays
    assert sum(len(fw.passes[0].segs) - fw.n_seq for fw in padded) == graphs.dummies
    assert sum(fw.capture for fw in seen) == len(graphs.entries) - at_warm_up
    assert (len(graphs.entries) == at_warm_up) == in_place             # in place: the warm-up's graphs serve all
    assert sum(fw.first for fw in seen) == 1 and seen[0].first


@pytest.mark.slow
def test_the_committed_h100_run_is_fitted_within_the_goals(tmp_path):
    """The built-in h100 is what `simulate --fit` makes of the committed run on its calibrate
    operators: every cell within 10 %, each system predicted from the others within 20 %."""
    points = measured.load([H100_RUN])
    assert {p.label for p in points} == {"engine", "engine:cuda_graphs=False", "fast-dllm", "sparse-dllm"}
    base = hardware.load(str(H100_RUN / "calibrate.json"))
    f = fit_run.fit(points, base, "h100")
    assert set(f.evidence.values()) == {"blocks"}               # the run predates steps.jsonl
    assert fit_run.worst(f.cells) <= 0.10
    held = fit_run.leave_one_out(points, base, "h100")
    assert len(held) == 4 and fit_run.worst(held) <= 0.20
    built_in = hardware.load("h100")
    assert built_in.validation["within"] == pytest.approx(fit_run.worst(f.cells), abs=1e-6)
    assert built_in.validation["leave_one_out"] == pytest.approx(fit_run.worst(held), abs=1e-6)
    # The refit reproduces the committed profile field by field. The bounded least squares runs on
    # the CPU's BLAS/LAPACK kernels (AVX2, AVX-512, AMX), which round differently: the terms differ
    # in their last digits (up to ~1e-14 relative) per CPU kind; 1e-4 still catches any change to the fit.
    assert set(built_in.host) == set(f.profile.host)
    for key, h in f.profile.host.items():
        assert asdict(built_in.host[key]) == pytest.approx(asdict(h), rel=1e-4), key
    assert built_in.efficiency.u_c == pytest.approx(f.profile.efficiency.u_c, rel=1e-4)


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    r = run_cli(monkeypatch, capsys, *args)
    return r.returncode, r.stdout, r.stderr


def test_simulate_validate_on_the_committed_h100_run_meets_the_goal_and_says_so(tmp_path, monkeypatch, capsys):
    # The run's own options; every system is simulated as it ran there (knobs, KV pool, batch),
    # in this project's implementation, whatever today's defaults are.
    monkeypatch.setenv("DLLM_BENCH_CACHE", str(tmp_path / "cache"))
    code, out, err = _cli(monkeypatch, capsys, "simulate", "--preset", "paper", "--model", "llada-8b", "--hardware",
                          "h100", "--rps", "inf", "--num-prompts", "32", "--systems",
                          "engine,engine:cuda_graphs=false,fast-dllm,sparse-dllm", "--validate", str(H100_RUN),
                          "--result-dir", str(tmp_path), "--run-id", "v", "--json")
    assert code == 0, err[-3000:]
    err = " ".join(err.split())
    label = hardware.load("h100").validation_label(short=True)
    assert label.startswith("validated on NVIDIA H100 80GB HBM3, 2026-11-26 within")
    assert f"simulated on h100 ({label})" in err                                  # the table's title
    assert "engine = dllm-bench (this project's code, as serve measures it)" in err
    assert "fast-dllm: as measured: static batch B=18" in err
    cells = pd.DataFrame(json.loads(out)["validation"]["cells"])
    assert len(cells) == 4
    assert (cells["output_throughput_err"].abs() <= 0.10).all() and (cells["mean_e2el_ms_err"].abs() <= 0.10).all()
    assert "implementation per system: engine = dllm-bench" in (tmp_path / "v" / "validation.md").read_text()
    # the report's section of this simulated run carries the label too
    from dllm_bench.report.claims import Claims
    from dllm_bench.report.simulated import simulated_section

    text = simulated_section(tmp_path / "v", Claims(), tmp_path / "files", tmp_path)
    assert label in " ".join(text.split())


def test_fit_cli_writes_a_profile_simulate_reads_and_refuses_bad_input(tmp_path, monkeypatch, capsys):
    out = tmp_path / "mine.json"
    code, _, err = _cli(monkeypatch, capsys, "simulate", "--fit", str(H100_RUN), "--hardware",
                        str(H100_RUN / "calibrate.json"), "--name", "mine", "--out", str(out), "--no-leave-one-out",
                        "--fit-evidence", "totals")
    assert code == 0, err[-3000:]
    err = " ".join(err.split())
    assert "fitted on its totals (duration, mean E2EL)" in err and "| fast-dllm | livebench | inf |" in err
    hw = hardware.load(str(out))
    assert hw.impl == "dllm-bench" and set(hw.host) >= {"dllm-bench/engine", "dllm-bench/fast-dllm", "dllm-bench"}
    assert hw.validation_label().startswith("validated on NVIDIA H100 80GB HBM3, 2026-11-26 within")
    assert "leave_one_out" not in hw.validation
    for bad, msg in ((["--fit", str(H100_RUN)], "--fit needs --hardware"),
                     (["--fit", str(tmp_path / "none"), "--hardware", "h100", "--name", "x"], "--fit: no run"),
                     (["--fit", str(H100_RUN), "--hardware", "h100", "--name", "x", "--fit-evidence", "all"],
                      "--fit-evidence must be"),
                     (["--name", "x"], "--name and --out apply to --fit only")):
        code, _, err = _cli(monkeypatch, capsys, "simulate", *bad)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and msg in lines[0], err[-2000:]


def test_a_points_steps_jsonl_is_its_evidence_when_it_matches_the_replay(tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(H100_RUN, run)
    for p in (run / "points").iterdir():
        if p.name != "livebench__fast-dllm__rpsinf":
            shutil.rmtree(p)
    (point,) = measured.load([run])
    rep = replay.replay(point, hardware.load("h100"))
    steps = [{"step": i, "t_s": s, "wall_ms": c * 1e3, "requests": fw.n_seq, "padded_requests": fw.n_seq,
              "refresh": fw.refresh, "reuse": fw.n_seq - fw.refresh, "query_rows": fw.query_tokens,
              "key_tokens": fw.kv_read, "logit_rows": fw.rows, "graph": fw.graph}
             for i, (fw, s, c) in enumerate(zip(rep.forwards, rep.starts, rep.costs))]
    path = run / "points" / "livebench__fast-dllm__rpsinf" / "steps.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in steps))
    (point,) = measured.load([run])
    assert point.evidence == "steps"
    rep = replace(rep, point=point)
    cols = solve.columns_for([rep])
    dev = terms.device_model(BASE, replay.setup_for(point, BASE).shape)
    assert solve.observe(rep, solve.features(rep, dev, cols)).evidence == "steps"
    # steps of another schedule (a run whose steps are not the replay's) fall back to block times
    path.write_text("".join(json.dumps(s) + "\n" for s in steps[:-5]))
    (point,) = measured.load([run])
    rep = replace(rep, point=point)
    assert solve.observe(rep, solve.features(rep, dev, cols)).evidence == "blocks"
