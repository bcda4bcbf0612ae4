"""`simulate --paper`: the replay machinery on shortened traces (the full replays take 20-90 s
each and belong to docs/SIMULATE.md): the one scalar is fitted on its published point, every
other cell's error is measured against the published number, and inputs the paper does not give
can be declared."""
from __future__ import annotations

import pandas as pd
import pytest

from dllm_bench.errors import UserError
from dllm_bench.simulate.hardware import load
from dllm_bench.simulate.paper import checks, published, setting, tables
from tests.helpers import one_error_line


@pytest.fixture
def short(monkeypatch):
    for ds, n in {"livebench": 16, "osc": 48, "burstgpt": 48}.items():
        monkeypatch.setitem(published.TRACE, ds, n)


def test_table4_fits_one_point_and_measures_every_other_against_the_paper(short):
    declared = setting.Declared(batch={"fast-dllm": 3})
    u = setting.fit_u(declared)
    df = tables.table4(setting.scaled(load("l40s"), u), declared)
    assert len(df) == 3 * (3 * 2 + 1) + 3                      # + Fast-dLLM's declared batch on each dataset
    fitted = df[df.fitted]
    assert len(fitted) == 1 and (fitted.dataset.iloc[0], fitted.system.iloc[0]) == ("burstgpt", "dLLM-Serve")
    assert abs(fitted.tput_err.iloc[0]) < 0.005                 # the fit reaches its published point
    for r in df.itertuples():
        lat, tput = published.TABLE4[(r.dataset, {v: k for k, v in published.NAMES.items()}[r.system])]
        assert r.tput_paper == tput and r.lat_paper == lat
        assert r.tput_err == pytest.approx((r.tput_sim - tput) / tput)
        assert r.lat_err_s == pytest.approx(r.lat_sim - lat)
    decl = df[df.scenario == "declared"]
    assert set(decl.system) == {"Fast-dLLM"} and set(decl.batch) == {3}
    assert set(df[df.scenario == "batch 1"].batch) == {1}


def test_declared_prompt_lengths_replace_the_length_model():
    wl = setting.workload("osc", 12, declared=setting.Declared(prompt_len={"osc": 384}))
    assert {len(r.prompt_ids) for r in wl} == {384} and {r.gen_length for r in wl} == {setting.GEN}
    assert len({len(r.prompt_ids) for r in setting.workload("osc", 12)}) > 1     # default: the OSC length model


def test_figures_divide_by_the_declared_sparse_dllm_batch():
    assert tables._sparse(setting.DEFAULT) == "sparse-dllm:batch=1"
    assert tables._sparse(setting.Declared(batch={"sparse-dllm": 4})) == "sparse-dllm:batch=4"


@pytest.mark.parametrize("args", [("--paper", "table4", "--paper-prompt-len", "osc=0"),
                                  ("--paper", "table4", "--paper-batch", "engine=2"),
                                  ("--paper-batch", "fast-dllm=2"),
                                  ("--paper", "holdout", "--paper-batch", "fast-dllm=2")])
def test_bad_declared_inputs_are_one_line_exit_2(args, cli_in_process):
    r = cli_in_process("simulate", *args)
    one_error_line(r)
    with pytest.raises(UserError):
        setting.parse_declared("livebench=12,osc", None)


def test_holdout_fits_each_engine_point_in_turn_and_predicts_the_others(short):
    df = checks.holdout()
    labels = [published.point_label(p) for p in published.ENGINE_POINTS]
    assert list(df["fitted on"]) == labels and (df.u > 0).all()
    for i, fit in enumerate(published.ENGINE_POINTS):
        assert df.loc[i, labels[i]] == "fit"
        gpu, ds = fit
        wl = setting.workload(ds, published.TRACE[ds])
        got = setting.run(setting.scaled(load(gpu), df.loc[i, "u"]), "engine", wl)["output_throughput"]
        assert abs(got / published.ENGINE_POINTS[fit] - 1) < 0.005           # each fit reaches its own point
    # The row fitted on the replays' point predicts what Table 4 reports for the engine at that u.
    row = df.iloc[0]
    t4 = tables.table4(setting.scaled(load("l40s"), row.u))
    eng = t4[t4.system == "dLLM-Serve"].set_index("dataset").tput_err
    assert row["L40S LiveBench"] == pytest.approx(eng["livebench"]) and row["L40S OSC"] == pytest.approx(eng["osc"])
    assert "within 10 %" in checks.holdout_summary(df)


def _cell(ds, system, scen, paper, sim):
    return dict(dataset=ds, system=system, scenario=scen, tput_paper=paper, tput_sim=sim)


def test_ordering_counts_the_pairs_the_simulation_orders_as_the_paper():
    rows = [_cell("osc", "dLLM-Serve", "engine", 94, 130),
            _cell("osc", "Fast-dLLM", "batch 1", 58, 24), _cell("osc", "Fast-dLLM", "max-fit", 58, 55),
            _cell("osc", "Fast-dLLM", "declared", 58, 60),
            _cell("osc", "Sparse-dLLM", "batch 1", 33, 30), _cell("osc", "Sparse-dLLM", "max-fit", 33, 98),
            _cell("osc", "dLLM-Cache", "batch 1", 32, 20), _cell("osc", "dLLM-Cache", "max-fit", 32, float("nan"))]
    out = checks.ordering(pd.DataFrame(rows)).set_index("scenario")
    assert out.loc["batch 1", "paper"] == "Serve > Fast > Sparse > Cache"
    assert out.loc["batch 1", "simulated"] == "Serve > Sparse > Fast > Cache"
    assert out.loc["batch 1", "pairs"] == "5/6"                    # only Fast/Sparse swapped
    assert pd.isna(out.loc["max-fit", "pairs"]) and "does not fit" in out.loc["max-fit", "simulated"]
    # declared: Fast-dLLM's declared batch, the others at batch 1
    assert out.loc["declared", "simulated"] == "Serve > Fast > Sparse > Cache" and out.loc["declared", "pairs"] == "6/6"


def test_a_static_batch_beyond_the_memory_model_is_flagged_not_silently_simulated():
    """On a GPU profile a fixed batch is checked against the byte counts (serve measures its peak):
    Fast-dLLM at batch 1 fits the RTX 4090 with 512-token prompts, not with 3,072-token ones, and
    batch 64 of 512 tokens does not fit the L40S."""
    short = setting.workload("random", 3, prompt_len=256)
    long = setting.workload("random", 3, prompt_len=3072)
    s = setting.run(load("rtx4090"), "fast-dllm:batch=1", short)
    assert s["fits"] is True and setting.fits(s) == "yes"
    s = setting.run(load("rtx4090"), "fast-dllm:batch=1", long)
    assert s["fits"] is False and setting.fits(s) == "no" and s["output_throughput"] > 0
    assert setting.run(load("l40s"), "fast-dllm:batch=64", short)["fits"] is False
    assert setting.run(load("l40s"), "fast-dllm", short)["fits"] is True        # max-fit: fits by construction
    assert setting.fits(setting.run(load("l40s"), "engine", short)) is None      # the engine has a KV pool, no batch
    # the ordering check does not rank a configuration that is an OOM
    rows = [dict(dataset="osc", system=n, scenario=sc, tput_paper=p, tput_sim=p, fits=f) for n, sc, p, f in
            [("dLLM-Serve", "engine", 94, None), ("Fast-dLLM", "batch 1", 58, "no"),
             ("Sparse-dLLM", "batch 1", 33, "yes"), ("dLLM-Cache", "batch 1", 32, "yes")]]
    assert "does not fit" in checks.ordering(pd.DataFrame(rows)).simulated.iloc[0]


def test_fig3_adds_the_texts_latency_at_half_a_request_per_second(short):
    df = tables.fig3(setting.scaled(load("rtx4090"), 0.7)).set_index("scenario")
    eng = df.loc["engine"]
    assert eng.lat05_paper == "1370" and eng.lat05_err_s == pytest.approx(eng.lat05_sim - 1370.0)
    fast = df.loc["batch 1"]
    assert fast.lat05_paper == "> 4000"
    assert fast.lat05_err_s == ("bound met" if fast.lat05_sim > 4000 else "bound missed")
    # the latency column is a run of the same trace arriving at 0.5 req/s
    wl_half = setting.workload("burstgpt", published.TRACE["burstgpt"], rps=0.5)
    got = setting.run(setting.scaled(load("rtx4090"), 0.7), "engine", wl_half)["mean_e2el_ms"] / 1e3
    assert eng.lat05_sim == pytest.approx(got)
    assert tables._latency_check(">", 4000.0, 4500.0) == "bound met"
    assert tables._latency_check(">", 4000.0, 3500.0) == "bound missed"
    assert tables._latency_check("=", 1370.0, float("nan")) is None


def test_replay_json_carries_the_cells_and_table4s_ordering(short, capsys):
    import json

    from dllm_bench.simulate.paper.replay import replay
    replay("table4", as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert doc["replay"] == "table4" and 0 < doc["u"] < 4 and len(doc["cells"]) == 3 * (3 * 2 + 1)
    assert {r["dataset"] for r in doc["ordering"]} == {"livebench", "burstgpt", "osc"}
    assert all(r["fits"] in ("yes", "no", None) for r in doc["cells"])
    # the paper measured its systems' upstream code: that is what its replays simulate
    assert doc["impls"]["fast-dllm"] == "hf-fast-dllm" and doc["impls"]["sparse-dllm"] == "hf-eager"
