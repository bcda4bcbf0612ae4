"""The configurations of a frontier run: every (system variant, decoding policy) pair a system
can run. The engine runs every policy; Fast-dLLM its upstream rules (fixed, threshold, factor);
a system without parallel decoding upstream (LLaDA, dLLM-Cache, Sparse-dLLM) only `fixed`
(dllm_bench.systems.decoding). A pair a system cannot run is left out of the grid, not run
at `fixed` under another name: every point on the plot is what its label says."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dllm_bench.accuracy.points import Point
from dllm_bench.errors import UserError
from dllm_bench.systems import decoding as system_decoding
from dllm_bench.systems.options import check_one_device, variant_ranks
from dllm_bench.systems.spec import (
    ENGINE,
    SystemVariant,
    baseline_knobs,
    baseline_retention,
    engine_knobs,
    parse_systems,
)
from engine.decoding import Decoding

# The engine with each cache that serves it (dual: Fast-dLLM's; sparse: dLLM-Serve's), and
# Fast-dLLM, the baseline with parallel decoding upstream.
DEFAULT_SYSTEMS = "engine:cache=dual,engine:cache=sparse,fast-dllm"
# fixed (the paper's parity mode), then each rule at a few strengths: thresholds from loose to
# strict, Fast-dLLM's factor, and the entropy bound (engine only).
DEFAULT_DECODING = "fixed,threshold:0.5,threshold:0.7,threshold:0.9,threshold:0.99,factor:1,factor:2,entropy:0.1,entropy:1"


@dataclass(frozen=True)
class Config:
    variant: SystemVariant
    decoding: Decoding

    @property
    def system(self) -> str:
        return self.variant.name

    @property
    def label(self) -> str:
        return f"{self.variant.label} · {self.decoding}"

    @property
    def slug(self) -> str:
        """The configuration as a directory name."""
        return re.sub(r"[^A-Za-z0-9.]+", "-", f"{self.variant.label}__{self.decoding}").strip("-")

    def point(self, retention: float) -> Point:
        """The accuracy point this configuration is scored as (dllm_bench.accuracy.evaluate)."""
        if self.system == ENGINE:
            cache = engine_knobs(self.variant, {})["cache"]       # the engine system's default: auto
            sparse = cache in ("sparse", "auto")                 # auto serves sparse once memory binds
            sel = self.variant.knob_dict.get("selection", "head") if sparse else None
            r = float(self.variant.knob_dict.get("retention", retention)) if sparse else 1.0
            return Point(self.label, "engine", "dense" if cache == "none" else "sparse", cache, sel, r)
        r = baseline_retention(self.system, self.variant.knob_dict, retention)
        return Point(self.label, self.system, "baseline", retention=r)

    def engine_knobs(self, defaults: Mapping[str, Any]) -> dict:
        return engine_knobs(self.variant, defaults)

    def baseline_knobs(self, defaults: Mapping[str, Mapping[str, Any]]) -> dict:
        knobs = baseline_knobs(self.variant, defaults)
        knobs.update(system_decoding.resolve(self.system, self.decoding).knobs)
        return knobs


def plan(systems: str | None, decodings: list[Decoding]) -> list[Config]:
    """Every (variant, policy) pair the variant's system has (in --systems order, then policy
    order). A Fast-dLLM variant that fixes its own threshold/factor knob is one configuration."""
    variants = parse_systems(systems or DEFAULT_SYSTEMS)
    out: list[Config] = []
    for v in variants:
        if v.is_endpoint:
            raise UserError("frontier measures systems in process: --systems takes engine and baselines")
        if v.batch is not None:
            raise UserError(f"system {v.label!r}: frontier sets every baseline's static batch to --concurrency")
        check_one_device(variant_ranks(v), v.label, "frontier")
        own = system_decoding.resolve(v.name, Decoding(), v.knob_dict)
        if own.parallel:
            out.append(Config(v, own.decoding))
            continue
        out += [Config(v, d) for d in decodings if system_decoding.supports(v.name, d)]
    if not out:
        raise UserError("frontier: no configuration to run (no --systems entry has any of the --decoding policies)")
    return out
