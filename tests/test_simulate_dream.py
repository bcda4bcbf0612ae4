"""The simulator and the commands around it on a Dream model: the cost model from Dream-7B's
shape (GQA KV bytes, q/k/v biases, the 152k vocabulary), the engine's edge rule (a Reuse step
of a shifted model also queries the row before its block), a measured CPU run on `tiny-dream`
replayed step for step, and calibrate, profile-step, ablate, sweep, frontier and bench-gpu
taking a Dream model, each baseline it runs only where the registry gives it a Dream version."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from baselines.registry import SYSTEMS
from dllm_bench.checkpoints.presets import get_preset, model_params
from dllm_bench.simulate import hardware
from dllm_bench.simulate.cost_model import CostModel, Efficiency, Forward, LayerPass, ModelShape, Seg
from dllm_bench.simulate.fit import measured, replay
from dllm_bench.simulate.implementations import get_impl
from dllm_bench.simulate.work import engine_forward, graph_key, padded, warm_up_steps
from dllm_bench.systems.families import supports
from engine.config import EngineConfig
from engine.graphs import warm_up_plan
from engine.request import Phase, Request
from engine.sampling import SamplingParams
from tests.helpers import one_error_line, run_cli

DREAM = "Dream"
# A system with no Dream version (the plain LLaDA sampler runs LLaDA only): what a command must
# refuse when it is named, and leave out of its defaults.
LLADA_ONLY = next(s for s in SYSTEMS if not supports(s, DREAM))
TRACED = ("requests", "refresh", "query_rows", "logit_rows")


@pytest.fixture(scope="module")
def dream7b():
    return ModelShape.from_config(get_preset("dream-7b").model_config(), 2)


# ---------------------------------------------------------------- the cost model from the shape
def test_the_cost_model_reads_dream_7b_from_its_config(dream7b):
    """Dream-7B (28 layers, d 3584, 28 query / 4 KV heads of 128, vocabulary 152,064, q/k/v
    biases, shift 1) against LLaDA-8B (32 layers, 32 heads of 128, no GQA): KV per token, the
    biases' bytes, the logit row's weight in KV tokens."""
    m, llada = dream7b, ModelShape.from_config(get_preset("llada-8b").model_config(), 2)
    assert (m.layers, m.heads, m.kv_heads, m.head_dim, m.vocab, m.qkv_bias, m.shift) == \
        (28, 28, 4, 128, 152064, True, 1)
    assert m.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2           # K and V, every layer, bf16
    assert llada.kv_bytes_per_token / m.kv_bytes_per_token == pytest.approx(32 * 32 / (28 * 4))   # ~9x, exact ratio
    bias = 28 * (3584 + 2 * 4 * 128)                               # q, k, v biases of every layer
    assert m.weights_read_per_forward - replace(m, qkv_bias=False).weights_read_per_forward == bias * 2
    # the checkpoint's parameter count less what the cost model leaves out (norms; the embedding is a gather
    # and counted as the LM head's twin)
    cfg = get_preset("dream-7b").model_config()
    assert m.n_params == model_params(cfg) - (2 * 28 * 3584 + 3584)
    assert m.lm_head_flops_per_row == 2 * 3584 * 152064
    # a logit row weighs about 5 KV tokens on Dream-7B, half of one on LLaDA-8B (issue 57)
    assert 5 < m.vocab * m.wbytes / m.kv_bytes_per_token < 6
    assert llada.vocab * llada.wbytes / llada.kv_bytes_per_token < 0.5


def test_attention_moves_keys_at_the_kv_heads_width_and_biases_with_the_weights(dream7b):
    m = dream7b
    (flops, nbytes), = LayerPass(1, (Seg(33, 1000),)).attention(m)
    assert flops == 4.0 * 33 * 1000 * 28 * 128
    assert nbytes == (2 * 33 * 3584 + 2 * 1000 * 4 * 128) * 2      # queries/outputs at 28 heads, K/V at 4
    fw = Forward((LayerPass(m.layers, (Seg(33, 1000),)),), rows=32)
    eff, impl = Efficiency(u_c=0.5, u_m=0.5), get_impl("engine")
    hw = dict(peak_flops=700e12, bandwidth=3e12, eff=eff, impl=impl, host=hardware.HostCost())
    biased, plain = CostModel(m, **hw).step(fw), CostModel(replace(m, qkv_bias=False), **hw).step(fw)
    assert biased.bytes - plain.bytes == m.layers * (3584 + 2 * 512) * 2
    assert biased.flops - plain.flops == m.layers * 33 * (3584 + 2 * 512)
    assert biased.t > plain.t
    assert m.rank_share(2).kv_heads == 2 and m.rank_share(4).kv_heads == 1
    with pytest.raises(ValueError, match="kv_heads = 4"):      # 7 ranks split the 28 query heads, not the 4 KV heads
        m.rank_share(7)


# ---------------------------------------------------------------- the engine's edge rule
def _reuse(prompt: int, block: int, kv: int, shift: int) -> Request:
    r = Request("r", [5] * prompt, SamplingParams(gen_length=16, block_length=8, steps=16), 9, cache="dual",
                shift=shift)
    r.block, r.kv_tokens = block, kv
    return r


@pytest.mark.parametrize("shift", [0, 1])
def test_a_reuse_step_of_a_shifted_model_queries_its_edge_rows(dream7b, shift):
    """engine.step.StepMeta: a Reuse step's queries are its block and min(block start, shift) rows
    before it (query-only: never stored); monolithic logits cover every query row, a logit budget
    the block's masked rows only."""
    shape = replace(dream7b, shift=shift)
    req = _reuse(prompt=5, block=1, kv=21, shift=shift)
    fw, charged = engine_forward([(req, Phase.REUSE)], EngineConfig(max_num_logits=None), shape)
    assert fw.passes[0].segs == (Seg(8 + shift, 21),) and fw.kv_write == 8 and fw.kv_read == 21
    assert charged == [8 + shift] and fw.rows == 8 + shift
    fw, charged = engine_forward([(req, Phase.REUSE)], EngineConfig(max_num_logits=64), shape)
    assert charged == [8] and fw.query_tokens == 8 + shift


def test_graph_plans_count_the_edge_rows_against_the_token_budget(dream7b):
    """A bucket of b Reuse members needs b (block + shift) tokens: at a budget of exactly 4 blocks
    LLaDA captures the 4-bucket, Dream does not (engine.graphs.warm_up_plan, StepGraphs.takes)."""
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=32, cache="dual", cuda_graphs=True)
    sizes = {}
    for shift in (0, 1):
        steps = warm_up_steps(cfg, 8, 5, None, lambda n: True, 9, shift=shift)
        sizes[shift] = sorted(b for b, _, _ in steps)
        assert sizes[shift] == warm_up_plan(cfg, 8, 5, None, lambda n: True, shift)[2]
    assert sizes == {0: [1, 2, 4], 1: [1, 2]}
    batch = [(_reuse(5, 0, 21, 1), Phase.REUSE)] * 3
    assert graph_key(batch, cfg, shift=0) is not None and graph_key(batch, cfg, shift=1) is None
    two = batch[:2]
    key = graph_key([(_reuse(5, 0, 21, 1), Phase.REUSE)], cfg, shift=1)
    fw = padded(engine_forward(two[:1], cfg, replace(dream7b, shift=1))[0], (2, key[1], 8), shift=1)
    assert fw.passes[0].segs == (Seg(9, 21), Seg(9, 9)) and fw.kv_write == 16   # the dummy: its edge row too


# ---------------------------------------------------------------- a measured CPU run replayed
@pytest.fixture(scope="module")
def dream_run(tmp_path_factory):
    """`serve --model tiny-dream --trace-steps` on this CPU: the engine's default (cache=auto), its
    monolithic logits and its sparse cache; no timing is read."""
    import sys

    from dllm_bench import cli as entry

    root = tmp_path_factory.mktemp("dream-run")
    args = ["dllm-bench", "serve", "--model", "tiny-dream", "--preset", "tiny-dream", "--num-prompts", "4",
            "--num-warmups", "0", "--rps", "inf", "--trace-steps", "--no-projection",
            "--systems", "engine,engine:max_num_logits=none,engine:cache=sparse",
            "--result-dir", str(root), "--run-id", "run"]
    mp = pytest.MonkeyPatch()
    mp.setattr(sys, "argv", args)
    try:
        entry.main()
    except SystemExit as e:
        assert not e.code, e
    finally:
        mp.undo()
    return root / "run"


def test_a_measured_dream_run_is_replayed_with_the_steps_it_took(dream_run):
    """Step for step the same requests, Refreshes, query rows (block + edge row on Reuse) and
    logit rows as the run's trace (exact counters), on the CPU profile."""
    points = measured.load([dream_run])
    assert {p.label for p in points} == {"engine", "engine:max_num_logits=none", "engine:cache=sparse"}
    for p in points:
        assert p.steps and any(s["reuse"] for s in p.steps), p.key
        r = replay.replay(p, hardware.load("cpu"))
        sim = [{"requests": fw.n_seq, "refresh": fw.refresh, "query_rows": fw.query_tokens, "logit_rows": fw.rows}
               for fw in r.forwards]
        assert sim == [{k: s[k] for k in TRACED} for s in p.steps], p.key
    assert replay.setup_for(points[0], hardware.load("cpu")).shape.shift == 1


def test_simulate_validate_and_fit_replay_the_dream_run(dream_run, tmp_path, monkeypatch, capsys):
    r = run_cli(monkeypatch, capsys, "simulate", "--hardware", "cpu", "--model", "tiny-dream", "--preset", "tiny-dream",
                "--num-prompts", "4", "--rps", "inf", "--systems", "engine", "--result-dir", str(tmp_path),
                "--run-id", "sim", "--validate", str(dream_run))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "sim" / "validation.md").is_file()
    # --fit: a profile's step terms fitted to the Dream run, each point replayed as it ran
    out = tmp_path / "fit.json"
    r = run_cli(monkeypatch, capsys, "simulate", "--fit", str(dream_run), "--hardware", "cpu", "--name", "dreamfit",
                "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert hardware.load(str(out)).name == "dreamfit"


# ---------------------------------------------------------------- commands taking a Dream model
def test_simulate_and_calibrate_run_on_dream_and_refuse_a_baseline_it_lacks(tmp_path, monkeypatch, capsys):
    r = run_cli(monkeypatch, capsys, "simulate", "--model", "dream-7b", "--hardware", "h100", "--rps", "inf",
                "--num-prompts", "4", "--result-dir", str(tmp_path), "--run-id", "s7b", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    # the default systems, those with a Dream version (the engine always)
    systems = {p["system"] for p in json.loads((tmp_path / "s7b" / "summary.json").read_text())["points"]}
    assert "engine" in systems and all(supports(s.split(":")[0], DREAM) for s in systems)
    # tensor parallelism: Dream-7B's 4 KV heads split over 2 ranks, not 8 (28 query heads: nor 8)
    r = run_cli(monkeypatch, capsys, "simulate", "--model", "dream-7b", "--hardware", "h100", "--rps", "inf",
                "--num-prompts", "4", "--systems", "engine:tensor_parallel_size=2", "--result-dir", str(tmp_path),
                "--run-id", "tp2")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli(monkeypatch, capsys, "simulate", "--model", "dream-7b", "--hardware", "h100", "--rps", "inf",
                "--systems", "engine:tensor_parallel_size=8", "--result-dir", str(tmp_path), "--run-id", "tp8")
    one_error_line(r, "tensor-parallel size 8 does not divide")
    assert not (tmp_path / "tp8").exists()
    out = tmp_path / "cal.json"
    r = run_cli(monkeypatch, capsys, "calibrate", "--preset", "tiny-dream", "--out", str(out), "--repeats", "1",
                "--sizes", "1,2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert hardware.load(str(out)).kind == "cpu"
    for cmd in (["simulate", "--model", "tiny-dream", "--preset", "tiny-dream", "--rps", "inf",
                 "--result-dir", str(tmp_path), "--run-id", "bad"],
                ["calibrate", "--preset", "tiny-dream", "--out", str(tmp_path / "bad.json")]):
        r = run_cli(monkeypatch, capsys, *cmd, "--systems", f"engine,{LLADA_ONLY}")
        one_error_line(r, "Dream", LLADA_ONLY)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.json").exists()


def test_profile_step_profiles_the_engine_on_dream(monkeypatch, capsys):
    r = run_cli(monkeypatch, capsys, "profile-step", "--model", "tiny-dream", "--system", "engine", "--batch", "2",
                "--steps", "1", "--warmup", "0", "--prompt-len", "12", "--gen-length", "16", "--block-length", "8",
                "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["model"] == "tiny-dream" and doc["system"] == "engine" and doc["batch"] == 2
    r = run_cli(monkeypatch, capsys, "profile-step", "--model", "tiny-dream", "--system", LLADA_ONLY, "--batch", "1",
                "--steps", "1", "--json")
    one_error_line(r, LLADA_ONLY, DREAM)
    # two Reuse members query 2 x (block 8 + the edge row) = 18 tokens: over a budget of 17
    r = run_cli(monkeypatch, capsys, "profile-step", "--model", "tiny-dream", "--system",
                "engine:max_num_batched_tokens=17", "--phase", "reuse", "--batch", "2", "--steps", "1",
                "--prompt-len", "12", "--gen-length", "16", "--block-length", "8", "--json")
    one_error_line(r, "18 query tokens", "17")


def test_ablate_measures_every_rung_with_a_dream_version(tmp_path, monkeypatch, capsys):
    """The engine's rungs all run; the Sparse-dLLM baseline rung runs where the registry gives it a
    Dream version, else it stays in the table unmeasured (x vs it: n/a)."""
    r = run_cli(monkeypatch, capsys, "ablate", "--model", "tiny-dream", "--preset", "tiny-dream", "--datasets",
                "livebench", "--num-prompts", "2", "--cache-rows", "none", "--num-warmups", "0",
                "--result-dir", str(tmp_path), "--run-id", "ab")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "ab" / "ablation.json").read_text())
    rows = doc["ladder"]
    assert [row["system"].split(":")[0] for row in rows][1:] == ["engine"] * (len(rows) - 1)
    for row in rows:
        assert (row["throughput_tok_s"] is not None) == supports(row["system"].split(":")[0], DREAM), row
    assert (rows[1]["x_vs_baseline"] is not None) == supports(rows[0]["system"], DREAM)


def test_sweep_runs_on_dream_with_its_reference_where_it_has_one(tmp_path, monkeypatch, capsys):
    r = run_cli(monkeypatch, capsys, "sweep", "--model", "tiny-dream", "--preset", "tiny-dream", "--vary", "input-len",
                "--points", "8,16", "--num-prompts", "2", "--num-warmups", "0", "--result-dir", str(tmp_path),
                "--run-id", "sw")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    ref = doc["reference"]
    assert len(doc["table"]) == 2
    for row in doc["table"]:
        assert row["engine:cache=sparse tok/s"] > 0
        assert (row[f"{ref} tok/s"] is not None) == supports(ref, DREAM)
    r = run_cli(monkeypatch, capsys, "sweep", "--model", "tiny-dream", "--preset", "tiny-dream", "--vary", "input-len",
                "--systems", f"engine,{LLADA_ONLY}", "--result-dir", str(tmp_path), "--run-id", "bad")
    one_error_line(r, LLADA_ONLY, DREAM)
    assert not (tmp_path / "bad").exists()


def test_frontier_runs_the_configurations_with_a_dream_version(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    args = ["frontier", "--model", "tiny-dream", "--task", "synth", "--seeds", "1", "--limit", "2", "--repeats", "1",
            "--concurrency", "2", "--threads", "1", "--decoding", "fixed"]
    r = run_cli(monkeypatch, capsys, *args, "--run-id", "fr")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "fr" / "summary.json").read_text())["rows"]
    assert {"engine:cache=dual", "engine:cache=sparse"} <= {x["system"] for x in rows}
    assert all(supports(x["system"].split(":")[0], DREAM) and x["n"] == 2 for x in rows)
    r = run_cli(monkeypatch, capsys, *args, "--systems", f"engine:cache=dual,{LLADA_ONLY}", "--run-id", "bad")
    one_error_line(r, LLADA_ONLY, DREAM)
    assert not (tmp_path / "bad").exists()


def test_bench_gpu_plans_dream_7b_with_the_systems_it_has(tmp_path, monkeypatch):
    """`bench-gpu --model dream-7b`'s plan, made here as a GPU would make it (nothing runs): the
    serve steps run the systems with a Dream version, the model is the preset (made on the GPU)."""
    import dllm_bench.benchgpu.run as run
    from dllm_bench.benchgpu.record import StepRecord
    from dllm_bench.benchgpu.scale import CPU, FULL_SYSTEMS, GPU, SMALL_SYSTEMS
    from dllm_bench.benchgpu.steps import serve
    from dllm_bench.benchgpu.subcommand import Commands
    from dllm_bench.errors import UserError

    with pytest.raises(UserError, match="made on a CUDA device"):
        run.check_model("dream-7b", CPU)
    monkeypatch.setattr(run, "for_device", lambda device: GPU)
    bench, steps = run.prepare(run.Options(model="dream-7b", out=tmp_path / "b"), Commands({}))
    dream = lambda systems: tuple(s for s in systems if supports(s.split(":")[0], DREAM))  # noqa: E731
    assert bench.model == "dream-7b" and bench.full_systems == run.engine_aliases(dream(FULL_SYSTEMS))[0]
    assert bench.small_systems == dream(SMALL_SYSTEMS) and "engine" in bench.small_systems
    assert bench.document()["small_systems"] == list(bench.small_systems)
    calls = []

    class Outcome:
        ok, log = True, tmp_path / "b" / "logs" / "x.log"

        def reason(self):
            return ""

    monkeypatch.setattr(serve, "run_cli", lambda args, log, timeout_s: calls.append(args) or Outcome())
    serve.run_small(bench, StepRecord("serve-22g", 1.0))
    (args,) = calls
    assert args[args.index("--model") + 1] == "dream-7b" and args[args.index("--device") + 1] == "cuda"
    assert args[args.index("--systems") + 1] == ",".join(bench.small_systems)


def test_a_dream_serve_run_is_projected_on_dream_7b():
    """serve's GPU projection of a CPU run on a Dream model simulates Dream-7B's shape (not the
    paper preset's LLaDA-8B), and its reproducing command says so."""
    from dllm_bench.serve.options import ServeOptions, resolve_run
    from dllm_bench.simulate import projection

    run = resolve_run(ServeOptions(model="tiny-dream", systems="engine", num_prompts=2, rps="inf"))
    assert projection.skip_reason(run) is None
    proj = projection.project(run, min_requests=4)
    assert "--model dream-7b" in proj.command and proj.points and proj.points[0]["completed"] == 4
    llada = resolve_run(ServeOptions(model="tiny", systems="engine", num_prompts=2, rps="inf"))
    assert projection.projection_options(llada, 4).model is None       # the paper preset's own LLaDA-8B
