"""Per-request decoding parameters (LLaDA's `generate` arguments), validated on construction."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.decoding import Decoding

REMASKING = ("low_confidence", "random")


@dataclass(frozen=True)
class SamplingParams:
    gen_length: int = 128
    steps: int = 128
    block_length: int = 32
    temperature: float = 0.0
    remasking: str = "low_confidence"
    cfg_scale: float = 0.0
    # seed of the request's own generators: its tokens do not depend on what it is batched with
    seed: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)
    # engine.decoding: fixed (the schedule over `steps`) or a parallel policy (blocks end when unmasked);
    # a library caller may give its text
    decoding: Decoding = Decoding()

    def __post_init__(self) -> None:
        for name in ("gen_length", "steps", "block_length"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.gen_length % self.block_length:
            raise ValueError(
                f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})"
            )
        if self.steps % self.num_blocks:
            raise ValueError(
                f"steps ({self.steps}) must be divisible by the number of blocks ({self.num_blocks})"
            )
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking must be one of {REMASKING}, got {self.remasking!r}")
        if self.cfg_scale < 0:
            raise ValueError(f"cfg_scale must be >= 0, got {self.cfg_scale}")
        object.__setattr__(self, "decoding", Decoding.parse(self.decoding))

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks
