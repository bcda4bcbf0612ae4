"""A flag that carries one value is that value, checked by the knob's own parser: it is never
spliced into a `--systems` spec, so a comma or '=' inside it cannot smuggle in another knob."""
from __future__ import annotations

import pytest

from dllm_bench.errors import UserError
from dllm_bench.systems.spec import make_variant, parse_system, with_knob


def test_a_value_with_a_comma_is_a_bad_value_not_a_second_knob():
    with pytest.raises(UserError, match="knob cache: expected one of"):
        make_variant("engine", [("cache", "sparse,max_num_seqs=1")])
    with pytest.raises(UserError, match="knob max_num_seqs"):
        make_variant("engine", [("max_num_seqs", "4,cache=none")])


def test_one_value_per_flag_gives_the_spec_s_variant():
    assert make_variant("engine", [("cache", "dual"), ("max_num_seqs", 4)]) == parse_system("engine:cache=dual,max_num_seqs=4")
    v = parse_system("fast-dllm:threshold=0.9")
    assert with_knob(v, "batch", 3) == parse_system("fast-dllm:threshold=0.9,batch=3")
    with pytest.raises(UserError, match="knob 'batch' given twice"):
        with_knob(with_knob(v, "batch", 3), "batch", 4)


def test_the_server_options_take_each_knob_as_one_value():
    from dllm_bench.server.options import ServerOptions, resolve_server_options

    with pytest.raises(UserError, match="knob cache"):
        resolve_server_options(ServerOptions(model="tiny", cache="sparse,max_num_seqs=1"))


@pytest.mark.parametrize("spec", ["fast-dllm:threshold=nan", "fast-dllm:factor=inf", "fast-dllm:threshold=1e309",
                                  "engine:retention=inf", "dllm-cache:transfer_ratio=nan"])
def test_a_non_finite_knob_is_refused_when_parsed(spec):
    with pytest.raises(UserError, match="finite"):
        parse_system(spec)


def test_a_variant_s_parallel_size_the_model_cannot_split_is_refused_when_options_resolve():
    """resolve_run runs before a run directory exists: the check cannot come after the header."""
    from dllm_bench.serve.options import ServeOptions, resolve_run

    with pytest.raises(UserError, match="does not divide n_heads"):
        resolve_run(ServeOptions(systems="engine,engine:tensor_parallel_size=3", preset="tiny", num_prompts=2))
