"""Fair comparisons between the engine and the baselines (issue 12, item 0), float64 exactness.

* Budget held: every system's profile fits the budget it was sized for, and a logit-aware
  profile leaves a larger KV pool than a monolithic one.
* Request shapes: the paper-comparison presets give every request one gen_length, so a static
  batch fills to its B instead of stopping at the first request of another shape.
* Retention: the engine keeps ⌊r·L_ctx⌋ context tokens per head, as Sparse-dLLM's code
  (`int(L_ctx * keep_ratio)` in CustomCache.filter_cache) — so with `selection=uniform` and the
  same knobs the engine emits the Sparse-dLLM baseline's tokens on ragged context lengths.
"""
from __future__ import annotations

import pytest
import torch

from baselines import SYSTEMS, make_system, profile_max_batch
from baselines.profile import measure_run
from engine import EngineConfig, SamplingParams
from engine.kv_cache import retained_tokens
from engine.profiler import profile_kv_pool
from engine.profiler import weights_bytes as weight_bytes
from tests.helpers import make_engine, random_prompts, tiny_model

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_model(F64)


@pytest.mark.parametrize("context_len,retention", [(7, 0.5), (11, 0.5), (10, 0.3), (9, 0.75), (3, 0.25), (100, 0.29)])
def test_retention_rounds_down_as_upstream(context_len, retention):
    assert retained_tokens(context_len, retention) == int(context_len * retention)


@pytest.mark.parametrize("retention", [0.5, 0.3])
def test_uniform_engine_equals_sparse_dllm_baseline_on_ragged_contexts(model, retention):
    # prompt lengths chosen so r * L_ctx is fractional for most of them: ⌈⌉ and ⌊⌋ differ there
    lengths = [5, 9, 12, 7, 14]
    prompts = random_prompts(len(lengths), lengths, seed=31)
    params = SamplingParams(gen_length=12, steps=12, block_length=4, seed=5)
    fractional = [(p + params.gen_length - params.block_length) * retention for p in lengths]
    assert sum(f != int(f) for f in fractional) >= 3
    eng = make_engine(model, cache="sparse", selection="uniform", retention=retention, pool_window=3,
                      delay_step=1, score_query="mean", max_num_logits=None)
    engine_tokens = [o.token_ids for o in eng.generate(prompts, params)]
    base = make_system("sparse-dllm", model, max_batch_size=1, keep_ratio=retention, kernel_size=3)
    base_tokens = [o.token_ids for o in base.generate(prompts, params)]
    assert engine_tokens == base_tokens


def test_context_too_short_to_keep_a_token_matches_the_baseline(model):
    """⌊0.5·1⌋ = 0: the Reuse steps attend to the block alone, in both implementations."""
    prompts = random_prompts(2, [1, 1], seed=3)
    params = SamplingParams(gen_length=4, steps=4, block_length=4, seed=2)
    eng = make_engine(model, cache="sparse", selection="uniform", retention=0.5, max_num_logits=None)
    base = make_system("sparse-dllm", model, max_batch_size=1, keep_ratio=0.5, kernel_size=3)
    assert [o.token_ids for o in eng.generate(prompts, params)] == [o.token_ids for o in base.generate(prompts, params)]


BUDGET = 6 * 2**20


@pytest.mark.parametrize("cache", ["none", "dual", "sparse"])
def test_engine_profile_fits_the_budget_and_the_logit_budget_frees_pool(cache):
    m32 = tiny_model(torch.float32)
    pools = {}
    for logits in (None, 16):
        cfg = EngineConfig(cache=cache, max_num_logits=logits, max_num_batched_tokens=256, memory_budget=BUDGET,
                           device="cpu", attention_backend="sdpa", sampling=False)
        p = profile_kv_pool(m32, cfg, "sdpa", 256)
        assert p.weights_bytes + p.activation_peak_bytes + p.guard_bytes + p.kv_pool_bytes <= BUDGET
        pools[logits] = p.kv_pool_tokens
    assert pools[16] > pools[None]


@pytest.mark.parametrize("system", [n for n, spec in SYSTEMS.items() if "llada" in spec.families])
def test_baseline_batch_fits_the_budget_and_one_more_does_not(system):
    m32 = tiny_model(torch.float32)
    shape = dict(prompt_len=24, gen_length=16, block_length=8)
    # Room for a few requests (the meter's per-operator cost grows with the batch searched).
    budget = weight_bytes(m32) + int(3.5 * measure_run(m32, 1, system=system, run_steps=3, **shape))
    b, peak = profile_max_batch(m32, budget, system=system, run_steps=3, **shape)
    assert b >= 2
    assert weight_bytes(m32) + peak <= budget
    assert weight_bytes(m32) + measure_run(m32, b + 1, system=system, run_steps=3, **shape) > budget


def test_monolithic_decode_costs_the_logits_of_an_hf_forward_and_no_row_copy():
    """The ablation's "logit budget off": [Nq, V] logits for every query row, as an HF forward
    returns them, and no further [R, V] copy of the decoded rows (which made a whole-generation
    block — the profiler's worst step — cost ~3x the logits)."""
    from engine.logits import MONOLITHIC_DECODE_ROWS, RowSegment, decode_rows
    from engine.profiler import MemoryMeter

    nq, d, v = 512, 16, 2048
    head = torch.nn.Linear(d, v, bias=False)
    hidden = torch.randn(nq, d)
    rows = torch.arange(16, nq)                     # a whole-generation block: most rows decode
    seg = [RowSegment(0, rows.numel(), 0.0, None)]
    with torch.no_grad(), MemoryMeter(torch.device("cpu")) as meter:
        out = decode_rows(head, hidden, rows, seg, None, mask_id=v - 1)
    logits_bytes = nq * v * 4
    assert meter.peak_bytes <= logits_bytes + 2 * MONOLITHIC_DECODE_ROWS * v * 4 + 64 * 1024
    assert out.rows_materialized == out.max_rows_at_once == nq
    with torch.no_grad():
        chunked = decode_rows(head, hidden, rows, seg, 7, mask_id=v - 1)
    # The same decisions; the confidences agree to float32 rounding only: a GEMM of 512 rows and
    # one of 7 may take different kernels and round differently (a few ulp under AVX2 kernels, none
    # under AVX-512 ones); 1e-5 is ~80 ulp, far below the gap between two rows' confidences.
    assert torch.equal(out.x0, chunked.x0)
    torch.testing.assert_close(out.conf, chunked.conf, rtol=1e-5, atol=0)


def _realised_batch(model, workload, batch: int) -> float:
    system = make_system("llada", model, max_batch_size=batch)
    for r in workload:
        system.add_request(r.prompt_ids, SamplingParams(gen_length=r.gen_length, steps=r.gen_length, block_length=8))
    while system.has_unfinished():
        system.step()
    sizes = system.stats()["batch_sizes"]
    return sum(sizes) / len(sizes)


def test_one_gen_length_lets_static_batches_fill():
    from dllm_bench.serve.presets import PRESETS
    from workloads.serving import build_workload

    assert PRESETS["cpu-default"].gen_length == 128 and PRESETS["paper"].gen_length == 256
    m32 = tiny_model(torch.float32)
    kw = dict(num_prompts=8, seed=3, vocab_size=290, length_scale=0.05, block_length=8, gen_cap=32)
    spread = build_workload("livebench", **kw)
    fixed = build_workload("livebench", **kw, fixed_gen_length=16)
    assert len({r.gen_length for r in spread}) > 1 and {r.gen_length for r in fixed} == {16}
    assert _realised_batch(m32, fixed, 4) == 4
    assert _realised_batch(m32, spread, 4) < 4
