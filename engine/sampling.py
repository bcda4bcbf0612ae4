"""Per-request decoding parameters: LLaDA's `generate` and Dream's `diffusion_generate` arguments, validated."""
from __future__ import annotations

from dataclasses import dataclass

from engine.decoding import Decoding
from engine.unmask import dream_schedule, transfer_schedule

DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
EPS = 1e-3


def _refuse(bad: bool, message: str) -> None:
    if bad:
        raise ValueError(message)


@dataclass(frozen=True)
class SamplingParams:
    gen_length: int = 128
    steps: int = 128
    block_length: int = 32
    temperature: float = 0.0
    remasking: str = "low_confidence"
    cfg_scale: float = 0.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    decoding: Decoding = Decoding()        # a library caller may give its text
    schedule: str = "linear"
    eps: float = EPS
    top_p: float | None = None
    top_k: int | None = None
    alg_temp: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("gen_length", self.gen_length), ("steps", self.steps), ("block_length", self.block_length)):
            _refuse(not isinstance(v, int) or v <= 0, f"{name} must be a positive integer, got {v!r}")
        _refuse(self.gen_length % self.block_length != 0,
                f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})")
        _refuse(self.steps % self.num_blocks != 0,
                f"steps ({self.steps}) must be divisible by the number of blocks ({self.num_blocks})")
        _refuse(self.temperature < 0, f"temperature must be >= 0, got {self.temperature}")
        rules = ("low_confidence", "random") + DREAM_ALGS
        _refuse(self.remasking not in rules, f"remasking must be one of {rules}, got {self.remasking!r}")
        _refuse(self.cfg_scale < 0, f"cfg_scale must be >= 0, got {self.cfg_scale}")
        object.__setattr__(self, "decoding", Decoding.parse(self.decoding))
        _refuse(self.schedule not in ("linear", "timegrid"), f"schedule must be linear or timegrid: {self.schedule!r}")
        _refuse(not 0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps!r}")
        _refuse(self.eps != EPS and self.schedule != "timegrid",
                f"eps applies to schedule 'timegrid' (Dream's time grid), not to {self.schedule!r}")
        _refuse(self.top_p is not None and not 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        _refuse(self.top_k is not None and (not isinstance(self.top_k, int) or isinstance(self.top_k, bool)
                                            or self.top_k < 1), f"top_k must be a positive integer, got {self.top_k!r}")
        _refuse(self.alg_temp is not None and not self.alg_temp >= 0, f"alg_temp must be >= 0, got {self.alg_temp!r}")
        given = [n for n in ("top_p", "top_k", "alg_temp") if getattr(self, n) is not None]
        _refuse(bool(given) and not self.dream_rule, f"{', '.join(given)} apply to Dream's algs (remasking one of "
                f"{DREAM_ALGS}), not to {self.remasking!r}")
        origin, policy = self.remasking == "origin", self.decoding
        _refuse(origin and self.schedule != "timegrid",
                "remasking 'origin' moves each mask with probability 1 - s/t: it needs schedule 'timegrid'")
        _refuse(origin and self.alg_temp, "alg_temp chooses among ranked positions: remasking 'origin' ranks none")
        _refuse(not policy.fixed and (origin or bool(self.alg_temp)), f"decoding {policy} takes a confidence prefix: "
                f"it cannot combine with {'remasking origin' if origin else 'alg_temp'} (use decoding 'fixed')")
        _refuse(self.remasking == "entropy" and policy.kind in ("threshold", "factor"),
                f"decoding {policy} compares probabilities: remasking 'entropy' scores by minus the entropy "
                "(use maskgit_plus or topk_margin, or decoding entropy:γ)")

    @classmethod
    def dream(cls, gen_length: int = 128, alg: str = "origin", **kw) -> SamplingParams:
        """Dream's `diffusion_generate` arguments (upstream's defaults) as params: one block, the time grid."""
        return cls(gen_length=gen_length, block_length=gen_length, remasking=alg, schedule="timegrid", **kw)

    @property
    def dream_rule(self) -> bool:
        return self.remasking in DREAM_ALGS

    def block_counts(self, n_masked: int) -> list[int]:
        """The fixed decoding's commits at each of a block's steps, from its `n_masked` masks."""
        if self.schedule == "timegrid":
            return dream_schedule(n_masked, self.steps_per_block, self.eps)
        return transfer_schedule(n_masked, self.steps_per_block)

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks
