"""Load one rank's slices of an HF checkpoint of any family (the single-device loader's checks)."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.models import build_model, config_from_pretrained, weight_files
from engine.parallel.group import TPGroup
from engine.parallel.model import ShardedLM
from engine.parallel.sharding import slice_of


def load_sharded(path: str | Path, tp: TPGroup, dtype: torch.dtype) -> ShardedLM:
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    cfg = config_from_pretrained(path)
    with torch.device("meta"):
        model = ShardedLM(cfg, tp)
        full = {k: tuple(v.shape) for k, v in build_model(cfg).state_dict().items()}
    ours = {cfg.family.hf_name(k): k for k in full}      # the checkpoint's names -> ours
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        try:
            with safe_open(str(path / f), framework="pt", device="cpu") as st:
                for hf in st.keys():
                    if hf not in ours:
                        continue
                    name, piece = ours[hf], st.get_slice(hf)
                    if tuple(piece.get_shape()) != full[name]:
                        raise ValueError(f"weight {hf} has shape {tuple(piece.get_shape())}, "
                                         f"config implies {full[name]}")
                    state[name] = piece[slice_of(name, full[name], tp.rank, tp.size)].to(tp.device, dtype)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"corrupt safetensors file {path / f}: {e}") from None
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"checkpoint {path} lacks {len(missing)} weights, e.g. {cfg.family.hf_name(missing[0])}")
    model.load_state_dict({k: state[k] for k in expected}, assign=True)
    model.fuse()                 # each rank's own q/k/v and gate/up slices, fused (DenseBlock.fuse)
    return model.eval()
