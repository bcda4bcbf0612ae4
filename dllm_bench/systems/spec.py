"""Serving systems for `dllm-bench serve`: parse `--systems` specs, validate knobs, resolve them
against the run-wide defaults (building a live system is dllm_bench.systems.build).

A spec is `NAME[:KEY=VALUE[,KEY=VALUE...]]`; the outer list shares the comma, so a token with
"=" continues the previous spec's knobs (docs/SERVE.md, "Systems and variants"). `engine`'s
knobs are EngineConfig fields with its defaults (`cache=auto`; the paper's system is
PAPER_ENGINE); each baseline of `baselines.SYSTEMS` has its registry knobs plus `batch`
(none: the largest static batch that fits, measured; `upstream`: its upstream code's batch).
A flag's single value enters through make_variant, never spliced into a spec.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from baselines import SYSTEMS
from dllm_bench.errors import UserError
from engine.config import CHOICES, EngineConfig

ENGINE = "engine"
ENDPOINT = "endpoint"   # an OpenAI-compatible server measured over HTTP (`serve --endpoint`)
BATCH_KNOB = "batch"
DEFAULT_SYSTEMS = "engine,fast-dllm,dllm-cache,sparse-dllm"
UPSTREAM = "upstream"
# The static batch each baseline's upstream code runs its generation with (the registry's
# `upstream_batch`, each with the upstream file it is read from).
UPSTREAM_BATCH = {name: spec.upstream_batch for name, spec in SYSTEMS.items() if spec.upstream_batch is not None}
BASELINE_BATCH_MODES = ("max-fit", UPSTREAM, "both")
# The paper's comparators, named by their registry facts: the baseline whose KV retention is a
# knob (Sparse-dLLM: the sparse-attention reference) and the one with parallel-decoding rules
# (Fast-dLLM: the decoding reference).
SPARSE_BASELINE = next(name for name, spec in SYSTEMS.items() if spec.retention_knob)
DECODING_BASELINE = next(name for name, spec in SYSTEMS.items() if spec.decoding_knobs)


# ---------------------------------------------------------------- knob value parsers
def _none(v: str) -> bool:
    return v.strip().lower() in ("none", "null")


def _int(v: str) -> int:
    try:
        f = float(v)
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None
    if not f.is_integer():
        raise ValueError(f"expected an integer, got {v!r}")
    return int(f)


def _float(v: str) -> float:
    try:
        f = float(v)
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"expected a finite number, got {v!r}")
    return f


def _bool(v: str) -> bool:
    low = v.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {v!r}")


def _batch(v: str) -> int | str:
    """A baseline's `batch`: a number, or `upstream` (the batch its upstream code runs)."""
    return UPSTREAM if v.strip().lower() == UPSTREAM else _int(v)


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return v
    return parse


# The EngineConfig fields an `engine` variant may set (`engine:KEY=VALUE`), in the order `systems`
# lists them; each knob's type, default and values are the dataclass field's (ENGINE_KNOB_TABLE).
ENGINE_KNOBS = ("cache", "selection", "retention", "pool_window", "delay_step", "scheduler", "max_num_logits",
                "max_num_batched_tokens", "max_num_seqs", "cuda_graphs", "tensor_parallel_size",
                "attention_backend", "ridge_rows", "overhead_rows")
# Optional fields whose None a variant cannot name: cuda_graphs=None means "on for CUDA", which a
# run resolves once for its device (RunSetup.cuda_graphs) before any engine is built.
NOT_NONE = ("cuda_graphs",)


@dataclass(frozen=True)
class Knob:
    """An engine knob: its EngineConfig field's type and default, its parser."""

    name: str
    type: Any
    default: Any
    parse: Callable[[str], Any]


def _field_parser(name: str, annotation: Any) -> Callable[[str], Any]:
    """A knob's parser from its field: the field's values (engine.config.CHOICES) or its type;
    `none` as well for an optional field (not NOT_NONE)."""
    args = typing.get_args(annotation)
    base = next((a for a in args if a is not type(None)), annotation)
    parse = _choice(CHOICES[name]) if name in CHOICES else {bool: _bool, int: _int, float: _float, str: str}[base]
    if type(None) in args and name not in NOT_NONE:
        return lambda v: None if _none(v) else parse(v)
    return parse


def _engine_knob_table() -> dict[str, Knob]:
    hints = typing.get_type_hints(EngineConfig)
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    return {n: Knob(n, hints[n], defaults[n], _field_parser(n, hints[n]))
            for n in ENGINE_KNOBS}


ENGINE_KNOB_TABLE = _engine_knob_table()
# The paper's dLLM-Serve (head-centric sparse KV for every request): what reproductions name.
PAPER_ENGINE = "engine:cache=sparse"


def _by_default(default: Any) -> Callable[[str], Any]:
    """Parser for a baseline knob, from the type of its default value."""
    if isinstance(default, bool):
        return _bool
    if isinstance(default, int):
        return _int
    if isinstance(default, float):
        return _float
    if isinstance(default, str):
        return str

    def parse_any(v: str) -> Any:  # default None: None, a number, or a word
        if _none(v):
            return None
        try:
            return _int(v)
        except ValueError:
            pass
        try:
            float(v)
        except ValueError:
            return v
        return _float(v)
    return parse_any


def baseline_registry() -> Mapping[str, Any]:
    """baselines.SYSTEMS (imported lazily: it pulls in torch)."""
    return SYSTEMS


def system_names() -> list[str]:
    return [ENGINE, *baseline_registry()]


def retention_knobs(retention: float) -> dict[str, dict[str, float]]:
    """Per-system knobs that set every baseline with a KV retention knob (Sparse-dLLM's
    `keep_ratio`) to `retention`: one retention for every sparse system (the paper's
    "Algorithmic Consistency")."""
    return {name: {spec.retention_knob: retention} for name, spec in baseline_registry().items()
            if spec.retention_knob}


def baseline_retention(name: str, knobs: Mapping[str, Any], default: float) -> float:
    """The KV retention baseline `name` runs at with `knobs`: its retention knob's value
    (`default` when unset), or 1.0 for a baseline that keeps every token's KV."""
    knob = baseline_registry()[name].retention_knob
    return float(knobs.get(knob, default)) if knob else 1.0


def knob_parsers(name: str) -> dict[str, Callable[[str], Any]]:
    if name == ENGINE:
        return {k: knob.parse for k, knob in ENGINE_KNOB_TABLE.items()}
    spec = baseline_registry()[name]
    parsers = {k: _by_default(d) for k, d in spec.knobs.items()}
    parsers[BATCH_KNOB] = _batch
    return parsers


# ---------------------------------------------------------------- specs
@dataclass(frozen=True)
class SystemVariant:
    """One system to serve, with its knob overrides in the order given."""

    name: str
    knobs: tuple[tuple[str, Any], ...] = ()
    label: str = ""  # canonical spec text; names the variant in every table and point

    @property
    def is_baseline(self) -> bool:
        return self.name not in (ENGINE, ENDPOINT)

    @property
    def is_endpoint(self) -> bool:
        return self.name == ENDPOINT

    @property
    def knob_dict(self) -> dict[str, Any]:
        return dict(self.knobs)

    @property
    def batch(self) -> int | str | None:
        """The `batch` knob as given: None (max-fit), a number, or "upstream"."""
        return self.knob_dict.get(BATCH_KNOB)

    @property
    def static_batch(self) -> tuple[int | None, str]:
        """(B, scenario kind): (None, "max-fit") to be measured, (UPSTREAM_BATCH, "upstream") or
        (N, "fixed")."""
        b = self.batch
        if b is None:
            return None, "max-fit"
        if b == UPSTREAM:
            return UPSTREAM_BATCH[self.name], UPSTREAM
        return int(b), "fixed"

    def to_dict(self) -> dict:
        return {"name": self.name, "knobs": self.knob_dict, "label": self.label}

    @classmethod
    def from_dict(cls, d: Mapping) -> SystemVariant:
        return cls(d["name"], tuple(d.get("knobs", {}).items()), d.get("label") or d["name"])


def _fmt_value(v: Any) -> str:
    return "none" if v is None else str(v)


def _validate(name: str, knobs: dict[str, Any], spec_text: str) -> None:
    """Whole-combination checks the per-value parsers cannot do (engine: EngineConfig's own)."""
    if name == ENGINE:
        try:
            EngineConfig(**knobs)
        except ValueError as e:
            raise UserError(f"system {spec_text!r}: {e}") from None
        return
    b = knobs.get(BATCH_KNOB)
    if b == UPSTREAM and name not in UPSTREAM_BATCH:
        raise UserError(f"system {spec_text!r}: no upstream batch is known for {name}")
    if isinstance(b, int) and b < 1:
        raise UserError(f"system {spec_text!r}: batch must be >= 1, got {b}")
    policy_knobs = {k: v for k, v in knobs.items() if k != BATCH_KNOB}
    spec = baseline_registry()[name]
    try:
        # The policies check their knobs before touching the model, so None is enough here.
        spec.policy(None, **{spec.knob_args.get(k, k): v for k, v in {**spec.knobs, **policy_knobs}.items()})
    except ValueError as e:
        raise UserError(f"system {spec_text!r}: {e}") from None
    except Exception:  # noqa: BLE001 - a policy that needs the model: checked when it is built
        pass


def parse_system(text: str) -> SystemVariant:
    """`name[:k=v[,k=v]]` -> SystemVariant (UserError for unknown names, knobs or values)."""
    text = text.strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    names = system_names()
    if name not in names:
        raise UserError(f"unknown system {name!r}; systems: {', '.join(names)}")
    pairs = []
    for item in (p.strip() for p in rest.split(",")) if rest.strip() else ():
        key, eq, raw = item.partition("=")
        if not eq or not key.strip() or not raw.strip():
            raise UserError(f"system {text!r}: expected key=value, got {item!r}")
        pairs.append((key, raw))
    return make_variant(name, pairs, text)


def make_variant(name: str, pairs, spec_text: str | None = None) -> SystemVariant:
    """A variant from (knob, text) pairs, each text one value through the knob's own parser: a
    flag's value (`server --cache`, `profile-step --batch`) is never spliced into a spec, so a
    comma or '=' in it is a bad value, not another knob."""
    parsers = knob_parsers(name)
    text = spec_text or name
    knobs: dict[str, Any] = {}
    for key, raw in pairs:
        key = key.strip().replace("-", "_")
        if key not in parsers:
            raise UserError(f"system {name!r} has no knob {key!r}; its knobs: {', '.join(parsers)}")
        if key in knobs:
            raise UserError(f"system {text!r}: knob {key!r} given twice")
        try:
            knobs[key] = parsers[key](str(raw).strip())
        except ValueError as e:
            raise UserError(f"system {text!r}: knob {key}: {e}") from None
    _validate(name, knobs, text)
    label = name + (":" + ",".join(f"{k}={_fmt_value(v)}" for k, v in knobs.items()) if knobs else "")
    return SystemVariant(name, tuple(knobs.items()), label)


def split_specs(text: str, flag: str = "--systems") -> list[str]:
    """Split the outer comma list: a token with '=' continues the previous spec's knobs."""
    specs: list[str] = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        if "=" in tok and ":" not in tok.split("=", 1)[0]:
            if not specs:
                raise UserError(f"{flag}: {tok!r} is a knob with no system before it")
            specs[-1] += ("," if not specs[-1].endswith(":") else "") + tok
        else:
            specs.append(tok)
    return specs


def parse_systems(text: str | None, flag: str = "--systems") -> list[SystemVariant]:
    """The whole --systems value (default: all four of the paper); duplicates are an error.
    `flag`: the option of the command in use, for its messages (profile-step's --system)."""
    specs = split_specs(text if text and text.strip() else DEFAULT_SYSTEMS, flag)
    if not specs:
        raise UserError(f"{flag} is empty")
    out: list[SystemVariant] = []
    seen: set[str] = set()
    for s in specs:
        v = parse_system(s)
        if v.label in seen:
            raise UserError(f"{flag} lists {v.label!r} twice")
        seen.add(v.label)
        out.append(v)
    return out


def with_knob(v: SystemVariant, key: str, value: Any) -> SystemVariant:
    """v with one more knob, checked as if the spec had named it."""
    return make_variant(v.name, [(k, _fmt_value(x)) for k, x in v.knobs] + [(key, value)])


def apply_baseline_batch(variants: list[SystemVariant], mode: str) -> list[SystemVariant]:
    """`--baseline-batch`: every baseline given without a batch runs at the largest static batch
    that fits the budget (max-fit, as given), at its upstream batch (upstream), or both side by
    side (each max-fit variant followed by its upstream one). Explicit batches are kept."""
    if mode not in BASELINE_BATCH_MODES:
        raise UserError(f"--baseline-batch must be one of {', '.join(BASELINE_BATCH_MODES)}, got {mode!r}")
    out: list[SystemVariant] = []
    for v in variants:
        if not v.is_baseline or v.is_endpoint or v.batch is not None or mode == "max-fit":
            out.append(v)
            continue
        up = with_knob(v, BATCH_KNOB, UPSTREAM)
        out += [v, up] if mode == "both" else [up]
    return out


# ---------------------------------------------------------------- resolved configuration
def engine_knobs(variant: SystemVariant, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """EngineConfig overrides for an engine variant: run-wide defaults, then the variant's; the
    cache is always named (EngineConfig's default unless set), so a record says which served."""
    base = {k: v for k, v in defaults.items() if k in ENGINE_KNOBS}
    return {"cache": ENGINE_KNOB_TABLE["cache"].default, **base, **variant.knob_dict}


def baseline_knobs(variant: SystemVariant, defaults: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Policy knobs for a baseline variant (without `batch`): registry defaults, run-wide
    per-system defaults (e.g. the paper's dLLM-Cache prompt interval), then the variant's."""
    spec = baseline_registry()[variant.name]
    knobs = dict(spec.knobs)
    knobs.update({k: v for k, v in dict(defaults.get(variant.name, {})).items() if k in spec.knobs})
    knobs.update({k: v for k, v in variant.knobs if k != BATCH_KNOB})
    return knobs
