"""Cost formulas against the per-phase FLOPs/bytes of LLaDA-8B (docs/SIMULATE.md "Cost model":
one request, P = 256, L = 512, block 32), the operator-efficiency fit round trip on synthetic
timings, the hardware file and a malformed one (host time and the virtual clock's idle costs:
tests/test_host_time.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from dllm_bench.errors import UserError
from dllm_bench.simulate import drift
from dllm_bench.simulate.calibrate import operators as cal
from dllm_bench.simulate.cost_model import (
    CostModel,
    Efficiency,
    Forward,
    HostCost,
    LayerPass,
    ModelShape,
    Seg,
    gemm_time,
)
from dllm_bench.simulate.implementations import get_impl
from tests.helpers import one_error_line

LLADA_8B = ModelShape(d=4096, layers=32, heads=32, kv_heads=32, head_dim=128, ffn=12288, vocab=126464, wbytes=2)


def _flops(fw: Forward, part: str) -> float:
    """FLOPs of one part, by zeroing the others' inputs."""
    m = CostModel(LLADA_8B, 1e15, 1e12, Efficiency(), get_impl("engine"), HostCost())
    if part == "lm_head":
        return m.step(Forward((), rows=fw.rows)).flops
    if part == "linear":
        return m.step(Forward(tuple(LayerPass(p.layers, tuple(Seg(s.q, 0) for s in p.segs)) for p in fw.passes))).flops
    return m.step(fw).flops - _flops(fw, "linear") - _flops(fw, "lm_head")


L = 512
PHASES = {  # forward, (linear, LM head, attention) TFLOPs from the table
    "refresh, full logits": (Forward((LayerPass(32, (Seg(L, L),)),), rows=L), (7.15, 0.53, 0.137)),
    "refresh, block logits": (Forward((LayerPass(32, (Seg(L, L),)),), rows=32), (7.15, 0.033, 0.137)),
    "reuse, dual cache": (Forward((LayerPass(32, (Seg(32, L),)),), rows=32), (0.447, 0.033, None)),
    "reuse, sparse": (Forward((LayerPass(32, (Seg(32, 240 + 32),)),), rows=32), (0.447, 0.033, None)),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_llada_8b_flops_per_phase(phase):
    fw, (lin, lm, attn) = PHASES[phase]
    assert _flops(fw, "linear") / 1e12 == pytest.approx(lin, rel=0.01)
    assert _flops(fw, "lm_head") / 1e12 == pytest.approx(lm, rel=0.01)
    q, k = fw.passes[0].segs[0].q, fw.passes[0].segs[0].k
    # The table rounds the small attention cells to one digit: check the per-pair constant.
    assert _flops(fw, "attn") == pytest.approx(q * k * 524_288, rel=1e-9)
    if attn is not None:
        assert _flops(fw, "attn") / 1e12 == pytest.approx(attn, rel=0.01)


def test_llada_8b_shape_constants():
    m = LLADA_8B
    assert m.linear_flops_per_token == pytest.approx(13.96e9, rel=0.01)
    assert m.lm_head_flops_per_row == pytest.approx(1.036e9, rel=0.01)
    assert m.attn_flops_per_pair == 524_288
    assert m.kv_bytes_per_token == 512 * 1024
    assert m.weights_read_per_forward == pytest.approx(15.0e9, rel=0.01)
    assert m.n_params == pytest.approx(8_015_581_184 - 2 * m.d - 64 * m.d, rel=1e-3)  # norms are not GEMMs
    assert get_impl("hf-eager").elem_bytes_per_token_layer(m) == pytest.approx(0.71e6, rel=0.01)
    assert get_impl("engine").elem_bytes_per_token_layer(m) == 24 * m.d + 6 * m.ffn + 32 * m.d


def test_reuse_is_weight_bound_and_refresh_compute_bound():
    """4090 datasheet peaks, u = 1: the table's regimes (Reuse ≈ weight streaming, Refresh ≈ FLOPs)."""
    m = CostModel(LLADA_8B, 165.2e12, 1008e9, Efficiency(), get_impl("engine"), HostCost())
    reuse = m.step(PHASES["reuse, dual cache"][0])
    assert reuse.parts["gemm"] + reuse.parts["lm_head"] == pytest.approx(LLADA_8B.weights_read_per_forward / 1008e9, rel=0.05)
    fw = PHASES["refresh, full logits"][0]
    assert m.step(fw).parts["gemm"] == pytest.approx(_flops(fw, "linear") / 165.2e12, rel=0.01)


def test_efficiency_fit_round_trip():
    truth = Efficiency(u_c=0.42, u_m=0.7, u_attn=0.3, c_op=12e-6, c_attn=80e-6)
    peak, bw, w = 50e9, 10e9, 4
    grid = [cal.OpSample("gemm", mm, k, n, 0.0) for k, n in ((64, 192), (64, 64), (64, 256), (128, 64), (64, 512))
            for mm in (1, 4, 16, 64, 256, 1024)]
    grid += [cal.OpSample("attn", q, k, 64, 0.0) for q in (8, 32, 128) for k in (32, 128, 512)]
    samples = [cal.OpSample(s.kind, s.a, s.b, s.c, cal.predict(s, truth, peak, bw, w)) for s in grid]
    eff, fit = cal.fit_efficiency(samples, peak, bw, w)
    for name in ("u_c", "u_m", "u_attn", "c_op", "c_attn"):
        assert getattr(eff, name) == pytest.approx(getattr(truth, name), rel=0.02), name
    assert fit["max_rel_err"] < 1e-3


def test_gemm_roofline_regimes():
    e = Efficiency(u_c=0.5, u_m=0.5, c_op=1e-6)
    t_small = gemm_time(1, 4096, 4096, 2, 100e12, 1e12, e)
    assert t_small == pytest.approx(4096 * 4096 * 2 / 0.5e12 + 1e-6, rel=0.01)
    t_big = gemm_time(8192, 4096, 4096, 2, 100e12, 1e12, e)
    assert t_big == pytest.approx(2 * 8192 * 4096 * 4096 / 50e12 + 1e-6, rel=1e-9)


@pytest.mark.parametrize("content", ["{not json", json.dumps({"name": "x", "kind": "gpu", "peak_flops": -1,
                                                                 "bandwidth": 1e9, "memory_bytes": 1e9}),
                                     json.dumps({"name": "x", "kind": "tpu"}),
                                     json.dumps({"name": "x", "kind": "cpu", "peak_flops": 1e9, "bandwidth": 1e9,
                                                 "memory_bytes": 1e9,
                                                 "efficiency": {"u_c_by_m": [[64, 0.5], [16, 0.3]]}})])
def test_malformed_hardware_file_is_one_line_exit_2(tmp_path, content):
    bad = tmp_path / "hw.json"
    bad.write_text(content)
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "simulate", "--preset", "tiny", "--hardware", str(bad),
                        "--result-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=120)
    one_error_line(r, "hw.json")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("table", [[[0.1, 1e-4], [0.01, 2e-4]], [[0.0, 1e-4]], [[0.1, -1e-4]], [[0.1]], "late"])
def test_a_malformed_sleep_table_is_one_clear_error(table):
    from dllm_bench.simulate import hardware

    d = {"name": "x", "kind": "cpu", "peak_flops": 1e9, "bandwidth": 1e9, "memory_bytes": 1e9, "sleep_overshoot": table}
    with pytest.raises(UserError, match="'sleep_overshoot' must be a list of"):
        hardware.from_dict(d, "hw.json")


def test_u_c_table_interpolates_in_log_m():
    e = Efficiency(u_c=0.9, u_c_by_m=((16, 0.2), (256, 0.6)))
    assert e.u_c_at(1) == 0.2 and e.u_c_at(16) == 0.2 and e.u_c_at(4096) == 0.6
    assert e.u_c_at(64) == pytest.approx(0.4)                  # halfway in log M
    assert Efficiency(u_c=0.9).u_c_at(64) == 0.9               # no table: the scalar
    assert e.scaled(0.5).u_c_by_m == ((16, 0.1), (256, 0.3))


def test_per_m_fit_recovers_a_rising_gemm_efficiency():
    """GEMMs whose compute efficiency rises with M (as on a CPU): one scalar u_c cannot fit them,
    the per-M table recovers each row count's efficiency and the timings."""
    ms = (1, 4, 16, 64, 256, 1024)
    truth = Efficiency(u_c=1.0, u_m=0.7, c_op=5e-6, u_c_by_m=tuple(zip(ms, (0.05, 0.1, 0.2, 0.35, 0.6, 0.8))))
    peak, bw, w = 50e9, 10e9, 4
    grid = [cal.OpSample("gemm", mm, k, n, 0.0) for k, n in ((64, 192), (64, 64), (64, 256), (128, 64)) for mm in ms]
    grid += [cal.OpSample("attn", q, k, 64, 0.0) for q in (8, 32, 128) for k in (32, 128, 512)]
    samples = [cal.OpSample(s.kind, s.a, s.b, s.c, cal.predict(s, truth, peak, bw, w)) for s in grid]
    eff, fit = cal.fit_efficiency(samples, peak, bw, w)
    scalar = Efficiency(**{k: getattr(eff, k) for k in ("u_c", "u_m", "u_attn", "c_op", "c_attn")})
    scalar_err = max(abs(cal.predict(s, scalar, peak, bw, w) / s.t - 1) for s in samples if s.kind == "gemm")
    assert scalar_err > 0.2                                    # what one scalar leaves
    assert fit["median_rel_err"] < 0.02
    for m in (256, 1024):                                      # compute-bound rows come back
        assert eff.u_c_at(m) == pytest.approx(truth.u_c_at(m), rel=0.05), m


def test_operators_moved_to_another_machine_state_cost_f_times_more():
    eff = Efficiency(u_c=0.5, u_m=0.7, u_attn=0.6, c_op=4e-6, c_attn=9e-6, u_c_by_m=((1, 0.05), (256, 0.6)))
    fws = [Forward((LayerPass(32, (Seg(q, 300),)),), rows=q, n_seq=1) for q in (1, 32, 700)]
    base = CostModel(LLADA_8B, 50e12, 1e12, eff, get_impl("engine"), HostCost())
    peak, bw, moved = drift.at_state(50e12, 1e12, eff, 1.25)
    slow = CostModel(LLADA_8B, peak, bw, moved, get_impl("engine"), HostCost())
    for fw in fws:
        assert slow.step(fw).t_device == pytest.approx(1.25 * base.step(fw).t_device, rel=1e-9)
    assert drift.typical_state([3.0, 1.0, 2.0, 10.0, 2.5]) == 2.5


def test_hardware_file_round_trips_the_per_m_table(tmp_path):
    from dllm_bench.simulate import hardware

    eff = Efficiency(u_c=0.6, u_m=0.9, c_attn=3e-5, u_c_by_m=((1, 0.02), (64, 0.3), (1024, 0.7)))
    host = {"dllm-bench/engine": HostCost(c_step=1e-3, c_seq=2e-3, c_row=3e-6, wake_s=2e-3, wake_tau_s=0.07,
                                          c_add=8e-5)}
    hw = hardware.Hardware(name="t", kind="cpu", peak_flops=1e11, bandwidth=2e10, memory_bytes=1e9, efficiency=eff,
                           host=host, sleep_overshoot=((0.001, 9e-5), (0.3, 2.5e-4)))
    hardware.save(hw, tmp_path / "t.json")
    back = hardware.load(str(tmp_path / "t.json"))
    assert back.efficiency == eff and back.host == host and back.sleep_overshoot == hw.sleep_overshoot


def test_calibrate_writes_a_profile_with_the_per_m_table(tmp_path):
    from dllm_bench.simulate import hardware

    out = tmp_path / "hw.json"
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "calibrate", "--preset", "tiny", "--systems", "engine",
                        "--sizes", "1,2", "--repeats", "1", "--out", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    hw = hardware.load(str(out))
    assert len(hw.efficiency.u_c_by_m) >= 2 and hw.host_cost("dllm-bench", "engine").c_step >= 0
    assert hw.fit["sizes"] == [1, 2] and "median_err_by_rows" in hw.fit["host"]["engine"]
    assert set(hw.fit["host"]["engine"]["total_err_by_seqs"]) == {"1", "2"}
    assert hw.kind == "cpu" and hw.fit["device"] == "cpu" and hw.impl == "dllm-bench"
    # the speed gauge: read around the operators and around each timed batch size
    assert len(hw.fit["host"]["engine"]["speed_vs_operators"]) == 2
    tries = sum(sum(f["attempts"]) for f in hw.fit["host"].values())      # a batch re-timed reads the gauge again
    wake = hw.fit["host"]["engine"]["wake"]                         # a tiny request is timed after idle gaps
    assert wake["gaps_s"] == [0.001, 0.01, 0.03, 0.1, 0.3] and wake["request_s"] > 0
    host = hw.host_cost("dllm-bench", "engine")
    assert host.wake_s >= 0 and 0 < host.c_add < wake["request_s"]
    assert [dt for dt, _ in hw.sleep_overshoot] == wake["gaps_s"] and all(late >= 0 for _, late in hw.sleep_overshoot)
    g = hw.fit["speed_gauge_s"]
    assert len(g["readings"]) == 2 + 2 * tries and g["operators"] > 0
    assert g["profile"] == pytest.approx(float(np.median(g["readings"])))      # the state the profile describes
    bad = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "calibrate", "--preset", "tiny", "--sizes", "1,x",
                          "--out", str(tmp_path / "no.json")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "no.json").exists()


def _batch(size=1, length=512, prompt=256, step=5, block=0, forwards=8):
    """The fields of a static batch that decide a baseline's forward (baselines.static_batch.Batch)."""
    from types import SimpleNamespace
    s = prompt + 32 * block
    return SimpleNamespace(size=size, length=length, prompt_len=prompt, step_in_block=step, block=block,
                           block_range=(s, s + 32), forwards=forwards, pads=[0] * size)


def test_pre_rope_caches_re_rope_the_cached_keys_of_every_attending_layer():
    """Fast-dLLM (dual cache) and dLLM-Cache keep K before RoPE and rotate the whole key tensor in
    every attention call: each key that comes from the cache costs 56·d bytes per layer (the fresh
    keys' RoPE is in the per-token elementwise bytes). Sparse-dLLM caches K after RoPE: nothing."""
    from dllm_bench.simulate.work import baseline_forward
    knobs_cache = dict(prompt_interval=100, gen_interval=7, transfer_ratio=0.25)
    fast, _ = baseline_forward("fast-dllm", {"fast_dllm_cache": "dual"}, _batch(size=2), LLADA_8B)
    assert fast.cached_key_layers == 2 * (512 - 32) * 32
    cache, _ = baseline_forward("dllm-cache", knobs_cache, _batch(), LLADA_8B)     # an adaptive step: q = 64
    assert cache.cached_key_layers == (512 - 64) * 31                               # layer 0 always refreshes
    full, _ = baseline_forward("dllm-cache", knobs_cache, _batch(forwards=0), LLADA_8B)   # t = 1: all fresh
    assert full.cached_key_layers == 0
    sparse, _ = baseline_forward("sparse-dllm", {"keep_ratio": 0.5}, _batch(), LLADA_8B)
    assert sparse.cached_key_layers == 0
    bw = 1e12
    for fw, impl in ((fast, "hf-fast-dllm"), (cache, "hf-dllm-cache")):
        with_rope = CostModel(LLADA_8B, 1e15, bw, Efficiency(), get_impl(impl), HostCost()).step(fw)
        post_rope = replace(get_impl(impl), rope_bytes_per_key_d=0)
        without = CostModel(LLADA_8B, 1e15, bw, Efficiency(), post_rope, HostCost()).step(fw)
        extra = fw.cached_key_layers * 56 * LLADA_8B.d
        assert with_rope.bytes - without.bytes == pytest.approx(extra)
        assert with_rope.parts["elem"] - without.parts["elem"] == pytest.approx(extra / bw)
    # Fast-dLLM's float64 softmax over every logit row: 26 B per entry against the logits dtype's 6
    f64 = CostModel(LLADA_8B, 1e15, bw, Efficiency(), get_impl("hf-fast-dllm"), HostCost()).step(fast)
    f16 = CostModel(LLADA_8B, 1e15, bw, Efficiency(), replace(get_impl("hf-fast-dllm"), softmax_bytes_per_entry=6),
                    HostCost()).step(fast)
    assert f64.bytes - f16.bytes == pytest.approx(fast.softmax_rows * LLADA_8B.vocab * 20)


def test_cat_caches_move_each_cached_token_three_times():
    """Sparse-dLLM and dLLM-Cache torch.cat the cached K/V with the block's in every layer and then
    attend (read, write, read); Fast-dLLM writes its block into the cache in place (one read)."""
    assert get_impl("hf-eager").kv_copy == get_impl("hf-dllm-cache").kv_copy == 3
    assert get_impl("hf-fast-dllm").kv_copy == 1
    from dllm_bench.simulate.work import baseline_forward
    sparse, _ = baseline_forward("sparse-dllm", {"keep_ratio": 0.5}, _batch(), LLADA_8B)
    assert sparse.kv_read > 0
    bw = 1e12
    three = CostModel(LLADA_8B, 1e15, bw, Efficiency(), get_impl("hf-eager"), HostCost()).step(sparse)
    one = CostModel(LLADA_8B, 1e15, bw, Efficiency(), replace(get_impl("hf-eager"), kv_copy=1),
                    HostCost()).step(sparse)
    assert three.parts["kv"] - one.parts["kv"] == pytest.approx(2 * sparse.kv_read * LLADA_8B.kv_bytes_per_token / bw)


def test_every_registry_baseline_is_simulated_from_its_facts():
    """A baseline in baselines.SYSTEMS has a cost description (keyed by its policy), an upstream
    implementation profile and a Refresh peak: the simulator reads these, never its name."""
    from baselines import SYSTEMS
    from dllm_bench.simulate.implementations import default_impl, get_impl
    from dllm_bench.simulate.memory import baseline_bytes_per_token
    from dllm_bench.simulate.work import WORK, baseline_work

    for name, spec in SYSTEMS.items():
        assert baseline_work(name) is WORK[spec.policy]
        assert get_impl(default_impl(name, "gpu")).name == spec.upstream_impl
        peak = spec.refresh_peak
        assert baseline_bytes_per_token(name, LLADA_8B) == (
            peak.kv_copies * LLADA_8B.kv_bytes_per_token
            + LLADA_8B.vocab * (peak.logit_copies * LLADA_8B.wbytes + peak.fp64_logit_copies * 8))
    assert default_impl("engine", "gpu") == "engine"
    with pytest.raises(ValueError, match="no cost description"):
        baseline_work("no-such-system")


def test_a_baseline_peak_is_its_code_for_the_family():
    """Fast-dLLM's Dream code keeps its logits in the model dtype (LLaDA's upcasts two copies to
    float64), so on a Dream-7B shape its static batch is sized without the float64 copies."""
    from baselines import SYSTEMS
    from dllm_bench.simulate.memory import baseline_bytes_per_token, baseline_max_batch

    dream = ModelShape(d=3584, layers=28, heads=28, kv_heads=4, head_dim=128, ffn=18944, vocab=152064, wbytes=2,
                       qkv_bias=True, shift=1, family="Dream")
    as_llada = replace(dream, family="llada")
    assert SYSTEMS["fast-dllm"].peak_on("Dream").fp64_logit_copies == 0
    assert baseline_bytes_per_token("fast-dllm", dream) == dream.kv_bytes_per_token + dream.vocab * 3 * 2
    assert baseline_bytes_per_token("fast-dllm", as_llada) == (
        dream.kv_bytes_per_token + dream.vocab * (1 * 2 + 2 * 8))
    budget = 0.9 * 24 * 2**30
    assert baseline_max_batch("fast-dllm", dream, budget, 1024) > baseline_max_batch("fast-dllm", as_llada, budget, 1024)
    # a system whose code is the same on both families keeps one peak
    assert SYSTEMS["sparse-dllm"].peak_on("Dream") is SYSTEMS["sparse-dllm"].refresh_peak
