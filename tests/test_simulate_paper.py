"""`simulate --paper`: the replay machinery on shortened traces (the full replays take 20-90 s
each and belong to docs/SIMULATE.md): the one scalar is fitted on its published point, every
other cell's error is measured against the published number, and inputs the paper does not give
can be declared."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dllm_bench.errors import UserError
from dllm_bench.simulate import paper as P
from dllm_bench.simulate.hardware import load


@pytest.fixture
def short(monkeypatch):
    monkeypatch.setattr(P, "TRACE", {"livebench": 16, "osc": 48, "burstgpt": 48})


def test_table4_fits_one_point_and_measures_every_other_against_the_paper(short):
    declared = P.Declared(batch={"fast-dllm": 3})
    u = P.fit_u(load("l40s"), declared)
    df = P.table4(P.scaled(load("l40s"), u), declared)
    assert len(df) == 3 * (3 * 2 + 1) + 3                      # + Fast-dLLM's declared batch on each dataset
    fitted = df[df.fitted]
    assert len(fitted) == 1 and (fitted.dataset.iloc[0], fitted.system.iloc[0]) == ("burstgpt", "dLLM-Serve")
    assert abs(fitted.tput_err.iloc[0]) < 0.005                 # the fit reaches its published point
    for r in df.itertuples():
        lat, tput = P.TABLE4[(r.dataset, {v: k for k, v in P.NAMES.items()}[r.system])]
        assert r.tput_paper == tput and r.lat_paper == lat
        assert r.tput_err == pytest.approx((r.tput_sim - tput) / tput)
        assert r.lat_err_s == pytest.approx(r.lat_sim - lat)
    decl = df[df.scenario == "declared"]
    assert set(decl.system) == {"Fast-dLLM"} and set(decl.batch) == {3}
    assert set(df[df.scenario == "batch 1"].batch) == {1}


def test_declared_prompt_lengths_replace_the_length_model():
    wl = P.workload("osc", 12, declared=P.Declared(prompt_len={"osc": 384}))
    assert {len(r.prompt_ids) for r in wl} == {384} and {r.gen_length for r in wl} == {P.GEN}
    assert len({len(r.prompt_ids) for r in P.workload("osc", 12)}) > 1     # default: the OSC length model


def test_figures_divide_by_the_declared_sparse_dllm_batch():
    assert P._sparse(P.DEFAULT) == "sparse-dllm:batch=1"
    assert P._sparse(P.Declared(batch={"sparse-dllm": 4})) == "sparse-dllm:batch=4"


@pytest.mark.parametrize("args", [("--paper", "table4", "--paper-prompt-len", "osc=0"),
                                  ("--paper", "table4", "--paper-batch", "engine=2"),
                                  ("--paper-batch", "fast-dllm=2")])
def test_bad_declared_inputs_are_one_line_exit_2(args):
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "simulate", *args], capture_output=True, text=True,
                       timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:")
    with pytest.raises(UserError):
        P.parse_declared("livebench=12,osc", None)
