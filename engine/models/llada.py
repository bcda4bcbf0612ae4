"""LLaDA (GSAI-ML/LLaDA-8B-*): its config.json fields are the engine's names and its weight names
the dense decoder's; no biases, no shift, untied LM head."""
from __future__ import annotations

from dataclasses import asdict, fields

from engine.models.dense import DenseLM
from engine.models.family import Family, ModelConfig, register

_OURS_ONLY = ("model_type", "qkv_bias", "shift")
# LLaDA-8B-Instruct's config.json (GSAI-ML/LLaDA-8B-Instruct on the Hugging Face Hub) less auto_map (no
# remote code here) and the special ids (the written tokenizer's): the template a shape is written into.
# The real file and the test holding this to it: tests/data/llada-8b-instruct/, tests/test_real_layout.py.
_HF_TEMPLATE: dict = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0, "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True, "bias_for_layer_norm": False, "block_group_size": 1,
    "block_type": "llama", "d_model": 4096, "embedding_dropout": 0.0, "embedding_size": 126464,
    "flash_attention": False, "include_bias": False, "include_qkv_bias": False,
    "init_cutoff_factor": None, "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02,
    "input_emb_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
    "max_sequence_length": 4096, "mlp_hidden_size": 12288, "mlp_ratio": 4, "model_type": "llada",
    "multi_query_attention": None, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32,
    "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05, "rope": True,
    "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 126464, "weight_tying": False,
}


def _from_hf(d: dict) -> ModelConfig:
    if d.get("weight_tying"):
        raise ValueError("weight_tying=true is not supported (LLaDA's LM head is untied)")
    if d.get("include_bias") or d.get("include_qkv_bias"):
        raise ValueError("biased LLaDA variants are not supported (LLaDA has no biases)")
    if d.get("alibi") or d.get("rope") is False:
        raise ValueError("only RoPE LLaDA checkpoints are supported")
    known = {f.name for f in fields(ModelConfig)} - set(_OURS_ONLY)
    return ModelConfig(**{k: v for k, v in d.items() if k in known}, model_type="llada")


def _to_hf(cfg: ModelConfig) -> dict:
    d = {k: v for k, v in asdict(cfg).items() if k not in _OURS_ONLY}
    return _HF_TEMPLATE | d | {"model_type": "llada", "weight_tying": False, "include_bias": False, "rope": True}


register(Family("LLaDA", "llada", _from_hf, _to_hf, hf_name=lambda name: name, model_class=DenseLM))
