"""`dllm-bench profile-step` on the CPU: a step's time split adds up to its wall time, ops are
filed by the op and region around them (kernels by their launching op, or their name under a
CUDA graph), FLOPs match a hand count on the tiny model, each phase mix is the one asked for,
--json is one document, bad input is one line."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from dllm_bench.stepprofile import regions as labels
from dllm_bench.stepprofile import run as step_run
from dllm_bench.stepprofile.categories import BOOKKEEPING, CATEGORIES, STEP, breakdown, kernel_category
from dllm_bench.stepprofile.options import StepProfileOptions
from dllm_bench.stepprofile.run import profile_step
from engine.models import config_from_pretrained
from engine.regions import DECODE, LM_HEAD, region


@pytest.fixture
def fixed_peaks(monkeypatch):
    """The device's peaks as constants (measuring them takes a second of this CPU per run)."""
    monkeypatch.setattr(step_run, "measure_peaks", lambda dtype, repeats, dev: (1e10, 1e9))


def _sums_to_wall(detail: dict) -> None:
    total = sum(detail["categories_ms"].values())
    assert total == pytest.approx(detail["profiled_wall_ms"], rel=1e-9, abs=1e-6)
    assert set(detail["categories_ms"]) == set(CATEGORIES)
    assert min(detail["categories_ms"].values()) >= 0


# ---------------------------------------------------------------- the time split
def test_a_cpu_step_splits_into_categories_that_add_up_to_its_wall_time():
    x, w = torch.randn(32, 64), torch.randn(64, 64)
    q = torch.randn(1, 2, 16, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, labels.labelled():
        with torch.profiler.record_function(STEP):
            h = F.linear(x, w)                                     # GEMM (and its transposes)
            F.scaled_dot_product_attention(q, q, q)                # attention (and what it calls)
            idx = torch.arange(8)
            h = h[idx] + 1.0                                       # indexing, elementwise
            with region(LM_HEAD):
                logits = F.linear(h, w).float()                    # LM head, whatever the ops
            with region(DECODE):
                torch.topk(logits.softmax(-1), 2)                  # sampling
            with labels.profiler_range(BOOKKEEPING):
                time.sleep(0.02)                                   # not part of the step
    bd = breakdown(prof.events(), device=False)
    c = bd.categories_us
    assert sum(c.values()) == pytest.approx(bd.wall_us)
    for cat in ("gemm", "attention", "indexing", "elementwise", "lm_head", "sampling", "host_gap"):
        assert c[cat] > 0, cat
    assert c["copy_h2d"] == c["copy_d2h"] == 0
    step = next(e for e in prof.events() if e.name == STEP)
    assert bd.wall_us <= step.time_range.elapsed_us() - 20_000 + 1      # the bookkeeping is taken out
    names = {name for name, _ in bd.items}
    assert {("aten::mm", "gemm"), ("aten::mm", "lm_head"), ("aten::topk", "sampling")} <= set(bd.items)
    assert "aten::t" in names and ("aten::t", "gemm") in bd.items          # inside aten::linear


def _ev(name, start, end, *, kind="CPU", parent=None, annotation=False, id=0, linked=0):
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name=kind), time_range=SimpleNamespace(
        start=start, end=end, elapsed_us=lambda: end - start), cpu_parent=parent, is_user_annotation=annotation,
        is_async=False, thread=1, id=id, linked_correlation_id=linked, self_cpu_time_total=0.0)


def test_kernels_take_their_launching_ops_category_or_their_own_names():
    step = _ev(STEP, 0, 1000, annotation=True, id=1)
    lin = _ev("aten::linear", 10, 50, parent=step, id=2)
    mm = _ev("aten::mm", 12, 48, parent=lin, id=3)
    head = _ev(labels.LM_HEAD, 60, 90, parent=step, annotation=True, id=4)
    head_mm = _ev("aten::mm", 61, 89, parent=head, id=5)
    cp = _ev("aten::copy_", 100, 110, parent=step, id=6)
    kernels = [
        _ev("sm90_xmma_gemm_bf16bf16_bf16f32", 100, 200, kind="CUDA", linked=3),          # launched by mm
        _ev("nvjet_tst_128x64_64x8_1x1_v_bz", 200, 260, kind="CUDA", linked=5),           # in the LM head
        _ev("Memcpy HtoD (Pinned -> Device)", 260, 270, kind="CUDA", linked=6),
        _ev("Memcpy DtoH (Device -> Pageable)", 270, 275, kind="CUDA", linked=6),
        # a CUDA-graph replay: no aten op launched these, their names tell
        _ev("void flash_fwd_kernel<Flash_fwd_kernel_traits>", 300, 400, kind="CUDA", linked=1),
        _ev("void at::native::index_elementwise_kernel<128, 4>", 400, 420, kind="CUDA", linked=1),
        _ev("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>", 420, 430, kind="CUDA", linked=1),
        _ev("void at::native::reduce_kernel<512, 1, ArgMaxOps<float>>", 430, 440, kind="CUDA", linked=1),
        _ev(STEP, 5, 990, kind="CUDA", annotation=True, linked=1),      # the region's span on the GPU timeline
    ]
    bd = breakdown([step, lin, mm, head, head_mm, cp, *kernels], device=True)
    c = bd.categories_us
    assert c["gemm"] == 100 and c["lm_head"] == 60 and c["copy_h2d"] == 10 and c["copy_d2h"] == 5
    assert c["attention"] == 100 and c["indexing"] == 20 and c["elementwise"] == 10 and c["sampling"] == 10
    assert bd.busy_us == 315 and c["host_gap"] == 1000 - 315
    assert sum(c.values()) == bd.wall_us == 1000
    assert kernel_category("Memcpy DtoD (Device -> Device)") == "copy_d2d"
    assert kernel_category("some_unknown_kernel") == "other"


# ---------------------------------------------------------------- whole runs on the tiny model
def test_engine_reuse_steps_flops_match_a_hand_count():
    doc = profile_step(StepProfileOptions(system="engine:cache=dual", model="tiny", batch=2, phase="reuse", steps=2,
                                          warmup=1, prompt_len=20))
    json.dumps(doc)                                                  # one JSON document as it is
    assert doc["peaks"]["gemm_flops_per_s"] > 0 and doc["peaks"]["copy_bytes_per_s"] > 0
    assert doc["peaks"]["timer"] == "wall clock" and doc["device"] == "cpu"
    assert doc["steps"] == 2 and doc["unprofiled_steps"] == 2 and doc["discarded_steps"] == 0
    cfg = config_from_pretrained(doc["model_dir"])
    d, L, f, V = cfg.d_model, cfg.n_layers, cfg.mlp_hidden_size, cfg.padded_vocab
    hd, kv = cfg.head_dim, cfg.kv_heads * cfg.head_dim
    length, blk = 20 + doc["gen_length"], doc["block_length"]
    for s in doc["steps_detail"]:
        _sums_to_wall(s)
        assert (s["requests"], s["refresh"], s["reuse"], s["graph"]) == (2, 0, 2, False)
        assert s["query_rows"] == 2 * blk and s["key_tokens"] == 2 * length   # dual: the block against the canvas
        rows = 2 * blk
        gemm = 2 * rows * L * (d * (d + 2 * kv) + d * d + d * 2 * f + f * d)
        attention = 4 * cfg.n_heads * hd * L * 2 * blk * length
        lm_head = 2 * s["logit_rows"] * d * V
        assert s["work"]["gemm_flops"] == gemm and s["work"]["attention_flops"] == attention
        assert s["work"]["lm_head_flops"] == lm_head and s["work"]["flops"] == gemm + attention + lm_head
    w = doc["work"]
    assert 0 < w["fraction_of_gemm_peak"] and 0 < w["fraction_of_copy_bandwidth"] and w["bytes"] > 0
    assert len(doc["top"]) == 10 and doc["top"][0]["ms_per_step"] >= doc["top"][-1]["ms_per_step"]


@pytest.mark.parametrize("system, phase, batch, check", [
    ("fast-dllm", "refresh", 2, lambda c: c["refresh"] == 2 and c["query_rows"] == c["key_tokens"]),
    ("sparse-dllm", "reuse", 2, lambda c: c["reuse"] == 2 and c["query_rows"] < c["key_tokens"]),
    ("engine", "mixed", 2, lambda c: c["refresh"] == 1 and c["reuse"] == 1),
    # CPU "graphs": Reuse steps padded to the batch bucket with plain calls, never a replay
    ("engine:cuda_graphs=true", "reuse", 3, lambda c: c["padded_requests"] == 4 and c["requests"] == 3),
    ("llada", "serve", 1, lambda c: c["refresh"] == 1),
])
def test_each_phase_mix_is_the_one_asked_for(fixed_peaks, system, phase, batch, check):
    doc = profile_step(StepProfileOptions(system=system, model="tiny", batch=batch, phase=phase, steps=2, warmup=1))
    assert doc["steps"] == 2 and doc["graph_replays"] == {"profiled": 0, "unprofiled": 0}
    for s in doc["steps_detail"]:
        _sums_to_wall(s)
        assert check(s), s
        assert s["work"]["flops"] > 0
    assert doc["kind"] == ("engine" if system.startswith("engine") else "baseline")
    engine = system.startswith("engine")
    assert (doc["attention"] or "").startswith("attention: padded SDPA" if engine else "")
    if "cuda_graphs" in system:                    # the buckets the steps ran in: plain calls on a CPU
        buckets = {b["batch"]: b for b in doc["graph_buckets"]}         # the warm-up request's too
        assert buckets[4]["steps"] > 0 and {b["decision"] for b in buckets.values()} == {"plain"}
    else:
        assert not doc["graph_buckets"]


@pytest.fixture
def cli(cli_in_process):
    """cli(code, *args) -> (stdout, stderr) of `dllm-bench ARGS` in this process, which must exit `code`."""
    def run(code: int, *args: str) -> tuple[str, str]:
        r = cli_in_process(*args)
        assert r.returncode == code, r.stderr
        return r.stdout, r.stderr
    return run


def test_json_is_one_document_and_the_table_goes_to_stderr(cli, fixed_peaks):
    out, err = cli(0, "profile-step", "--model", "tiny", "--system", "fast-dllm", "--batch", "max-fit",
                   "--memory-budget", "2MiB", "--phase", "reuse", "--steps", "1", "--warmup", "0", "--json")
    doc = json.loads(out)
    assert doc["command"] == "profile-step" and doc["system"] == "fast-dllm" and doc["scenario"].startswith("max-fit")
    assert doc["batch"] > 1 and doc["composition"]["requests"] == doc["batch"]   # the largest batch in the budget
    assert {"peaks", "step", "composition", "work", "top", "steps_detail", "graph_replays"} <= set(doc)
    assert "time per step" in err and "host gaps" in err and "longest ops" in err


@pytest.mark.parametrize("args, msg", [
    (("--system", "nope"), "unknown system 'nope'"),
    (("--batch", "0"), "--batch must be >= 1"),
    (("--batch", "two"), "--batch must be a number"),
    (("--batch", "max-fit"), "give the engine a number"),
    (("--system", "engine,fast-dllm"), "names one system"),
    (("--system", "fast-dllm:batch=3", "--batch", "2"), "the static batch is --batch"),
    (("--phase", "sometimes"), "--phase must be one of"),
    (("--steps", "0"), "--steps must be in"),
    (("--batch", "65"), "max_num_seqs 64"),
    (("--system", "engine:cache=dual", "--batch", "40", "--prompt-len", "400"), "KV slots"),
    (("--batch", "40", "--phase", "refresh"), "token budget"),
    (("--system", "llada", "--phase", "reuse"), "no Reuse phase"),
    (("--phase", "mixed"), "--batch 2 or more"),
    (("--system", "fast-dllm", "--batch", "2", "--phase", "mixed"), "lock step"),
])
def test_bad_input_is_one_line_exit_2(cli, fixed_peaks, args, msg):
    _, err = cli(2, "profile-step", "--model", "tiny", *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], err
