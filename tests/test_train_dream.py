"""`dllm-bench train --model-type Dream`'s objective (Dream's CART-weighted masked-diffusion loss on
the shifted rows; the layout it writes: tests/test_dream_checkpoints.py), and the committed
tiny-math-dream checkpoint: it answers synth through a full-canvas decode by both oracles, and
`dllm-bench accuracy` takes it (docs/ACCURACY.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
ASSET = REPO / "dllm_bench" / "assets" / "tiny-math-dream"

# The committed model's strict-match accuracy on the first N synth test questions (seed 0, its
# eval context size), greedy, one token per step over the 16-token answer window. Measured: 12/16
# with LLaDA's sampler (low confidence), 13/16 with Dream's (alg entropy); chance is below 0.1
# (the answer is a number computed from one or two of 16 facts). The floor leaves room for float
# summation order on other machines.
N = 16
FLOOR = 0.5


def _dream_model(seed: int = 0):
    from dllm_bench.train.loop import TrainConfig, init_model, model_config

    cfg = TrainConfig(model_type="Dream", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden_size=48,
                      vocab_size=300)
    model = init_model(model_config(cfg, {"mask_token_id": 299, "eos_token_id": 298, "pad_token_id": 298,
                                          "bos_token_id": 297}), seed)
    with torch.no_grad():          # non-zero biases and norms: a mapping they hide would pass otherwise
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.normal_(0.5 if name.endswith("weight") else 0.0, 0.2)
    return model


# ------------------------------------------------------------------------------ the objective
def test_each_family_trains_with_its_own_objective_by_default():
    from dllm_bench.train.loop import TrainConfig

    assert TrainConfig().model_type == "llada" and TrainConfig().objective == "llada"
    assert TrainConfig(model_type="Dream").objective == "cart"
    assert TrainConfig(model_type="Dream", objective="llada").objective == "llada"
    with pytest.raises(ValueError, match="objective must be one of"):
        TrainConfig(model_type="Dream", objective="1/t")


def _cart_by_hand(masked: list[bool], valid: list[bool], p: float = 0.3) -> list[float]:
    out = []
    for i, m in enumerate(masked):
        w = 0.0
        if m:
            for j, (mj, vj) in enumerate(zip(masked, valid, strict=True)):
                d = abs(i - j)
                if vj and not mj and d >= 2:
                    w += 0.5 * p * (1 - p) ** (d - 2)
        out.append(w)
    return out


def test_cart_weights_equal_the_geometric_sum_by_hand():
    from dllm_bench.train.loop import cart_weights

    g = torch.Generator().manual_seed(3)
    masked = torch.rand(4, 13, generator=g) < 0.5
    valid = torch.ones(4, 13, dtype=torch.bool)
    valid[1, 9:] = False                     # padding is no context
    masked &= valid
    got = cart_weights(masked, valid)
    want = torch.tensor([_cart_by_hand(m.tolist(), v.tolist()) for m, v in zip(masked, valid, strict=True)])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)      # float32 vs Python floats
    assert float(got[~masked].abs().max()) == 0.0
    # a masked token with both neighbours clean and nothing further gets nothing (distance 1 counts 0)
    one = cart_weights(torch.tensor([[False, True, False]]), torch.ones(1, 3, dtype=torch.bool))
    assert one.tolist() == [[0.0, 0.0, 0.0]]


def test_the_cart_loss_is_the_weighted_masked_cross_entropy():
    """diffusion_loss(cart) = mean over sequences of sum(CE(row p, token p) * CART weight) / the
    answer-region length, with the rows of the model's own forward on the noised ids."""
    import torch.nn.functional as F

    from dllm_bench.train.loop import cart_weights, diffusion_loss

    model = _dream_model()
    ids = torch.randint(0, 290, (3, 12), generator=torch.Generator().manual_seed(1))
    valid = torch.ones(3, 12, dtype=torch.bool)
    region = torch.zeros(3, 12, dtype=torch.bool)
    region[:, 5:] = True
    seen = []
    orig = model.hidden_states

    def spy(input_ids, positions, attn):
        seen.append(input_ids.view(3, 12).clone())
        return orig(input_ids, positions, attn)

    model.hidden_states = spy
    with torch.no_grad():
        loss, _ = diffusion_loss(model, ids, valid, region, 299, "cart", generator=torch.Generator().manual_seed(4))
    noisy = seen[-1]
    masked = noisy == 299
    assert masked.any() and not masked[:, :5].any()
    model.hidden_states = orig
    with torch.no_grad():
        logits = model(noisy)
    ce = F.cross_entropy(logits.flatten(0, 1), ids.flatten(), reduction="none").view(3, 12)
    want = ((ce * cart_weights(masked, valid)).sum(1) / 7).mean()
    assert float(loss) == pytest.approx(float(want), rel=1e-5)        # float32, batched vs per-row forward


# ------------------------------------------------------------------------------ the command
def test_a_bad_objective_is_one_error_line_and_writes_nothing(tmp_path):
    out = tmp_path / "never"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "train", "--model-type", "Dream", "--objective",
                        "1/t", "--out", str(out)], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: objective must be one of") and "'1/t'" in lines[0], lines
    assert not out.exists()


# ------------------------------------------------------------------------------ the trained model
@pytest.fixture(scope="module")
def dream_asset():
    from dllm_bench.accuracy.points import model_training_info
    from dllm_bench.checkpoints.load import load_model, load_tokenizer

    if not (ASSET / "model.safetensors").is_file():
        pytest.skip("the trained tiny-math-dream checkpoint is not committed (docs/ACCURACY.md: dllm-bench train)")
    torch.set_num_threads(1)
    return load_model(str(ASSET), "float32", "cpu"), load_tokenizer(ASSET), model_training_info(ASSET)


def test_the_dream_asset_is_a_small_dream_checkpoint(dream_asset):
    from dllm_bench.checkpoints.store import resolve_model

    model, tok, info = dream_asset
    assert resolve_model("tiny-math-dream") == ASSET
    assert sum(p.stat().st_size for p in ASSET.iterdir()) < 10 * 2**20          # as small as tiny-math
    cfg = json.loads((ASSET / "config.json").read_text())
    assert cfg["model_type"] == "Dream" and model.config.shift == 1 and model.config.qkv_bias
    assert info["config"]["model_type"] == "Dream" and info["config"]["objective"] == "cart"
    assert info["config"]["task"] == "synth" and "--model-type Dream" in info["command"]
    assert tok.convert_ids_to_tokens(model.config.mask_token_id) == "<|mask|>"           # Dream's tokens
    assert tok.mask_token_id == model.config.mask_token_id and tok.eos_token_id == model.config.eos_token_id


def _questions(info: dict, n: int):
    from dllm_bench.accuracy.points import generated_docs

    c = info["config"]
    return generated_docs("synth", "test", n, 0, c["eval_facts"], {"ops": c["ops"], "max_value": c["max_value"]})


def _accuracy(model, tok, info, decode) -> float:
    from dllm_bench.accuracy.backend import decode_completion
    from workloads.tasks import scoring, synth

    hits = 0
    for d in _questions(info, N):
        prompt = tok(synth.format_prompt(d["question"]), add_special_tokens=False)["input_ids"]
        text = decode_completion(tok, decode(prompt), model.config.eos_token_id)
        hits += scoring.score_gsm8k(text, d["target"])["strict-match"]
    return hits / N


def test_the_trained_dream_answers_synth_with_a_full_canvas_decode(dream_asset):
    """LLaDA's sampler (greedy, low confidence, one token per step) and Dream's own (greedy,
    entropy, one token per step) on the full canvas: rows already shifted by the model's forward."""
    from baselines.reference_dream import DreamSampling, dense_logits
    from baselines.reference_dream import reference_generate as dream_generate
    from baselines.reference_llada import reference_generate as llada_generate
    from engine.sampling import SamplingParams

    model, tok, info = dream_asset
    w = info["config"]["window"]
    params = SamplingParams(gen_length=w, block_length=w, steps=w, temperature=0.0)
    dream = DreamSampling(gen_length=w, steps=w, alg="entropy", temperature=0.0)
    got = {"llada-low-confidence": _accuracy(model, tok, info, lambda p: llada_generate(model, p, params)[0]),
           "dream-entropy": _accuracy(model, tok, info, lambda p: dream_generate(
               dense_logits(model), p, dream, model.config.mask_token_id)[0])}
    assert all(acc >= FLOOR for acc in got.values()), f"tiny-math-dream accuracy {got} below the floor {FLOOR}"


def test_accuracy_command_on_the_dream_asset(dream_asset, tmp_path):
    """`dllm-bench accuracy --model tiny-math-dream` end to end: the dense point (exact mode) and a
    sparse one, each above the floor on the committed model."""
    import typer
    from typer.testing import CliRunner

    from dllm_bench.commands.accuracy import register

    app = typer.Typer()
    register(app)
    r = CliRunner().invoke(app, ["--model", "tiny-math-dream", "--limit", str(N), "--retention", "0.5",
                                 "--selection", "head", "--no-r1", "--json", "--run-id", "d1", "--threads", "1",
                                 "--result-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["task"] == "synth" and [p["point"] for p in doc["points"]] == ["dense", "head-r0.5"]
    assert all(p["n"] == N for p in doc["points"])
    assert doc["points"][0]["accuracy"] >= FLOOR, doc["points"]


def test_lm_eval_backend_on_the_dream_asset(dream_asset):
    """lm-eval's simple_evaluate drives the engine on tiny-math-dream (5 dllm_synth docs, offline)
    and scores what our own scoring of the same engine outputs gives."""
    from dllm_bench.accuracy.backend import PointBackend
    from dllm_bench.accuracy.evaluate import eval_synth_point
    from dllm_bench.accuracy.lm_eval_model import run_lm_eval
    from dllm_bench.accuracy.points import Point

    model, tok, info = dream_asset
    c = info["config"]
    res = run_lm_eval("dllm_synth", {"model": "tiny-math-dream", "threads": 1}, limit=5,
                      metadata={"synth_context_facts": c["eval_facts"], "synth_n": 5, "synth_ops": ",".join(c["ops"]),
                                "synth_max_value": c["max_value"]})
    got = res["results"]["dllm_synth"]
    w = c["window"]
    ours = eval_synth_point(PointBackend(model, tok, Point("dense", "engine", "dense", cache="none"),
                                         gen_length=w, block_length=w, steps=w), _questions(info, 5))
    assert res["n-samples"]["dllm_synth"]["effective"] == 5
    assert got["exact_match,strict-match"] == pytest.approx(ours.accuracy)
    assert ours.accuracy >= FLOOR
