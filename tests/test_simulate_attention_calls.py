"""The cost model charges the engine's attention calls as the engine makes them. On the padded
path (a CPU) each step's calls (work.padded_calls: the Refresh and Reuse groups, split by the key
budget, every member padded to its chunk's longest queries and keys) are, step for step, the
padded SDPA calls engine.step_context runs in every layer; a replay hands a point's requests
over in the order serve did, whatever order requests.jsonl lists them in."""
from __future__ import annotations

import pytest
import torch

from dllm_bench.simulate.clock import VirtualClock
from dllm_bench.simulate.cost_model import Call, Forward, LayerPass, ModelShape, Seg
from dllm_bench.simulate.fit import measured
from dllm_bench.simulate.runners import CostRunner
from engine import EngineConfig, LLMEngine, SamplingParams, step_context
from tests.helpers import tiny_model


@pytest.mark.parametrize("cache", ["dual", "sparse", "auto"])
def test_padded_attention_calls_are_the_engines(monkeypatch, cache):
    torch.manual_seed(0)
    model = tiny_model(torch.float32)
    # the token budget (120) bounds a call's padded keys, so a Reuse group of three canvases splits
    cfg = EngineConfig(dtype="float32", device="cpu", sampling=False, cache=cache, kv_pool_tokens=400,
                       max_num_batched_tokens=120, max_num_logits=16, max_model_len=48)
    engine = LLMEngine(cfg, model=model)
    fws: list[Forward] = []
    engine.runner = CostRunner(model.config, cfg, ModelShape.from_config(model.config, 4),
                               lambda fw: fws.append(fw) or 0.0, VirtualClock(), model.dtype, inner=engine.runner)
    seen: list[tuple[int, int, int]] = []
    real = step_context.padded_attention

    def record(q, k, v, bias):
        seen.append((q.shape[0], q.shape[1], k.shape[1]))
        return real(q, k, v, bias)

    monkeypatch.setattr(step_context, "padded_attention", record)
    params = SamplingParams(gen_length=16, steps=16, block_length=8)
    for n in (15, 23, 31, 9):
        engine.add_request(list(range(5, 5 + n)), params)
    split = mixed = 0
    while engine.has_unfinished():
        seen.clear()
        engine.step()
        (p,) = fws[-1].passes
        assert p.calls is not None and len(seen) == model.config.n_layers * len(p.calls)
        assert [tuple(c) for c in p.calls] == seen[: len(p.calls)], len(fws)
        mixed += fws[-1].refresh not in (0, fws[-1].n_seq)
        split += len(p.calls) > 1 + (fws[-1].refresh not in (0, fws[-1].n_seq))
    assert split and mixed                     # a chunked group and a mixed step were both met


def test_a_padded_call_costs_what_its_padded_shape_does():
    m = ModelShape(d=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=512, wbytes=4)
    segs = (Seg(8, 20), Seg(8, 40))
    packed = LayerPass(2, segs)
    padded = LayerPass(2, segs, calls=(Call(2, 8, 40),))
    # queries read and outputs written at the 4 query heads' width (64), keys and values at the 2 KV heads' (32)
    assert packed.attention(m) == [(8 * 60 * 4.0 * 64, (2 * 16 * 64 + 2 * 60 * 32) * 4)]
    assert padded.attention(m) == [(2 * 8 * 40 * 4.0 * 64, 2 * (2 * 8 * 64 + 2 * 40 * 32) * 4)]


def test_a_replay_admits_requests_in_the_order_serve_handed_them_over(tmp_path):
    recs = [{"request_id": f"livebench-{i}", "prompt_len": 10 + i, "output_len": 8, "arrival_time": t,
             "first_token_time": 1.0, "itl": []} for i, t in ((3, 0.0), (10, 0.0), (1, 0.5), (0, 0.0), (2, 0.0))]
    order = [r["request_id"] for r in measured.workload_order(recs)]
    assert order == ["livebench-0", "livebench-2", "livebench-3", "livebench-10", "livebench-1"]
