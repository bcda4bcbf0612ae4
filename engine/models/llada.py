"""LLaDA (GSAI-ML/LLaDA-8B-*): its config.json fields are the engine's names and its weight names
the dense decoder's; no biases, no shift, untied LM head."""
from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

from engine.models.dense import DenseLM
from engine.models.family import Family, ModelConfig, register

_OURS_ONLY = ("model_type", "qkv_bias", "shift")
# GSAI-ML/LLaDA-8B-Instruct's config.json less auto_map (no remote code) and the special ids (the written
# tokenizer's): the template a shape is written into (tests/test_real_layout.py holds it to the real file)
_HF_TEMPLATE: dict = json.loads(Path(__file__).with_name("llada_config.json").read_text())


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
