"""Baselines vs independent plain re-implementations written here from the upstream
code each baseline follows (repository + commit in baselines.SYSTEMS), in float64 on a tiny random LLaDA.

Each plain version runs one sequence with a different code path from baselines/: the caches are
emulated by full recomputation through `model.hidden_states` with an attention function that
freezes / masks keys (Fast-dLLM, Sparse-dLLM), or by a per-layer loop over explicit full-length
dict caches and index sets (dLLM-Cache). Token choice is written upstream-style (confidence over
a whole row with -inf outside the candidates), with the per-request randomness contract.
"""
import pytest
import torch

from baselines import SYSTEMS, make_system, profile_max_batch
from baselines.profile import measure_run
from baselines.reference_llada import reference_generate
from engine.models import ModelConfig, build_model, dense_attention
from engine.profiler import weights_bytes as weight_bytes
from engine.sampling import SamplingParams
from engine.unmask import RequestGenerators, transfer_schedule
from tests.plain_caches import dllm_cache_logits, frozen_keys, kept_keys

MASK = 299


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig(d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=128, vocab_size=300,
                      embedding_size=300, mask_token_id=MASK, eos_token_id=298, pad_token_id=298)
    torch.manual_seed(0)
    m = build_model(cfg).to(torch.float64)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)                       # large weights: decisions are sensitive
    return m.eval()


def prompt(n, seed=0):
    return torch.randint(0, 298, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def run(model, name, p, sp, **knobs):
    return make_system(name, model, max_batch_size=1, **knobs).generate([p], sp)[0]


# ---------------------------------------------------------------- plain samplers (one sequence)
class Plain:
    """Canvas + the upstream-style commit rule, shared by the plain samplers below."""

    def __init__(self, model, p, sp):
        self.m, self.sp, self.P = model, sp, len(p)
        self.x = torch.tensor(p + [MASK] * sp.gen_length)
        self.L = self.x.numel()
        self.pos = torch.arange(self.L)
        self.gens = RequestGenerators(sp.seed)

    def forward(self, attn=dense_attention):
        return self.m.lm_head(self.m.hidden_states(self.x, self.pos, attn))

    def commit(self, logits, lo, s, e, k, conf_dtype, exp_argmax=False, threshold=None):
        """logits cover canvas rows [lo, lo + len); commit within the block [s, e)."""
        cand = [j for j in range(s, e) if self.x[j] == MASK]
        if not cand:
            return
        rows = logits[torch.tensor(cand) - lo]
        T = self.sp.temperature
        if T == 0:
            score = rows.exp() if exp_argmax else rows
        else:
            u = torch.rand(rows.shape, dtype=torch.float64, generator=self.gens.gumbel)
            score = rows.to(torch.float64).exp() / (-torch.log(u)) ** T
        x0 = score.index_fill(-1, torch.tensor([MASK]), -torch.inf).argmax(-1)     # never propose MASK
        if self.sp.remasking == "random":
            c = torch.rand(len(cand), dtype=torch.float64, generator=self.gens.remask)
        else:
            c = torch.softmax(rows.to(conf_dtype), -1).gather(-1, x0[:, None])[:, 0]
        conf = torch.full((self.L,), -torch.inf, dtype=torch.float64)
        conf[cand] = c.to(torch.float64)
        full = torch.full((self.L,), MASK)
        full[cand] = x0
        if threshold is not None:
            top = torch.topk(conf, len(cand)).indices
            pick = [top[0]] + [j for j in top[1:] if conf[j] >= threshold]
        else:
            pick = torch.topk(conf, k).indices.tolist()
        for j in pick:
            self.x[j] = full[j]

    def blocks(self):
        bl = self.sp.block_length
        for b in range(self.sp.num_blocks):
            s = self.P + b * bl
            yield s, s + bl, transfer_schedule(int((self.x[s:s + bl] == MASK).sum()), self.sp.steps_per_block)

    def out(self):
        return self.x[self.P:].tolist()


def plain_fast(model, p, sp, cache="dual", threshold=None):
    """Full recomputation each step; attention sees K/V frozen at the block start outside the
    window (dual: the block; prefix: block + everything after it)."""
    s_ = Plain(model, p, sp)
    nfe = 0
    for s, e, sched in s_.blocks():
        record, window = frozen_keys()
        s_.commit(s_.forward(record), 0, s, e, sched[0], torch.float64, threshold=threshold)
        nfe += 1
        hi = e if cache == "dual" else s_.L
        cached = window(s, hi)
        i = 1
        while (s_.x[s:e] == MASK).any() and i < (sp.steps_per_block if threshold is None else 10**9):
            s_.commit(s_.forward(cached)[s:hi], s, s, e, sched[i] if threshold is None else 0, torch.float64,
                      threshold=threshold)
            nfe += 1
            i += 1
    return s_.out(), nfe


def plain_sparse(model, p, sp, keep_ratio, kernel):
    """Full recomputation; from step 2 of a block each layer's keys are the block (fresh) plus
    the kept context (frozen at step 1), every other key masked out."""
    s_ = Plain(model, p, sp)
    for s, e, sched in s_.blocks():
        select, masked = kept_keys(model, s_.L, s, e, keep_ratio, kernel)
        for i, k in enumerate(sched):
            logits = s_.forward(dense_attention if i == 0 else select if i == 1 else masked)
            s_.commit(logits, 0, s, e, k, torch.float64)
    return s_.out()


def plain_dllm_cache(model, p, sp, pi, gi, ratio):
    """Per-layer loop over explicit full-length caches {k, v, attn, mlp} (tests.plain_caches); each
    step recomputes only the rows the refresh rule and V-verify choose, then reads the cache."""
    s_ = Plain(model, p, sp)
    logits_of = dllm_cache_logits(model, s_.P, pi, gi, ratio)
    for s, e, sched in s_.blocks():
        for k in sched:
            logits = logits_of(s_.x)
            s_.commit(logits[s_.P:], s_.P, s, e, k, logits.dtype, exp_argmax=True)
    return s_.out()


# ---------------------------------------------------------------- tests
SETTINGS = [  # (prompt len, gen, block, steps, temperature, seed)
    (6, 16, 8, 8, 0.0, 0),
    (9, 16, 4, 16, 0.0, 1),
    (5, 16, 8, 16, 0.8, 2),
    (7, 8, 8, 24, 0.0, 3),       # S > block_length: zero schedule entries
    (4, 12, 4, 6, 1.0, 4),
]


def params(gen, block, steps, T, seed, remasking="low_confidence"):
    return SamplingParams(gen_length=gen, block_length=block, steps=steps, temperature=T, seed=seed, remasking=remasking)


@pytest.mark.parametrize("setting", SETTINGS)
def test_llada_equals_reference(model, setting):
    P, gen, block, steps, T, seed = setting
    sp = params(gen, block, steps, T, seed)
    for rm in ("low_confidence", "random"):
        sp = params(gen, block, steps, T, seed, rm)
        out = run(model, "llada", prompt(P, seed), sp)
        ref, nfe = reference_generate(model, prompt(P, seed), sp)
        assert out.token_ids == ref and out.nfe == nfe == steps


@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_fast_dllm(model, cache):
    differs = 0
    for P, gen, block, steps, T, seed in SETTINGS:
        sp = params(gen, block, steps, T, seed)
        out = run(model, "fast-dllm", prompt(P, seed), sp, fast_dllm_cache=cache)
        toks, nfe = plain_fast(model, prompt(P, seed), sp, cache)
        assert out.token_ids == toks and out.nfe == nfe
        # Fast-dLLM (NVlabs/Fast-dLLM@24cc59e): 1 full + window forwards while the block has a MASK (zeros skipped)
        assert nfe == sp.num_blocks * min(sp.steps_per_block, block)
        differs += toks != run(model, "llada", prompt(P, seed), sp).token_ids
    assert differs >= 2
    # parallel decoding: fewer forwards than steps, same tokens as the plain rule
    sp = params(16, 8, 16, 0.0, 5)
    out = run(model, "fast-dllm", prompt(6, 5), sp, fast_dllm_cache=cache, threshold=0.1)
    toks, nfe = plain_fast(model, prompt(6, 5), sp, cache, threshold=0.1)
    assert out.token_ids == toks and out.nfe == nfe < 16


@pytest.mark.parametrize("knobs", [dict(prompt_interval=3, gen_interval=2, transfer_ratio=0.25),
                                   dict(prompt_interval=2, gen_interval=5, transfer_ratio=0.5),
                                   dict(prompt_interval=4, gen_interval=3, transfer_ratio=0.0),
                                   dict()])        # upstream gsm8k default 50/7/0.25
def test_dllm_cache(model, knobs):
    k = {**SYSTEMS["dllm-cache"].knobs, **knobs}
    differs = 0
    for P, gen, block, steps, T, seed in SETTINGS:
        sp = params(gen, block, steps, T, seed)
        out = run(model, "dllm-cache", prompt(P, seed), sp, **knobs)
        assert out.token_ids == plain_dllm_cache(model, prompt(P, seed), sp, k["prompt_interval"],
                                                 k["gen_interval"], k["transfer_ratio"])
        differs += out.token_ids != run(model, "llada", prompt(P, seed), sp).token_ids
    assert differs >= 2


@pytest.mark.parametrize("keep_ratio,kernel", [(0.5, 3), (0.3, 5), (0.6, None)])
def test_sparse_dllm(model, keep_ratio, kernel):
    differs = 0
    for P, gen, block, steps, T, seed in SETTINGS:
        sp = params(gen, block, steps, T, seed)
        out = run(model, "sparse-dllm", prompt(P, seed), sp, keep_ratio=keep_ratio, kernel_size=kernel)
        assert out.token_ids == plain_sparse(model, prompt(P, seed), sp, keep_ratio, kernel)
        differs += out.token_ids != run(model, "llada", prompt(P, seed), sp).token_ids
    assert differs >= 2


@pytest.mark.parametrize("name,knobs", [("llada", {}), ("fast-dllm", {}), ("fast-dllm", dict(fast_dllm_cache="prefix")),
                                        ("fast-dllm", dict(threshold=0.1)), ("dllm-cache", dict(prompt_interval=3, gen_interval=2)),
                                        ("sparse-dllm", {})])
def test_mixed_batch_matches_alone(model, name, knobs):
    sps = [params(16, 8, 16, T, seed) for T, seed in ((0.0, 0), (0.7, 1), (0.0, 2), (1.0, 3))]
    prompts = [prompt(n, i) for i, n in enumerate((5, 11, 8, 3))]
    other = params(8, 8, 8, 0.0, 9)                   # a different shape ends the batch
    sysm = make_system(name, model, max_batch_size=8, **knobs)
    outs = sysm.generate(prompts + [prompt(6, 9)], sps + [other])
    for o, p, sp in zip(outs, prompts + [prompt(6, 9)], sps + [other], strict=True):
        assert o.token_ids == run(model, name, p, sp, **knobs).token_ids
    st = sysm.stats()
    assert st["batch_sizes"][0] == 4 and st["batch_sizes"][-1] == 1
    assert outs[0].nfe == st["batch_sizes"].count(4)


def test_interface_errors_and_abort(model):
    sysm = make_system("sparse-dllm", model, max_batch_size=2)
    sp = params(8, 8, 8, 0.0, 0)
    for bad in ([], [MASK], [300]):
        with pytest.raises(ValueError):
            sysm.add_request(bad, sp)
    with pytest.raises(ValueError):
        make_system("sparse-dllm", model, kernel_size=4)
    with pytest.raises(ValueError):
        make_system("fast-dllm", model, keep_ratio=0.5)
    a, b = sysm.add_request(prompt(4), sp), sysm.add_request(prompt(5), sp)
    sysm.abort(b)
    done = []
    while sysm.has_unfinished():
        done += sysm.step()
    assert [o.request_id for o in done] == [a] and done[0].kv_tokens == int((4 + 8 - 8) * 0.5)


def test_profile_max_batch_fits(model):
    kw = dict(prompt_len=6, gen_length=8, block_length=4, steps=8, system="fast-dllm")
    measure_run(model, 1, run_steps=None, **kw)   # one-time allocations (RoPE tables) out of the way
    peaks = {B: measure_run(model, B, run_steps=None, **{k: v for k, v in kw.items()}) for B in (2, 3)}
    assert peaks[3] > peaks[2]
    budget = weight_bytes(model) + (peaks[2] + peaks[3]) // 2
    B, peak = profile_max_batch(model, budget, **kw)
    assert B == 2 and peak == peaks[2]
    # a whole generation at B stays under the budget; at B + 1 it does not
    avail = budget - weight_bytes(model)
    assert measure_run(model, B, run_steps=10**6, **kw) <= avail < measure_run(model, B + 1, run_steps=10**6, **kw)


@pytest.mark.parametrize("curve", ["affine", "convex", "concave", "step"])
def test_profile_max_batch_search_finds_the_largest_fitting_batch(curve, monkeypatch):
    """The search starts at the affine prediction from B = 1, 2; for any peak that grows with B it
    returns the same largest fitting B as the definition, and on an affine peak it measures
    1 + 2 + B* + (B* + 1) requests in all (doubling from 1 measured ~4·B*)."""
    import random

    import baselines.profile as bp

    monkeypatch.setattr(bp, "weights_bytes", lambda m: 0)
    rng = random.Random(curve)
    for _ in range(400):
        a, b = rng.randint(0, 50), rng.randint(1, 30)
        budget, mx = rng.randint(a + 5 * b, 3000), rng.choice([1, 2, 3, 7, 64, 4096])
        peak = _peak_curve(curve, a, b)
        if peak(1) > budget:
            continue
        calls: list[int] = []
        got, at = bp.profile_max_batch(None, budget, 1, 32, measure=_recorded(peak, calls), max_batch=mx)
        want = max(B for B in range(1, mx + 1) if peak(B) <= budget)
        assert (got, at) == (want, peak(want))
        if curve == "affine":
            assert sum(calls) <= 2 * want + 4          # B = 1, 2, B*, B* + 1


def _peak_curve(curve: str, a: int, b: int):
    return {"affine": lambda B: a + b * B, "convex": lambda B: a + b * B + B * B // 3,
            "concave": lambda B: a + int(b * B ** 0.7), "step": lambda B: a + b * ((B + 3) // 4) * 4}[curve]


def _recorded(peak, calls: list):
    def measure(B: int) -> int:
        calls.append(B)
        return peak(B)
    return measure
