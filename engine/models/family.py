"""The model seam: `ModelConfig` (the facts every family gives the engine, baselines, profiler and
simulator), the `Family` registry keyed by config.json's `model_type`, and the one loader."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class ModelConfig:
    """One checkpoint's shape and token ids in the engine's names (defaults: LLaDA-8B's; `shift`: docs/MODELS.md)."""

    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = 32
    n_layers: int = 32
    mlp_hidden_size: int = 12288
    vocab_size: int = 126464
    embedding_size: int | None = 126464
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    max_sequence_length: int = 4096
    mask_token_id: int = 126336
    eos_token_id: int = 126081
    pad_token_id: int = 126081
    bos_token_id: int | None = None
    model_type: str = "llada"
    qkv_bias: bool = False
    shift: int = 0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def padded_vocab(self) -> int:
        """LM-head (and embedding) rows, which may exceed the tokenizer's vocabulary."""
        return self.embedding_size or self.vocab_size

    @property
    def family(self) -> Family:
        return family_of(self.model_type)


@dataclass(frozen=True)
class Family:
    """What a model family brings (docs/ARCHITECTURE.md, "Adding a model family")."""

    name: str
    model_type: str
    from_hf: Callable[[dict], ModelConfig]
    to_hf: Callable[[ModelConfig], dict]
    hf_name: Callable[[str], str]
    model_class: type[nn.Module]


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> None:
    FAMILIES[family.model_type] = family


def family_of(model_type: str | None) -> Family:
    if model_type not in FAMILIES:
        known = ", ".join(f"{f.name} ({t!r})" for t, f in FAMILIES.items())
        raise ValueError(f"config.json has model_type {model_type!r}; supported families: {known}")
    return FAMILIES[model_type]


def config_from_dict(d: dict) -> ModelConfig:
    cfg = family_of(d.get("model_type")).from_hf(d)
    if cfg.d_model % cfg.n_heads or cfg.n_heads % cfg.kv_heads:
        raise ValueError("d_model must divide by n_heads and n_heads by n_kv_heads")
    return cfg


def config_from_pretrained(path: str | Path) -> ModelConfig:
    return config_from_dict(json.loads((Path(path) / "config.json").read_text()))


def build_model(cfg: ModelConfig) -> nn.Module:
    """A model of `cfg`'s family (on the current default device; `torch.device("meta")` for none)."""
    return cfg.family.model_class(cfg)


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {model.config.family.hf_name(k): v for k, v in model.state_dict().items()}


def weight_files(path: Path) -> list[str]:
    """The safetensors files of a checkpoint directory (from its index when sharded)."""
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return ["model.safetensors"]
    return sorted(set(json.loads(index.read_text())["weight_map"].values()))


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               build: Callable[[ModelConfig], nn.Module] = build_model, part: Callable | None = None) -> nn.Module:
    """An HF checkpoint directory of any registered family, read tensor by tensor; `build`: the (meta) model to
    fill, `part(name, full shape)`: the slices of each weight it holds (the whole weight if None)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    cfg = config_from_pretrained(path)
    with torch.device("meta"):
        model = build(cfg)
        full = {k: tuple(v.shape) for k, v in build_model(cfg).state_dict().items()}
    ours = {cfg.family.hf_name(k): k for k in full}
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        try:
            with safe_open(str(path / f), framework="pt", device="cpu") as st:
                for hf in (k for k in st.keys() if k in ours):
                    name, piece = ours[hf], st.get_slice(hf)
                    if tuple(piece.get_shape()) != full[name]:
                        raise ValueError(f"weight {hf} has shape {tuple(piece.get_shape())}, "
                                         f"config implies {full[name]}")
                    state[name] = (piece[part(name, full[name])] if part else st.get_tensor(hf)).to(device, dtype)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"corrupt safetensors file {path / f}: {e}") from None
    missing = sorted(set(full) - set(state))
    if missing:
        raise ValueError(f"checkpoint {path} lacks {len(missing)} weights, e.g. {cfg.family.hf_name(missing[0])}")
    model.load_state_dict(state, assign=True)
    model.to(device).eval().fuse()
    return model
