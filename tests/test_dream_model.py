"""The Dream family through the model seam: our dense decoder with Dream's config equals Qwen2 (the
architecture Dream's modeling file is built on) from `transformers`, made bidirectional, in float64;
the shift; config.json and weight-name mapping, and the seam's refusals."""
from __future__ import annotations

import json

import pytest
import torch

from engine.models import build_model, config_from_dict, config_from_pretrained, hf_state_dict, load_model

DREAM = {"model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 48, "num_attention_heads": 6,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 80, "vocab_size": 97,
         "rope_theta": 1e6, "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "mask_token_id": 96,
         "eos_token_id": 95, "pad_token_id": 95, "bos_token_id": 94, "tie_word_embeddings": False}


def _random_model(cfg, seed=0):
    torch.manual_seed(seed)
    m = build_model(cfg).to(torch.float64)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)     # biases and norms too: a zero bias or unit norm would hide a wrong mapping
    return m


def test_dream_config_maps_to_the_engine_facts():
    cfg = config_from_dict(DREAM)
    assert (cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.n_layers) == (48, 6, 2, 8, 2)
    assert (cfg.mlp_hidden_size, cfg.padded_vocab, cfg.mask_token_id, cfg.eos_token_id) == (80, 97, 96, 95)
    assert cfg.shift == 1 and cfg.qkv_bias and cfg.max_sequence_length == 256
    assert config_from_dict(cfg.family.to_hf(cfg)) == cfg          # config.json written and read back


def test_keys_a_dream_config_leaves_out_take_dreamconfigs_defaults():
    """Upstream's DreamConfig (ZHZisZZ/dllm dllm/pipelines/dream/models/configuration_dream.py): an
    absent num_key_value_heads is 32, a null one the head count; rope_theta, rms_norm_eps and
    max_position_embeddings default to 1e4, 1e-6 and 32768 (not LLaDA-8B's 5e5, 1e-5, 4096)."""
    shape = ("num_key_value_heads", "rope_theta", "rms_norm_eps", "max_position_embeddings")
    bare = {k: v for k, v in DREAM.items() if k not in shape} | {"hidden_size": 512, "num_attention_heads": 64}
    cfg = config_from_dict(bare)
    assert (cfg.kv_heads, cfg.rope_theta, cfg.rms_norm_eps, cfg.max_sequence_length) == (32, 10000.0, 1e-6, 32768)
    assert config_from_dict(bare | {"num_key_value_heads": None}).kv_heads == 64
    assert config_from_dict(DREAM | {"num_key_value_heads": None}).kv_heads == 6
    with pytest.raises(ValueError, match="n_heads by n_kv_heads"):      # 6 query heads cannot share 32 KV heads
        config_from_dict({k: v for k, v in DREAM.items() if k != "num_key_value_heads"})


def test_dream_equals_bidirectional_qwen2_in_float64():
    transformers = pytest.importorskip("transformers")
    cfg = config_from_dict(DREAM)
    ours = _random_model(cfg)
    qcfg = transformers.Qwen2Config(hidden_size=48, num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=2,
                                    intermediate_size=80, vocab_size=97, rope_theta=1e6, rms_norm_eps=1e-6,
                                    max_position_embeddings=256, tie_word_embeddings=False)
    qcfg._attn_implementation = "eager"
    ref = transformers.Qwen2ForCausalLM(qcfg).to(torch.float64).eval()
    missing, unexpected = ref.load_state_dict(hf_state_dict(ours), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(1))
    full = torch.zeros(2, 1, 11, 11, dtype=torch.float64)          # additive mask: every key visible
    with torch.no_grad():
        raw = ref(input_ids=ids, attention_mask=full).logits
    shifted = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)           # Dream's sampler's shift
    # transformers builds its RoPE tables in float32 (ours follow the model's dtype, float64 here):
    # ~1e-7 apart; a wrong name, bias or head mapping moves logits by ~1e-1
    torch.testing.assert_close(ours(ids), shifted, rtol=1e-5, atol=1e-5)


def test_the_logit_row_of_position_p_is_the_head_of_the_hidden_at_p_minus_1():
    from engine.models import dense_attention

    cfg = config_from_dict(DREAM)
    m = _random_model(cfg, seed=3)
    ids = torch.randint(0, 96, (9,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        h = m.hidden_states(ids, torch.arange(9), dense_attention)
        logits = m(ids[None])[0]
        head = m.lm_head(h)
    # float64; the one-row and the whole-canvas GEMM may sum in different orders
    torch.testing.assert_close(logits[1:], head[:-1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logits[0], head[0], rtol=1e-12, atol=1e-12)   # no hidden before 0: its own
    assert not torch.allclose(logits[1:], head[1:])


def _write(path, cfg_dict, state, shards=2):
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg_dict))
    names = sorted(state)
    parts = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for i, part in enumerate(parts):
        f = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k].contiguous() for k in part}, str(path / f))
        weight_map |= dict.fromkeys(part, f)
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def test_a_sharded_dream_checkpoint_loads_with_its_names_and_biases(tmp_path):
    cfg = config_from_dict(DREAM)
    m = _random_model(cfg)
    state = hf_state_dict(m)
    assert "model.layers.1.self_attn.k_proj.bias" in state and "lm_head.weight" in state
    assert "model.layers.0.self_attn.o_proj.bias" not in state
    path = _write(tmp_path / "d", cfg.family.to_hf(cfg), state)
    assert config_from_pretrained(path) == cfg
    loaded = load_model(path, torch.float64)
    ids = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids), m(ids))


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("model.layers.0.self_attn.q_proj.bias"), "lacks 1 weights, e.g. model.layers.0.self_attn.q_proj.bias"),
    (lambda s: s.update({"model.norm.weight": torch.ones(7)}), "weight model.norm.weight has shape (7,)"),
])
def test_a_bad_dream_checkpoint_is_one_line(tmp_path, change, message):
    cfg = config_from_dict(DREAM)
    state = hf_state_dict(_random_model(cfg))
    change(state)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(_write(tmp_path / "d", cfg.family.to_hf(cfg), state), torch.float64)


def test_an_unknown_model_type_names_the_supported_families():
    with pytest.raises(ValueError, match=r"model_type 'gpt2'; supported families: .*Dream \('Dream'\)"):
        config_from_dict({"model_type": "gpt2"})
    with pytest.raises(ValueError, match=r"LLaDA \('llada'\)"):
        config_from_dict({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        config_from_dict(DREAM | {"tie_word_embeddings": True})
    with pytest.raises(ValueError, match="lacks hidden_size"):
        config_from_dict({k: v for k, v in DREAM.items() if k != "hidden_size"})
