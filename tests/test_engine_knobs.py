"""`engine:KEY=VALUE` knobs are EngineConfig's fields: every field a variant may set is parsed with
the field's type, values and default (systems.spec.ENGINE_KNOB_TABLE, derived from the dataclass)."""
from __future__ import annotations

import dataclasses
import typing

import pytest

from dllm_bench.errors import UserError
from dllm_bench.systems.spec import (
    ENGINE,
    ENGINE_KNOB_TABLE,
    ENGINE_KNOBS,
    NOT_NONE,
    make_variant,
)
from engine.config import CHOICES, EngineConfig

FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}
HINTS = typing.get_type_hints(EngineConfig)


def _text(v) -> str:
    return "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _samples(name: str) -> list:
    """Values of the field's type that EngineConfig accepts: its choices, or its default and
    another value of its type, and None where the field is optional."""
    tp = HINTS[name]
    args = typing.get_args(tp)
    base = next((a for a in args if a is not type(None)), tp)
    default = FIELDS[name].default
    if name in CHOICES:
        out = list(CHOICES[name])
    elif base is bool:
        out = [True, False]
    elif base is int:
        out = [default + 2] + ([default] if default is not None else [])   # +2 keeps an odd pool_window odd
    else:
        out = [0.25, default]
    return out + ([None] if type(None) in args and name not in NOT_NONE else [])


def test_every_knob_is_a_field_with_its_type_and_default():
    assert set(ENGINE_KNOBS) <= set(FIELDS) and list(ENGINE_KNOB_TABLE) == list(ENGINE_KNOBS)
    for name, knob in ENGINE_KNOB_TABLE.items():
        assert knob.type == HINTS[name]
        assert knob.default == FIELDS[name].default
    EngineConfig(**{k: knob.default for k, knob in ENGINE_KNOB_TABLE.items()})   # raises unless they go together


@pytest.mark.parametrize("name", ENGINE_KNOBS)
def test_the_variant_parser_takes_every_value_of_the_field(name):
    for value in _samples(name):
        knobs = make_variant(ENGINE, [(name, _text(value))]).knob_dict
        assert knobs[name] == value and type(knobs[name]) is type(value), (name, value)


@pytest.mark.parametrize(("name", "bad"), [("max_num_seqs", "1.5"), ("retention", "half"), ("cache", "bogus"),
                                           ("cuda_graphs", "maybe"), ("cuda_graphs", "none"),
                                           ("pool_window", "4"), ("scheduler", "none")])
def test_a_value_outside_the_field_is_a_user_error(name, bad):
    with pytest.raises(UserError, match=name):
        make_variant(ENGINE, [(name, bad)])


@pytest.mark.parametrize("name", sorted(set(FIELDS) - set(ENGINE_KNOBS)))
def test_a_field_a_variant_may_not_set_is_refused(name):
    with pytest.raises(UserError, match="has no knob"):
        make_variant(ENGINE, [(name, "1")])
