"""Dream (Dream-org/Dream-v0-Instruct-7B; Dream-Coder and DiffuCoder share it): Qwen2 blocks with
q/k/v biases and GQA, attention made bidirectional, and Qwen's next-token head kept, so the hidden
state at p - 1 predicts token p (`shift` = 1). Config and weight names: its modeling_dream.py."""
from __future__ import annotations

from engine.models.dense import DenseLM
from engine.models.family import Family, ModelConfig, register

# (our config field, Dream's config.json key)
_FIELDS = (("d_model", "hidden_size"), ("n_heads", "num_attention_heads"), ("n_kv_heads", "num_key_value_heads"),
           ("n_layers", "num_hidden_layers"), ("mlp_hidden_size", "intermediate_size"), ("vocab_size", "vocab_size"),
           ("rope_theta", "rope_theta"), ("rms_norm_eps", "rms_norm_eps"),
           ("max_sequence_length", "max_position_embeddings"), ("mask_token_id", "mask_token_id"),
           ("eos_token_id", "eos_token_id"), ("pad_token_id", "pad_token_id"), ("bos_token_id", "bos_token_id"))
_REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
             "mask_token_id")
# DreamConfig's defaults for absent keys (ZHZisZZ/dllm@ca176752 dllm/pipelines/dream/models/configuration_dream.py)
_DEFAULTS = {"num_key_value_heads": 32, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768}
_BLOCK = {"attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
          "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj", "ff_norm": "post_attention_layernorm",
          "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "ff_out": "mlp.down_proj"}
_TOP = {"model.transformer.wte.weight": "model.embed_tokens.weight",
        "model.transformer.ln_f.weight": "model.norm.weight", "model.transformer.ff_out.weight": "lm_head.weight"}


def _from_hf(d: dict) -> ModelConfig:
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ValueError(f"Dream config.json lacks {', '.join(missing)}")
    if d.get("tie_word_embeddings"):
        raise ValueError("tie_word_embeddings=true is not supported (Dream-7B's LM head is untied)")
    if d.get("rope_scaling"):
        raise ValueError("rope_scaling is not supported (Dream-7B has none)")
    if d.get("use_sliding_window"):
        raise ValueError("sliding-window attention is not supported (Dream attends to the whole canvas)")
    d = _DEFAULTS | d
    kw = {ours: d[theirs] for ours, theirs in _FIELDS if d.get(theirs) is not None}
    kw.setdefault("n_kv_heads", kw["n_heads"])      # a null num_key_value_heads: one KV head per query head
    kw.setdefault("eos_token_id", kw.get("pad_token_id", 0))
    kw.setdefault("pad_token_id", kw["eos_token_id"])
    return ModelConfig(**kw, embedding_size=kw["vocab_size"], model_type="Dream", qkv_bias=True, shift=1)


def _to_hf(cfg: ModelConfig) -> dict:
    return {theirs: getattr(cfg, ours) for ours, theirs in _FIELDS} | {
        "model_type": "Dream", "architectures": ["DreamModel"], "hidden_act": "silu", "tie_word_embeddings": False,
        "rope_scaling": None, "use_sliding_window": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"}}


def _hf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    layer, module, kind = name.removeprefix("model.transformer.blocks.").split(".")
    return f"model.layers.{layer}.{_BLOCK[module]}.{kind}"


register(Family("Dream", "Dream", _from_hf, _to_hf, hf_name=_hf_name, model_class=DenseLM))
