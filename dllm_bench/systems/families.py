"""Which systems run which model family: the engine every family the model seam loads, a baseline
the families its registry entry lists (`SystemSpec.families`; LLaDA alone where it lists none, as
every baseline was written for LLaDA first)."""
from __future__ import annotations

from collections.abc import Sequence

from dllm_bench.errors import UserError
from dllm_bench.systems.spec import ENGINE, SystemVariant, baseline_registry
from engine.models import family_of

BASELINE_FAMILIES = ("llada",)  # a registry entry without `families`


def supports(system: str, model_type: str) -> bool:
    if system == ENGINE:
        return True
    spec = baseline_registry().get(system)
    return spec is None or model_type in getattr(spec, "families", BASELINE_FAMILIES)


def family_systems(model_type: str) -> list[str]:
    """The systems that run models of `model_type`, the engine first."""
    return [s for s in (ENGINE, *baseline_registry()) if supports(s, model_type)]


def check_supports(system: str, model_type: str) -> None:
    """UserError (one line) when `system` has no version for the family."""
    if not supports(system, model_type):
        name = family_of(model_type).name
        raise UserError(f"system {system!r} has no {name} version yet; systems for {name} models: "
                        f"{', '.join(family_systems(model_type))}")


def for_family(variants: Sequence[SystemVariant], model_type: str, explicit: bool) -> list[SystemVariant]:
    """The variants a run on a `model_type` model keeps: all of them when each system supports the
    family; else an explicit list is refused (one line) and a default one keeps what supports it."""
    if explicit:
        for v in variants:
            check_supports(v.name, model_type)
    return [v for v in variants if supports(v.name, model_type)]
