"""A tiny, decision-sensitive Dream for the engine tests (GQA 7:1 as Dream-7B's 28:4, q/k/v
biases, shift 1) and its HF checkpoint (Fast-dLLM's dual cache written plainly for either family:
tests/plain_dual.py)."""
from __future__ import annotations

import json

import torch

from engine.models import DenseLM, build_model, config_from_dict, hf_state_dict
from tests.helpers import random_prompts, randomized

F64 = torch.float64
MASK, EOS, BOS = 97, 96, 95
DREAM = {"model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 112, "num_attention_heads": 14,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 98,
         "rope_theta": 1e6, "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "mask_token_id": MASK,
         "eos_token_id": EOS, "pad_token_id": EOS, "bos_token_id": BOS, "tie_word_embeddings": False}


def tiny_dream(seed: int = 0, **overrides) -> DenseLM:
    """Weights ~ N(0, 0.5²) (biases too), norms ~ 1: logits spread widely, so a wrong row or key
    set changes decisions."""
    return randomized(build_model(config_from_dict({**DREAM, **overrides})), seed).to(F64).eval()


def dream_prompts(n: int, lengths, seed: int = 0) -> list[list[int]]:
    return random_prompts(n, lengths, seed=seed, vocab=BOS)


def write_dream_checkpoint(model: DenseLM, path):
    """The model in Dream's HF layout (config.json, checkpoint weight names)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.family.to_hf(model.config)))
    save_file({k: v.contiguous() for k, v in hf_state_dict(model).items()}, str(path / "model.safetensors"))
    return path
