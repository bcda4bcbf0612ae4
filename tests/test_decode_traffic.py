"""The logit decode's memory traffic (engine.logits, engine.unmask.confidence_at): a greedy
chunk is read four times and written twice in its own dtype (argmax; the confidence's shift, exp
and float32-accumulated sum in place), never copied to float32 (bf16: 12 bytes per logit entry
where the copy took 28). Counted here from the operators a decode dispatches, so the count cannot drift:
every [R, V] tensor an operator reads or writes (a gather reads only its R picks, a view moves
nothing). Exactness: float32 / float64 confidences are bit for bit the former copy's; bf16 ones
are float32 sums within a few parts in a thousand of the float64 softmax."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.logits import RowSegment, by_rule
from engine.unmask import confidence_at

R, V, MASK = 48, 4096, 4095
VIEWS = {"select", "unsqueeze", "view", "slice", "expand", "alias", "lift_fresh", "detach"}


class Traffic(TorchDispatchMode):
    """Bytes of every [R, V]-sized tensor each operator reads (tensor args) or writes (its
    output), and the dtypes of [R, V] tensors created."""

    def __init__(self):
        super().__init__()
        self.bytes, self.created = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        full = [a for a in args if isinstance(a, torch.Tensor) and a.numel() == R * V]
        if name not in VIEWS and name != "gather":
            self.bytes += sum(a.numel() * a.element_size() for a in full)
            if isinstance(out, torch.Tensor) and out.numel() == R * V:
                self.bytes += out.numel() * out.element_size()
                if not name.endswith("_"):
                    self.created.append(out.dtype)
        return out


def _logits(dtype):
    g = torch.Generator().manual_seed(0)
    return (4 * torch.randn(R, V, generator=g, dtype=torch.float64)).to(dtype)


def _former_confidence(logits, x0):
    """The former decode: a copy in at least float32, shifted into a new tensor, exp, sum."""
    lf = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return (lf - lf.gather(-1, x0[:, None])).exp_().sum(-1).reciprocal_()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_greedy_chunk_is_read_four_times_and_written_twice_in_its_dtype(dtype):
    logits = _logits(dtype)
    with Traffic() as t:
        by_rule(logits, 0, [], MASK)
    per_entry = t.bytes / (R * V)
    assert per_entry == 6 * dtype.itemsize            # bf16: 12 B per logit entry (28 B before)
    assert t.created == []                            # nothing [R, V] allocated: no float32 copy
    logits, x0 = _logits(dtype), torch.zeros(R, dtype=torch.long)
    with Traffic() as before:                         # the former confidence, after the same argmax
        _former_confidence(logits, x0)
    assert before.bytes / (R * V) + dtype.itemsize == {torch.bfloat16: 28, torch.float32: 24}[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_full_precision_confidences_are_the_former_ones_bit_for_bit(dtype):
    logits = _logits(dtype)
    x0 = logits.argmax(-1)
    want = _former_confidence(logits, x0)
    kept = logits.clone()
    assert torch.equal(confidence_at(logits, x0), want) and torch.equal(logits, kept)    # not in place
    assert torch.equal(confidence_at(logits, x0, inplace=True), want)


def test_bf16_confidences_sum_in_float32_close_to_the_float64_softmax():
    logits = _logits(torch.bfloat16)
    x0, conf, _ = by_rule(logits.clone(), 0, [], MASK)
    exact = torch.softmax(logits.double(), -1).gather(-1, x0[:, None])[:, 0]
    assert conf.dtype == torch.float32
    assert torch.allclose(conf.double(), exact, rtol=4e-3, atol=0)
    assert conf.unique().numel() == R                 # float32 sums: no ties among the rows


def test_sampled_rows_and_entropy_read_the_clean_logits():
    """Gumbel rows (T > 0) and the entropy are computed before the chunk is consumed in place."""
    logits = _logits(torch.float64)
    gen = torch.Generator().manual_seed(5)
    seg = [RowSegment(8, 16, 0.7, gen)]
    x0, conf, ent = by_rule(logits.clone(), 0, seg, MASK, entropy=True)
    p = torch.softmax(logits, -1)
    assert torch.allclose(conf, p.gather(-1, x0[:, None])[:, 0], rtol=1e-12, atol=0)
    assert torch.allclose(ent, -(p * p.log()).sum(-1), rtol=1e-10, atol=0)
    greedy = torch.cat([torch.arange(8), torch.arange(24, R)])
    assert torch.equal(x0[greedy], logits[greedy].argmax(-1))
