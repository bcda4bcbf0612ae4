"""Dream's own sampler (baselines/reference_dream.py) against hand-checked cases of upstream's rules
(Dream-org generation_utils.py `_sample` / `sample_tokens`), on float64 stand-in logits functions."""
from __future__ import annotations

import math

import pytest
import torch

from baselines.reference_dream import (
    ALGS,
    DreamSampling,
    choose_positions,
    dense_logits,
    dream_schedule,
    propose,
    reference_generate,
    timesteps,
    token_probs,
    transfer_fraction,
)
from engine.unmask import RequestGenerators

F64 = torch.float64


def standin(V: int = 40, mask_id: int | None = None, lmax: int = 96, seed: int = 0, mask_lift: float = -5.0):
    """A seeded random map of the canvas: row p mixes the one-hot embeddings of every position
    (bidirectional), plus a per-position term; the mask column is offset by `mask_lift`."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(V, 8, generator=g, dtype=F64)
    head = torch.randn(8, V, generator=g, dtype=F64)
    mix = torch.randn(lmax, lmax, generator=g, dtype=F64) / math.sqrt(lmax)
    pos = torch.randn(lmax, V, generator=g, dtype=F64)
    mask_id = V - 1 if mask_id is None else mask_id

    def fn(x: torch.Tensor) -> torch.Tensor:
        L = x.numel()
        out = mix[:L, :L] @ emb[x] @ head + pos[:L]
        out[:, mask_id] += mask_lift
        return out
    return fn


class Recorder:
    """Wraps a logits function and keeps every canvas it was called with and what it returned."""

    def __init__(self, fn):
        self.fn, self.canvases, self.logits = fn, [], []

    def __call__(self, x):
        self.canvases.append(x.clone())
        self.logits.append(self.fn(x))
        return self.logits[-1]


def run(fn, prompt, mask_id, **kw):
    rec = Recorder(fn)
    out, nfe = reference_generate(rec, prompt, DreamSampling(**kw), mask_id)
    return out, nfe, rec


def masks_per_call(rec, mask_id, final):
    return [int((c == mask_id).sum()) for c in rec.canvases] + [sum(t == mask_id for t in final)]


# ---------------------------------------------------------------- the schedule
@pytest.mark.parametrize("n,steps", [(1, 1), (7, 3), (16, 16), (16, 64), (128, 128), (100, 7), (256, 512), (5, 1)])
def test_schedule_sums_to_gen_length(n, steps):
    sched = dream_schedule(n, steps, 1e-3)
    assert len(sched) == steps and min(sched) >= 0 and sum(sched) == n


def test_schedule_by_hand():
    # linspace(1, 1e-3, 5) = [1, .75025, .5005, .25075, .001]; n = 4:
    # 4 * .24975 = .999 -> 0; 4 * (1 - .5005/.75025) = 1.33 -> 1; 3 * (1 - .25075/.5005) = 1.497 -> 1; last: 2
    assert dream_schedule(4, 4, 1e-3) == [0, 1, 1, 2]
    assert torch.allclose(timesteps(4, 1e-3), torch.tensor([1, .75025, .5005, .25075, .001]), atol=1e-6)


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_confidence_algs_commit_the_schedule(alg):
    mask = 39
    out, nfe, rec = run(standin(), [3, 4, 5], mask, gen_length=23, steps=9, alg=alg)
    left = masks_per_call(rec, mask, out)
    assert [a - b for a, b in zip(left, left[1:])] == dream_schedule(23, 9, 1e-3)
    assert nfe == 9 == len(rec.canvases) and left[-1] == 0


# ---------------------------------------------------------------- origin
def test_origin_moves_each_mask_with_probability_one_minus_s_over_t():
    mask, moved, total = 39, 0, 0
    for seed in range(50):
        out, _, rec = run(standin(), [1, 2], mask, gen_length=64, steps=2, alg="origin", seed=seed)
        moved += 64 - int((rec.canvases[1] == mask).sum())
        total += 64
        assert mask not in out                                   # the last step moves every mask
    p = 1 - 0.5005                                              # 1 - linspace(1, 1e-3, 3)[1]
    assert float(transfer_fraction(timesteps(2, 1e-3), 0)) == pytest.approx(p, abs=1e-6)   # float32 grid
    # 3,200 Bernoulli(p) draws: sd 0.009, so 0.05 is over 5 sd from p.
    assert moved / total == pytest.approx(p, abs=0.05)


def test_origin_coin_flips_come_from_the_remask_stream():
    """The contract the engine reproduces: step 0 moves masked position j iff u_j < 1 - s/t, u the
    first float64 draw of one uniform per masked position from RequestGenerators(seed).remask."""
    mask, P, n = 39, 2, 30
    _, _, rec = run(standin(), [1, 2], mask, gen_length=n, steps=4, alg="origin", seed=7, temperature=0.8)
    u = torch.rand(n, dtype=F64, generator=RequestGenerators(7).remask)
    want = u < float(transfer_fraction(timesteps(4, 1e-3), 0))
    assert torch.equal(rec.canvases[1][P:] != mask, want) and want.any() and not want.all()


def test_origin_top_k_one_equals_greedy():
    """top_k = 1 leaves one token per row, so T = 1 samples the argmax; the coin flips use the other
    stream, so the same seed moves the same positions: the outputs agree token for token."""
    fn, mask = standin(), 39
    greedy, _, _ = run(fn, [5, 6, 7], mask, gen_length=20, steps=6, alg="origin", seed=3)
    topk1, _, _ = run(fn, [5, 6, 7], mask, gen_length=20, steps=6, alg="origin", seed=3, temperature=1.0, top_k=1)
    sampled, _, _ = run(fn, [5, 6, 7], mask, gen_length=20, steps=6, alg="origin", seed=3, temperature=1.0)
    assert topk1 == greedy and sampled != greedy


# ---------------------------------------------------------------- which position each alg picks
def hand_rows():
    """Rows for positions 1..3 (V = 12, mask 11); position 0 is the prompt.
    X: max .50, margin .10, entropy .943; Y: max .46, margin .40, entropy 1.876;
    Z: max .49, margin .02, entropy .833. maskgit_plus -> X, topk_margin -> Y, entropy -> Z."""
    X = [.50, .40, .10]
    Y = [.46] + [.06] * 9
    Z = [.49, .47, .04]
    probs = torch.full((4, 12), 1e-13, dtype=F64)
    for row, p in zip((1, 2, 3), (X, Y, Z)):
        probs[row, :len(p)] = torch.tensor(p, dtype=F64)
    return probs.log()


@pytest.mark.parametrize("alg,pos", [("maskgit_plus", 1), ("topk_margin", 2), ("entropy", 3)])
def test_each_alg_commits_its_best_row_first(alg, pos):
    rows = hand_rows()
    assert dream_schedule(3, 3, 1e-3) == [0, 1, 2]                # step 1 commits exactly one position
    out, _, rec = run(lambda x: rows.clone(), [0], 11, gen_length=3, steps=3, alg=alg)
    assert torch.nonzero(rec.canvases[2] != 11).squeeze(-1).tolist() == [0, pos]
    assert out == [0, 0, 0]                                       # temperature 0: each row's argmax


# ---------------------------------------------------------------- tokens
def committed_argmax(rec, prompt, out, mask):
    """How many tokens were committed, after asserting each equals the non-mask argmax of the row
    the committing call returned for its position."""
    canvases = rec.canvases + [torch.tensor(prompt + out)]
    checked = 0
    for c in range(len(rec.canvases)):
        new = torch.nonzero((canvases[c] == mask) & (canvases[c + 1] != mask)).squeeze(-1)
        row = rec.logits[c][new].clone()
        row[:, mask] = -torch.inf
        assert torch.equal(canvases[c + 1][new], row.argmax(-1))
        checked += new.numel()
    return checked


@pytest.mark.parametrize("alg", ALGS)
def test_temperature_zero_commits_the_argmax_of_its_own_row(alg):
    """The sampler does no shift: a token committed at position p is the argmax of that call's row p."""
    out, _, rec = run(standin(), [3, 9], 39, gen_length=17, steps=7, alg=alg, seed=1)
    assert committed_argmax(rec, [3, 9], out, 39) == 17


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_mask_id_is_never_proposed(alg, temperature):
    """The mask column 5 above every row's maximum: upstream would keep proposing it; here every
    position gets a real token (at temperature 0, the best non-mask one)."""
    base, mask = standin(mask_lift=0.0), 39

    def loving(x):
        out = base(x)
        out[:, mask] = out.max(-1).values + 5
        return out
    out, _, rec = run(loving, [1, 2, 3], mask, gen_length=12, steps=5, alg=alg, temperature=temperature, seed=2)
    assert len(out) == 12 and mask not in out
    if temperature == 0:
        assert committed_argmax(rec, [1, 2, 3], out, mask) == 12


@pytest.mark.parametrize("alg", ALGS)
def test_seeded_sampling_is_deterministic(alg):
    kw = dict(gen_length=16, steps=8, alg=alg, temperature=0.7, top_p=0.9,
              alg_temp=None if alg == "origin" else 0.5)
    fn, mask = standin(), 39
    a = reference_generate(fn, [4, 5], DreamSampling(seed=11, **kw), mask)
    assert reference_generate(fn, [4, 5], DreamSampling(seed=11, **kw), mask) == a
    assert reference_generate(fn, [4, 5], DreamSampling(seed=12, **kw), mask) != a


# ---------------------------------------------------------------- the distribution
def test_top_p_and_top_k_on_a_known_distribution():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=F64).log()
    kept = lambda rows=logits, **kw: (token_probs(rows, DreamSampling(temperature=0.0, **kw)) > 0)[0].tolist()  # noqa: E731
    # cumulative .5, .8, .95, 1: the first token past top_p stays, the rest go
    assert kept(top_p=0.6) == [True, True, False, False]
    assert kept(top_p=0.85) == [True, True, True, False]
    assert kept(top_p=0.3) == [True, False, False, False]         # the top token always stays
    assert kept(top_p=1.0) == [True] * 4
    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_p=0.85, top_k=1) == [True, False, False, False]
    ties = torch.tensor([[1.0, 2.0, 2.0, 0.0]], dtype=F64)
    assert kept(ties, top_k=1) == [False, True, True, False]   # ties stay
    probs = token_probs(logits, DreamSampling(temperature=0.0, top_p=0.6))
    assert probs[0].tolist() == pytest.approx([0.625, 0.375, 0, 0], abs=1e-12)    # renormalised .5/.8, .3/.8


def test_temperature_scales_the_logits():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=F64)
    got = token_probs(logits, DreamSampling(temperature=2.0))
    assert torch.allclose(got, torch.softmax(logits / 2, -1), rtol=0, atol=1e-15)


def test_draws_follow_probs_without_the_mask():
    """20,000 draws from p = (.4, .2, .1, .1 | mask .2): frequencies p / .8 (sd <= .0036, tolerance .015)."""
    probs = torch.tensor([0.4, 0.2, 0.1, 0.1, 0.2], dtype=F64).expand(20000, 5).clone()
    x0 = propose(probs, 1.0, torch.Generator().manual_seed(0), mask_id=4)
    freq = torch.bincount(x0, minlength=5).to(F64) / 20000
    assert freq.tolist() == pytest.approx([0.5, 0.25, 0.125, 0.125, 0.0], abs=0.015)


def test_alg_temp_draws_positions_from_softmax_of_scores():
    """k = 1: 4,000 draws from softmax(conf / .5) (sd <= .008, tolerance .03); k = 3: distinct rows."""
    conf = torch.tensor([0.9, 0.6, 0.5, 0.1], dtype=F64)
    g = torch.Generator().manual_seed(0)
    picks = torch.stack([choose_positions(conf, 1, 0.5, g) for _ in range(4000)])[:, 0]
    freq = torch.bincount(picks, minlength=4).to(F64) / 4000
    assert freq.tolist() == pytest.approx(torch.softmax(conf / 0.5, -1).tolist(), abs=0.03)
    three = choose_positions(conf, 3, 0.5, g)
    assert len(set(three.tolist())) == 3
    assert choose_positions(conf, 2, None, g).tolist() == [0, 1] == choose_positions(conf, 2, 0.0, g).tolist()


# ---------------------------------------------------------------- inputs
@pytest.mark.parametrize("kw", [dict(gen_length=0), dict(steps=0), dict(eps=0.0), dict(eps=1.0),
                                dict(alg="greedy"), dict(alg_temp=-1.0), dict(temperature=-0.1),
                                dict(top_p=0.0), dict(top_p=1.5), dict(top_k=0), dict(steps=2.5)])
def test_bad_params_are_refused(kw):
    with pytest.raises(ValueError):
        DreamSampling(**kw)


@pytest.mark.parametrize("prompt", [[], [1, 39, 2]])
def test_bad_prompts_are_refused(prompt):
    with pytest.raises(ValueError, match="prompt"):
        reference_generate(standin(), prompt, DreamSampling(gen_length=4, steps=4), 39)


def test_dense_logits_feeds_one_sequence_through_a_batched_forward():
    """The seam's forward takes ids [B, L] and returns [B, L, V]; the sampler sees row p of sequence 0."""
    fn = standin()
    model = lambda ids: torch.stack([fn(row) for row in ids])  # noqa: E731
    x = torch.tensor([3, 39, 39, 7])
    assert torch.equal(dense_logits(model)(x), fn(x))
    assert reference_generate(dense_logits(model), [3, 4], DreamSampling(gen_length=6, steps=3, alg="entropy"), 39) \
        == reference_generate(fn, [3, 4], DreamSampling(gen_length=6, steps=3, alg="entropy"), 39)
