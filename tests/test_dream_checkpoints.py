"""The Dream family's checkpoints: the presets (tiny-dream, similar-dream, dream-7b), a made
checkpoint in Dream's HF layout (Qwen2 weight names with q/k/v biases, single file or sharded
index, Dream's config.json keys, the synthetic tokenizer with Dream's special tokens and ChatML),
its layout checks (one line per problem); the systems a Dream model runs and every command of the
README's table on `--model tiny-dream` (tests/test_dream_commands.py)."""
from __future__ import annotations

import json
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
    from tests.hf_layout import REAL_LLADA_CONFIG

    raw = get_preset("tiny").config_dict()
    assert set(REAL_LLADA_CONFIG) - {"auto_map"} <= set(raw) and raw["model_type"] == "llada" and "hidden_size" not in raw
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
