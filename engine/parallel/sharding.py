"""Which slice of every weight a tensor-parallel rank holds (Megatron's split; docs/PARALLEL.md)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.models import ModelConfig

COLUMN, ROW, VOCAB, REPLICATED = "column", "row", "vocab", "replicated"
_BLOCK = {"q_proj": COLUMN, "k_proj": COLUMN, "v_proj": COLUMN, "attn_out": ROW,
          "ff_proj": COLUMN, "up_proj": COLUMN, "ff_out": ROW, "attn_norm": REPLICATED, "ff_norm": REPLICATED}


@dataclass
class RankConfig(ModelConfig):
    """The checkpoint's config as one rank sees it: global fields unchanged, `kv_heads` the rank's."""

    tp_size: int = 1

    @property
    def kv_heads(self) -> int:
        return (self.n_kv_heads or self.n_heads) // self.tp_size

    @classmethod
    def of(cls, cfg: ModelConfig, tp_size: int) -> RankConfig:
        check_divisible(cfg, tp_size)
        return cls(**cfg.to_dict(), tp_size=tp_size)


def check_divisible(cfg: ModelConfig, n: int) -> None:
    """ValueError unless every split dimension divides by n (whole heads per rank)."""
    if n < 1:
        raise ValueError(f"tensor-parallel size must be >= 1, got {n}")
    for what, size in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.kv_heads),
                       ("mlp_hidden_size", cfg.mlp_hidden_size), ("the vocabulary (embedding_size)", cfg.padded_vocab)):
        if size % n:
            raise ValueError(f"tensor-parallel size {n} does not divide {what} = {size}")


def split_of(name: str) -> str:
    parts = name.split(".")
    if "blocks" in parts:
        return _BLOCK[parts[-2]]
    if parts[-2] in ("wte", "ff_out"):
        return VOCAB
    return REPLICATED


def slice_of(name: str, shape: tuple[int, ...], rank: int, size: int) -> tuple[slice, ...]:
    """The rank's part of weight `name` of full `shape` ([out, in] for linears)."""
    kind = split_of(name)
    if kind == REPLICATED:
        return tuple(slice(None) for _ in shape)
    axis = 1 if kind == ROW else 0
    n = shape[axis] // size
    return tuple(slice(rank * n, (rank + 1) * n) if i == axis else slice(None) for i in range(len(shape)))


def vocab_range(cfg: ModelConfig, rank: int, size: int) -> tuple[int, int]:
    """[start, end) of the vocabulary rows rank holds (embedding and LM head alike)."""
    n = cfg.padded_vocab // size
    return rank * n, (rank + 1) * n
