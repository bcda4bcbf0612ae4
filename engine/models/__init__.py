"""Model families behind one seam (engine.models.family); importing this registers each."""
from engine.models import dream, llada  # noqa: F401  (registration)
from engine.models.dense import DenseBlock, DenseLM, RotaryEmbedding, dense_attention, rms_norm
from engine.models.family import (
    FAMILIES,
    Family,
    ModelConfig,
    build_model,
    config_from_dict,
    config_from_pretrained,
    family_of,
    hf_state_dict,
    load_model,
)

__all__ = ["FAMILIES", "DenseBlock", "DenseLM", "Family", "ModelConfig", "RotaryEmbedding", "build_model",
           "config_from_dict", "config_from_pretrained", "dense_attention", "family_of", "hf_state_dict", "load_model",
           "rms_norm"]
