"""The Dream family's checkpoints: the presets (tiny-dream, similar-dream, dream-7b), a made
checkpoint in Dream's HF layout (Qwen2 weight names with q/k/v biases, single file or sharded
index, Dream's config.json keys, the synthetic tokenizer with Dream's special tokens and ChatML),
its layout checks (one line per problem), the systems a Dream model runs, and every command of the
README's table on `--model tiny-dream`."""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm_bench.checkpoints import tokenizer as tb
from dllm_bench.checkpoints.layout import check_layout, expected_shapes, load_config
from dllm_bench.checkpoints.make import INDEX_FILE, make_checkpoint, weight_shapes
from dllm_bench.checkpoints.presets import get_preset
from dllm_bench.checkpoints.token_layouts import DREAM_SPECIAL_IDS, token_layout
from dllm_bench.errors import UserError
from engine.models import (
    build_model,
    config_from_dict,
    config_from_pretrained,
    dense_attention,
    hf_state_dict,
    load_model,
)

DREAM_PRESETS = ("tiny-dream", "similar-dream", "dream-7b")
# Qwen2 / Dream module names of one layer (Dream's modeling_dream.py: q/k/v carry biases, o does not)
LAYER = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
         "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
         "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
CHATML = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
          "<|im_start|>user\nWhat is 2+3?\n<|im_end|>\n<|im_start|>assistant\n")


def dream_names(n_layers: int) -> set[str]:
    return ({"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
            | {f"model.layers.{i}.{w}" for i in range(n_layers) for w in LAYER})


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


@pytest.fixture(scope="module")
def dream_dir(tmp_path_factory):
    return make_checkpoint("tiny-dream", tmp_path_factory.mktemp("tiny-dream") / "ckpt")


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    return make_checkpoint("tiny-dream", tmp_path_factory.mktemp("tiny-dream-3") / "ckpt", shards=3)


# ------------------------------------------------------------------ presets
@pytest.mark.parametrize("name", DREAM_PRESETS)
def test_dream_presets_are_of_the_dream_family(name):
    p = get_preset(name)
    cfg = p.model_config()
    assert (p.model_type, cfg.family.name, cfg.qkv_bias, cfg.shift) == ("Dream", "Dream", True, 1)
    assert (cfg.rope_theta, cfg.rms_norm_eps) == (1e6, 1e-6)
    assert cfg.n_heads > cfg.kv_heads and cfg.n_heads % cfg.kv_heads == 0          # GQA
    # the config.json it writes reads back as the same model, through the family
    assert config_from_dict(p.config_dict()) == cfg
    ids = token_layout("Dream").config_ids(p.vocab_size)
    assert (cfg.eos_token_id, cfg.pad_token_id, cfg.mask_token_id) == (
        ids["eos_token_id"], ids["pad_token_id"], ids["mask_token_id"])
    with torch.device("meta"):
        n = sum(t.numel() for t in build_model(cfg).state_dict().values())
    assert p.n_params == n                                                       # biases counted


def test_dream_7b_preset_is_the_real_shape_and_layout():
    p = get_preset("dream-7b")
    raw = p.config_dict()
    want = {"model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 3584, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
            "rope_theta": 1e6, "rms_norm_eps": 1e-6, "mask_token_id": 151666, "eos_token_id": 151643,
            "pad_token_id": 151643, "max_position_embeddings": 131072, "tie_word_embeddings": False,
            "hidden_act": "silu", "torch_dtype": "bfloat16"}
    assert {k: raw[k] for k in want} == want
    assert (p.draw_device, p.dtype, p.shards) == ("cuda", "bfloat16", 4)
    # Qwen2.5-7B's published size (Dream-7B is initialised from it): 7.62B parameters
    assert p.n_params == pytest.approx(7.62e9, rel=1e-3)
    shapes = weight_shapes(p)
    assert set(shapes) == dream_names(28) and len(shapes) == 339
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (512, 3584)
    assert shapes["model.layers.0.self_attn.k_proj.bias"] == (512,)
    assert shapes["lm_head.weight"] == shapes["model.embed_tokens.weight"] == (152064, 3584)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_dream_7b_is_made_on_cuda_only(tmp_path):
    with pytest.raises(UserError, match="CUDA device"):
        make_checkpoint("dream-7b", tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_llada_presets_keep_their_layout():
    """A family-aware preset changes nothing for LLaDA: its config is LLaDA-8B-Instruct's fields."""
    from dllm_bench.checkpoints.presets import LLADA_8B_CONFIG

    raw = get_preset("tiny").config_dict()
    assert set(LLADA_8B_CONFIG) <= set(raw) and raw["model_type"] == "llada" and "hidden_size" not in raw
    assert get_preset("tiny").fingerprint()["preset"].keys().isdisjoint({"model_type", "rope_theta", "rms_norm_eps"})


# ------------------------------------------------------------------ a made checkpoint
def test_made_tiny_dream_is_in_dreams_layout(dream_dir):
    p = get_preset("tiny-dream")
    raw = json.loads((dream_dir / "config.json").read_text())
    assert raw["model_type"] == "Dream" and raw["architectures"] == ["DreamModel"]
    assert (raw["hidden_size"], raw["num_hidden_layers"], raw["num_attention_heads"], raw["num_key_value_heads"],
            raw["intermediate_size"], raw["vocab_size"]) == (64, 2, 4, 2, 128, 512)
    assert "d_model" not in raw and "n_heads" not in raw
    w = load_file(str(dream_dir / "model.safetensors"))
    assert set(w) == dream_names(2)
    assert {k: tuple(v.shape) for k, v in w.items()} == weight_shapes(p)
    assert w["model.layers.1.self_attn.k_proj.bias"].shape == (p.n_kv_heads * p.head_dim,)
    # biases drawn like the matrices (a dropped bias changes the output), norms at one
    bias = w["model.layers.0.self_attn.q_proj.bias"]
    assert bias.abs().max() > 0 and abs(bias.std().item() - 0.02) < 0.01
    assert torch.equal(w["model.norm.weight"], torch.ones(64))
    assert not torch.equal(w["model.embed_tokens.weight"], w["lm_head.weight"])


def test_sharded_dream_checkpoint_loads_as_the_single_file(dream_dir, sharded_dir):
    index = json.loads((sharded_dir / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == dream_names(2)
    assert sorted(set(index["weight_map"].values())) == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    single, sharded = load_model(dream_dir), load_model(sharded_dir)
    assert single.config == config_from_pretrained(dream_dir) and single.config.shift == 1
    # every weight, biases included, is the file's, under Dream's name
    on_disk = load_file(str(dream_dir / "model.safetensors"))
    mine = hf_state_dict(single)
    assert mine.keys() == on_disk.keys() and all(torch.equal(mine[k], on_disk[k]) for k in on_disk)
    ids = torch.tensor([[3, 5, 7, single.config.mask_token_id, single.config.mask_token_id]])
    assert torch.equal(single(ids), sharded(ids))


def test_dream_tokenizer_has_dreams_tokens_and_chatml(dream_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(dream_dir), local_files_only=True)
    cfg = config_from_pretrained(dream_dir)
    assert (tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (
        cfg.eos_token_id, cfg.pad_token_id, cfg.mask_token_id)
    assert (tok.eos_token, tok.mask_token, len(tok)) == ("<|endoftext|>", "<|mask|>", 512)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?\n"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == CHATML                       # a default system turn, content untrimmed
    own = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                  add_generation_prompt=False, tokenize=False)
    assert own == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    enc = tok(text, add_special_tokens=False)["input_ids"]
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    assert enc.count(start) == 3 and enc.count(end) == 2 and enc[0] == start
    assert tok.decode(enc) == text


def test_dream_vocab_tokenizer_uses_dreams_ids(tmp_path):
    special = tb.save_tokenizer(tmp_path, 152064, 4096, model_type="Dream")
    assert special.tokens == DREAM_SPECIAL_IDS
    assert special.config_fields() == {"bos_token_id": 151643, "eos_token_id": 151643, "pad_token_id": 151643,
                                       "mask_token_id": 151666}
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == token_layout("Dream").chat_template and cfg["mask_token"] == "<|mask|>"


# ------------------------------------------------------------------ layout checks
def _broken_copy(src: Path, dst: Path, change) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    change(dst)
    return dst


def _edit_weights(fn):
    def change(d: Path):
        w = load_file(str(d / "model.safetensors"))
        fn(w)
        save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    return change


def _edit_config(**fields):
    def change(d: Path):
        raw = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(raw | fields))
    return change


BROKEN = {
    "missing bias": (_edit_weights(lambda w: w.pop("model.layers.1.self_attn.v_proj.bias")),
                     "1 tensor(s) missing, e.g. model.layers.1.self_attn.v_proj.bias"),
    "wrong shape": (_edit_weights(lambda w: w.update({"model.layers.0.self_attn.k_proj.bias": torch.zeros(64)})),
                    "tensor model.layers.0.self_attn.k_proj.bias has shape (64,), config.json implies (32,)"),
    "LLaDA's names": (_edit_weights(lambda w: w.update({"model.transformer.ln_f.weight": w.pop("model.norm.weight")})),
                      "model.norm.weight"),
    "unknown model_type": (_edit_config(model_type="Dream2"), "model_type 'Dream2'; supported families:"),
    "bad field": (_edit_config(num_attention_heads=0), "'num_attention_heads' must be a positive integer, got 0"),
    "mask outside vocab": (_edit_config(mask_token_id=600), "'mask_token_id' 600 is outside the 512-row embedding"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_dream_checkpoint_is_one_line(case, dream_dir, tmp_path):
    from dllm_bench.checkpoints.load import model_dir

    change, want = BROKEN[case]
    d = _broken_copy(dream_dir, tmp_path / "bad", change)
    report = check_layout(d)
    assert not report.ok and any(want in p for p in report.problems), report.problems
    with pytest.raises(UserError) as e:
        model_dir(str(d))
    assert "\n" not in str(e.value) and str(e.value).startswith(f"bad checkpoint {d}")


def test_layout_check_names_the_family_keys(dream_dir):
    cfg = load_config(dream_dir)
    assert expected_shapes(cfg) == weight_shapes(get_preset("tiny-dream"))
    assert check_layout(dream_dir).ok


def test_a_broken_dream_checkpoint_is_refused_by_the_commands(dream_dir, tmp_path, refused):
    d = _broken_copy(dream_dir, tmp_path / "bad", BROKEN["missing bias"][0])
    line = refused("generate", "--model", str(d), "--prompt-ids", "1,2,3", watch=(d,))
    assert "model.layers.1.self_attn.v_proj.bias" in line


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


def test_serve_refuses_a_named_baseline_without_a_dream_version(cache, refused):
    from dllm_bench.systems.families import supports
    from dllm_bench.systems.spec import baseline_registry

    missing = [s for s in baseline_registry() if not supports(s, "Dream")]
    if not missing:
        pytest.skip("every baseline has a Dream version")
    line = refused("serve", "--model", "tiny-dream", "--systems", f"engine,{missing[0]}", "--rps", "inf",
                   "--num-prompts", "2")
    assert f"system {missing[0]!r} has no Dream version yet" in line


# ------------------------------------------------------------------ every command on tiny-dream
@functools.lru_cache(maxsize=1)
def engine_refusal() -> str | None:
    """The engine's refusal of a Dream model while it does not serve shifted-prediction models yet;
    None once it does (the tests below that need it then run)."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    with torch.device("meta"):
        model = build_model(get_preset("tiny-dream").model_config())
    model = model.to_empty(device="cpu")
    try:
        LLMEngine(EngineConfig(device="cpu", cache="none", kv_pool_tokens=64), model=model)
    except ValueError as e:
        if "shifted-prediction" in str(e):
            return str(e)
        raise
    return None


def needs_engine():
    why = engine_refusal()
    if why:
        pytest.skip(f"the engine refuses Dream models until it serves them: {why}")


def _json(out: str) -> dict:
    return json.loads(out[out.index("{"):])


def check_models_list(r, tmp):
    assert all(name in r.stdout for name in DREAM_PRESETS) and "Dream" in r.stdout


def check_models_make(r, tmp):
    assert check_layout(tmp / "made").ok and load_config(tmp / "made").family.name == "Dream"
    assert "mask_token_id=511" in r.stdout


def check_doctor(r, tmp):
    row = next(c for c in _json(r.stdout)["checks"] if c["name"] == "checkpoint")
    assert row["status"] == "ok" and row["data"]["family"] == "Dream" and row["data"]["kv_heads"] == 2


def check_profile(r, tmp):
    doc = _json(r.stdout)
    assert doc["model"] == "tiny-dream" and doc["profiles"]


def check_generate(r, tmp):
    out = _json(r.stdout)["outputs"][0]
    assert len(out["tokens"]) == 8 and get_preset("tiny-dream").special_ids()["mask_token_id"] not in out["tokens"]


def check_run(r, tmp):
    doc = _json(r.stdout)
    assert Path(doc["run_dir"]).is_dir()


def check_accuracy(r, tmp):
    doc = _json(r.stdout)
    assert doc["n"] == 2 and all(p["n"] == 2 for p in doc["points"])


COMMANDS = {  # name: (args, needs the engine, check)
    "models list": (["models", "list"], False, check_models_list),
    "models make": (["models", "make", "tiny-dream", "--out", "{tmp}/made"], False, check_models_make),
    "doctor": (["doctor", "--model", "tiny-dream", "--device", "cpu", "--json"], False, check_doctor),
    "profile": (["profile", "--model", "tiny-dream", "--json"], False, check_profile),
    "generate": (["generate", "--model", "tiny-dream", "--prompt", "Hi", "--gen-length", "8", "--block-length", "8",
                  "--json"], True, check_generate),
    "serve": (["serve", "--model", "tiny-dream", "--rps", "inf", "--num-prompts", "4", "--json"], True, check_run),
    "memory": (["memory", "--model", "tiny-dream", "--memory-budget", "2MiB", "--systems", "engine", "--json"], True,
               check_run),
    "profile-step": (["profile-step", "--model", "tiny-dream", "--batch", "2", "--json"], True, check_profile),
    "simulate": (["simulate", "--model", "tiny-dream", "--hardware", "h100", "--num-prompts", "4", "--rps", "inf",
                  "--json"], True, check_run),
    "accuracy": (["accuracy", "--model", "tiny-dream", "--task", "synth", "--limit", "2", "--retention", "0.5",
                  "--no-r1", "--json", "--threads", "1"], True, check_accuracy),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_takes_tiny_dream(command, cache, tmp_path, monkeypatch, cli_in_process):
    args, engine, check = COMMANDS[command]
    if engine:
        needs_engine()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path / "runs"))
    r = cli_in_process(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    check(r, tmp_path)


def test_server_chats_with_tiny_dream_in_chatml(cache):
    """`server --model tiny-dream`: the chat template is the checkpoint's (ChatML), so the prompt
    the engine sees is the ChatML rendering of the messages."""
    needs_engine()
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
    tokenizer and chat template; loadable, and the layout check passes. The learning curve's probe
    decodes with the engine: while the engine refuses Dream models it is left out here."""
    from dllm_bench.train import loop
    from dllm_bench.train.loop import TrainConfig, train

    if engine_refusal():
        monkeypatch.setattr(loop, "probe_accuracy", lambda *a, **k: (0.0, 0.0))

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
