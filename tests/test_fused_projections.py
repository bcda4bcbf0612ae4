"""Fused q/k/v and gate/up projections (engine.models.DenseBlock.fuse): one GEMM each, the
checkpoint's layout and the model's memory unchanged, the same outputs in float64; a
tensor-parallel rank fuses its own slices, not a slice of the fused tensor."""
from __future__ import annotations

import torch

from engine.models import load_model
from engine.parallel.model import TPGroup, load_sharded, slice_of
from tests.helpers import tiny_model
from tests.test_parallel import write_checkpoint

F64 = torch.float64


def _dense(layer, q, k, v):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    w = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5, -1)
    return torch.einsum("hqk,khd->qhd", w, v)


def _hidden(model, ids):
    return model.hidden_states(ids, torch.arange(ids.numel()), _dense)


def _storage(t):
    return t.untyped_storage().data_ptr()


def test_a_loaded_model_is_fused_with_the_same_outputs_names_and_memory(tmp_path):
    ref = tiny_model(F64)
    model = load_model(write_checkpoint(ref, tmp_path / "m"), F64)
    blk = model.blocks[0]
    assert blk._qkv is not None and blk._gate_up is not None
    assert blk._qkv.shape[0] == sum(m.out_features for m in (blk.q_proj, blk.k_proj, blk.v_proj))
    # each projection's weight is a view of its group's fused tensor: no second copy
    assert {_storage(m.weight) for m in (blk.q_proj, blk.k_proj, blk.v_proj)} == {_storage(blk._qkv)}
    assert {_storage(m.weight) for m in (blk.ff_proj, blk.up_proj)} == {_storage(blk._gate_up)}
    assert model.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ref.state_dict().items())
    ids = torch.randint(0, ref.config.vocab_size, (19,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        fused, plain = _hidden(model, ids), _hidden(ref, ids)
    assert torch.allclose(fused, plain, rtol=1e-12, atol=1e-12)
    assert torch.equal(model.lm_head(fused).argmax(-1), ref.lm_head(plain).argmax(-1))


def test_a_cast_fuses_again_from_the_cast_weights(tmp_path):
    ref = tiny_model(F64)
    model = load_model(write_checkpoint(ref, tmp_path / "m"), F64).to(torch.float32)
    blk = model.blocks[1]
    assert blk._qkv.dtype == torch.float32 and _storage(blk.k_proj.weight) == _storage(blk._qkv)
    ids = torch.arange(7)
    with torch.no_grad():
        assert torch.allclose(_hidden(model, ids), _hidden(ref.to(torch.float32), ids), rtol=1e-5, atol=1e-5)


def test_a_tensor_parallel_rank_fuses_its_own_slices(tmp_path):
    ref = tiny_model(F64)
    path = write_checkpoint(ref, tmp_path / "m")
    full = ref.state_dict()
    for rank in (0, 1):
        tp = TPGroup(rank=rank, size=2, device=torch.device("cpu"), group=None, host_group=None)
        blk = load_sharded(path, tp, F64).blocks[0]
        mine = []
        for part in ("q_proj", "k_proj", "v_proj", "ff_proj", "up_proj"):
            name = f"model.transformer.blocks.0.{part}.weight"
            mine.append(full[name][slice_of(name, tuple(full[name].shape), rank, 2)])
        assert torch.equal(blk._qkv, torch.cat(mine[:3])) and torch.equal(blk._gate_up, torch.cat(mine[3:]))
        x = torch.randn(5, ref.config.d_model, dtype=F64)
        with torch.no_grad():
            q, k, v = blk.qkv(x, torch.arange(5), ref.rope)
            gu = blk.mlp(x)
            blk._qkv = blk._gate_up = None                     # the three / two GEMMs of an unfused block
            q0, k0, v0 = blk.qkv(x, torch.arange(5), ref.rope)
            assert torch.allclose(gu, blk.mlp(x), rtol=1e-12, atol=1e-12)
        assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in ((q, q0), (k, k0), (v, v0)))
