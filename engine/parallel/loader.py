"""Load one rank's slices of an HF LLaDA checkpoint (the single-device loader's checks)."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.models.llada import LLaDAConfig, LLaDAModelLM, weight_files
from engine.parallel.group import TPGroup
from engine.parallel.model import ShardedLLaDA
from engine.parallel.sharding import slice_of


def load_sharded(path: str | Path, tp: TPGroup, dtype: torch.dtype) -> ShardedLLaDA:
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    cfg = LLaDAConfig.from_pretrained(path)
    with torch.device("meta"):
        model = ShardedLLaDA(cfg, tp)
        full = {k: tuple(v.shape) for k, v in LLaDAModelLM(cfg).state_dict().items()}
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        try:
            with safe_open(str(path / f), framework="pt", device="cpu") as st:
                for name in st.keys():
                    if name not in full:
                        continue
                    piece = st.get_slice(name)
                    if tuple(piece.get_shape()) != full[name]:
                        raise ValueError(f"weight {name} has shape {tuple(piece.get_shape())}, "
                                         f"config implies {full[name]}")
                    state[name] = piece[slice_of(name, full[name], tp.rank, tp.size)].to(tp.device, dtype)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"corrupt safetensors file {path / f}: {e}") from None
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"checkpoint {path} lacks {len(missing)} weights, e.g. {missing[0]}")
    model.load_state_dict({k: state[k] for k in expected}, assign=True)
    model.fuse()                 # each rank's own q/k/v and gate/up slices, fused (LLaDABlock.fuse)
    return model.eval()
