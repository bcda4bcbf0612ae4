"""A Dream model through the commands: which systems run it (a baseline's registry entry lists its
families), every command of the README's table on `--model tiny-dream`, the server's
ChatML chat, and `train --model-type Dream`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm_bench.checkpoints.layout import check_layout, load_config
from dllm_bench.checkpoints.presets import get_preset
from dllm_bench.checkpoints.token_layouts import token_layout
from dllm_bench.errors import UserError
from engine.models import build_model, dense_attention, load_model
from tests.test_dream_checkpoints import CHATML, DREAM_PRESETS, dream_names


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Presets made on first use go to a cache of this module's own."""
    old = os.environ.get("DLLM_BENCH_CACHE")
    os.environ["DLLM_BENCH_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield Path(os.environ["DLLM_BENCH_CACHE"])
    if old is None:
        del os.environ["DLLM_BENCH_CACHE"]
    else:
        os.environ["DLLM_BENCH_CACHE"] = old


# ------------------------------------------------------------------ the systems a Dream model runs
def test_a_baseline_runs_the_families_its_registry_lists(monkeypatch):
    from types import SimpleNamespace

    from dllm_bench.systems import families
    from dllm_bench.systems.spec import parse_systems

    fake = {"old": SimpleNamespace(), "both": SimpleNamespace(families=("llada", "Dream"))}
    monkeypatch.setattr(families, "baseline_registry", lambda: fake)
    assert families.family_systems("Dream") == ["engine", "both"]
    assert families.family_systems("llada") == ["engine", "old", "both"]
    with pytest.raises(UserError, match="system 'old' has no Dream version yet; systems for Dream models: engine, both"):
        families.check_supports("old", "Dream")
    variants = parse_systems("engine")
    assert families.for_family(variants, "Dream", explicit=True) == variants


def test_serve_refuses_a_named_baseline_without_a_dream_version(refused):
    from dllm_bench.systems.families import supports
    from dllm_bench.systems.spec import baseline_registry

    missing = [s for s in baseline_registry() if not supports(s, "Dream")]
    if not missing:
        pytest.skip("every baseline has a Dream version")
    line = refused("serve", "--model", "tiny-dream", "--systems", f"engine,{missing[0]}", "--rps", "inf",
                   "--num-prompts", "2")
    assert f"system {missing[0]!r} has no Dream version yet" in line


# ------------------------------------------------------------------ every command on tiny-dream
def _json(out: str) -> dict:
    return json.loads(out[out.index("{"):])


def check_models_list(r, tmp):
    assert all(name in r.stdout for name in DREAM_PRESETS) and "Dream" in r.stdout


def check_models_make(r, tmp):
    assert check_layout(tmp / "made").ok and load_config(tmp / "made").family.name == "Dream"
    assert f"mask_token_id={get_preset('tiny-dream').special_ids()['mask_token_id']}" in r.stdout


def check_doctor(r, tmp):
    row = next(c for c in _json(r.stdout)["checks"] if c["name"] == "checkpoint")
    assert row["status"] == "ok" and row["data"]["family"] == "Dream" and row["data"]["kv_heads"] == 2


def check_profile_step(r, tmp):
    doc = _json(r.stdout)
    assert doc["model"] == "tiny-dream" and doc["steps"] >= 1 and doc["step"] and doc["composition"]


def check_profile(r, tmp):
    doc = _json(r.stdout)
    assert doc["model"] == "tiny-dream" and doc["profiles"]


def check_generate(r, tmp):
    out = _json(r.stdout)["outputs"][0]
    assert len(out["tokens"]) == 8 and get_preset("tiny-dream").special_ids()["mask_token_id"] not in out["tokens"]


def check_run(r, tmp):
    doc = _json(r.stdout)
    assert Path(doc["run_dir"]).is_dir()


def check_serve(r, tmp):
    """The default systems on a Dream model: those with a Dream version, the engine first."""
    from dllm_bench.systems.families import supports
    from dllm_bench.systems.spec import DEFAULT_SYSTEMS

    cfg = json.loads((Path(_json(r.stdout)["run_dir"]) / "config.json").read_text())["config"]
    assert cfg["model"]["model_type"] == "Dream"
    assert [s["name"] for s in cfg["systems"]] == [s for s in DEFAULT_SYSTEMS.split(",") if supports(s, "Dream")]


def check_accuracy(r, tmp):
    doc = _json(r.stdout)
    assert doc["n"] == 2 and all(p["n"] == 2 for p in doc["points"])


COMMANDS = {  # name: (args, needs the engine, check)
    "models list": (["models", "list"], check_models_list),
    "models make": (["models", "make", "tiny-dream", "--out", "{tmp}/made"], check_models_make),
    "doctor": (["doctor", "--model", "tiny-dream", "--device", "cpu", "--json"], check_doctor),
    "profile": (["profile", "--model", "tiny-dream", "--json"], check_profile),
    "generate": (["generate", "--model", "tiny-dream", "--prompt", "Hi", "--gen-length", "8", "--block-length", "8",
                  "--json"], check_generate),
    "serve": (["serve", "--model", "tiny-dream", "--rps", "inf", "--num-prompts", "4", "--json"], check_serve),
    "memory": (["memory", "--model", "tiny-dream", "--memory-budget", "2MiB", "--systems", "engine", "--json"],
               check_run),
    "profile-step": (["profile-step", "--model", "tiny-dream", "--batch", "2", "--json"], check_profile_step),
    "simulate": (["simulate", "--model", "tiny-dream", "--hardware", "h100", "--num-prompts", "4", "--rps", "inf",
                  "--json"], check_run),
    "accuracy": (["accuracy", "--model", "tiny-dream", "--task", "synth", "--limit", "2", "--retention", "0.5",
                  "--no-r1", "--json", "--threads", "1"], check_accuracy),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_takes_tiny_dream(command, cache, tmp_path, monkeypatch, cli_in_process):
    args, check = COMMANDS[command]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path / "runs"))
    r = cli_in_process(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    check(r, tmp_path)


def test_server_chats_with_tiny_dream_in_chatml(cache):
    """`server --model tiny-dream`: the chat template is the checkpoint's (ChatML), so the prompt
    the engine sees is the ChatML rendering of the messages."""
    from dllm_bench.checkpoints.load import load_tokenizer, model_dir
    from tests.server_proc import Server

    tok = load_tokenizer(model_dir("tiny-dream"))
    s = Server(model="tiny-dream", env={"DLLM_BENCH_CACHE": str(cache)})
    try:
        r = s.client().chat.completions.create(model="tiny-dream", max_tokens=8,
                                               messages=[{"role": "user", "content": "What is 2+3?\n"}])
    finally:
        s.stop()
    assert r.usage.prompt_tokens == len(tok(CHATML, add_special_tokens=False)["input_ids"])
    assert r.choices[0].finish_reason in ("stop", "length")


# ------------------------------------------------------------------ training a Dream
def test_training_logits_carry_dreams_shift():
    """The training forward (batched, right-padded) gives row p the prediction for token p as the
    model's own forward does: Dream's row p from the hidden at p - 1."""
    from dllm_bench.train.batches import batched_logits

    torch.manual_seed(0)
    cfg = get_preset("tiny-dream").model_config()
    model = build_model(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.5 if name.endswith(".bias") else 0.1)   # biases large enough to matter
    a, b = [5, 9, 11, 13, 17, 19], [7, 3, 2]
    ids = torch.tensor([a, b + [0] * 3])
    valid = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    with torch.no_grad():
        got = batched_logits(model, ids, valid)
    # float64 both ways; the two paths differ only in summation order
    torch.testing.assert_close(got[0], model(torch.tensor([a]))[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got[1, :3], model(torch.tensor([b]))[0], rtol=1e-9, atol=1e-9)
    unshifted = model.lm_head(model.hidden_states(torch.tensor(a), torch.arange(6), dense_attention))
    torch.testing.assert_close(got[0, 1:], unshifted[:-1], rtol=1e-9, atol=1e-9)
    assert not torch.allclose(got[0, 1:], unshifted[1:])


def test_train_writes_a_dream_checkpoint(tmp_path, monkeypatch):
    """`dllm-bench train --model-type Dream`: Dream's config.json, weight names (biases trained),
    tokenizer and chat template; loadable, and the layout check passes."""
    from dllm_bench.train.loop import TrainConfig, train

    kw = dict(train_facts=(2, 3), eval_facts=2, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2,
              mlp_hidden_size=64, batch_size=4, steps=3, warmup=1, eval_every=3, eval_n=2,
              tokenizer_corpus=200, threads=1, model_type="Dream")
    train(TrainConfig(out=str(tmp_path / "a"), **kw), log=lambda s: None)
    train(TrainConfig(out=str(tmp_path / "b"), **kw), log=lambda s: None)
    a = tmp_path / "a"
    assert (a / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert check_layout(a).ok and load_config(a).family.name == "Dream"
    w = load_file(str(a / "model.safetensors"))
    assert set(w) == dream_names(1) and w["model.layers.0.self_attn.q_proj.bias"].abs().max() > 0
    assert json.loads((a / "tokenizer_config.json").read_text())["chat_template"] == token_layout("Dream").chat_template
    assert load_model(a).config.shift == 1
