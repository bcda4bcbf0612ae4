"""The paper's serving experiments at their scale, published vs simulated with the error of each
cell: Table 4 (L40S; each baseline at batch 1, what its pinned upstream code runs, at the largest
batch that fits the memory model, and at a declared batch), Figure 3's two RTX 4090 throughputs
with the text's Figure 4 latencies at 0.5 req/s, Figure 7's length sweeps and Figure 8's
ablation rungs (ratios over Sparse-dLLM)."""
from __future__ import annotations

import math

import pandas as pd

from dllm_bench.simulate.hardware import Hardware
from dllm_bench.simulate.paper.published import (
    BASELINES,
    FIG3,
    FIG4_LATENCY,
    FIG4_RPS,
    FIG7_INPUT,
    FIG7_OUTPUT,
    FIG8,
    FIG8_RUNGS,
    FIT_POINT,
    NAMES,
    TABLE4,
    TRACE,
)
from dllm_bench.simulate.paper.setting import DEFAULT, Declared, fits, run, workload
from dllm_bench.systems.spec import ENGINE


def rel_err(sim: float, pub: float) -> float:
    return (sim - pub) / pub


def _scenarios(sysname: str, declared: Declared) -> list[tuple[str, str]]:
    if sysname == ENGINE:
        return [("engine", "engine")]
    out = [("batch 1", f"{sysname}:batch=1"), ("max-fit", sysname)]
    if sysname in declared.batch:
        out.append(("declared", f"{sysname}:batch={declared.batch[sysname]}"))
    return out


def table4(hw: Hardware, declared: Declared = DEFAULT) -> pd.DataFrame:
    rows = []
    for ds in ("livebench", "burstgpt", "osc"):
        wl = workload(ds, TRACE[ds], declared=declared)
        for sysname in (*BASELINES, "engine"):
            lat, tput = TABLE4[(ds, sysname)]
            specs = _scenarios(sysname, declared)
            for scen, spec in specs:
                s = run(hw, spec, wl)
                rows.append(dict(dataset=ds, system=NAMES[sysname], scenario=scen, batch=s["batch"], fits=fits(s),
                                 tput_paper=tput, tput_sim=s["output_throughput"],
                                 tput_err=rel_err(s["output_throughput"], tput), lat_paper=lat,
                                 lat_sim=s["mean_e2el_ms"] / 1e3, lat_err_s=s["mean_e2el_ms"] / 1e3 - lat,
                                 fitted=(hw.name, ds, sysname) == (*FIT_POINT, "engine")))
    return pd.DataFrame(rows)


def _latency_check(kind: str, pub: float, sim: float) -> float | str | None:
    """Seconds off a published latency, or whether a published lower bound holds."""
    if math.isnan(sim):                                  # the system does not fit
        return None
    return sim - pub if kind == "=" else "bound met" if sim > pub else "bound missed"


def fig3(hw: Hardware, declared: Declared = DEFAULT) -> pd.DataFrame:
    """The peak throughput (saturated, 1.0 req/s) and the text's Figure 4 latency at 0.5 req/s,
    both on the Burst trace."""
    wl = workload("burstgpt", TRACE["burstgpt"], declared=declared)
    half = workload("burstgpt", TRACE["burstgpt"], rps=FIG4_RPS, declared=declared)
    rows = []
    for sysname, pub in FIG3.items():
        kind, lat = FIG4_LATENCY[sysname]
        for scen, spec in _scenarios(sysname, declared):
            s = run(hw, spec, wl)
            sim_lat = run(hw, spec, half)["mean_e2el_ms"] / 1e3
            rows.append(dict(system=NAMES[sysname], scenario=scen, batch=s["batch"], fits=fits(s), tput_paper=pub,
                             tput_sim=s["output_throughput"], tput_err=rel_err(s["output_throughput"], pub),
                             lat05_paper=f"{'> ' if kind == '>' else ''}{lat:.0f}", lat05_sim=sim_lat,
                             lat05_err_s=_latency_check(kind, lat, sim_lat)))
    return pd.DataFrame(rows)


def _sparse(declared: Declared) -> str:
    """The Figures' baseline: Sparse-dLLM at batch 1 (its pinned code), or the declared batch."""
    return f"sparse-dllm:batch={declared.batch.get('sparse-dllm', 1)}"


def _ratio(hw: Hardware, wl, declared: Declared, engine: dict | None = None) -> float:
    return run(hw, "engine", wl, engine)["output_throughput"] / run(hw, _sparse(declared), wl)["output_throughput"]


def fig7(hw: Hardware, declared: Declared = DEFAULT, n: int = 400) -> pd.DataFrame:
    rows = []
    for p in (100, 200, 400, 600):
        r = _ratio(hw, workload("random", n, prompt_len=p), declared)
        pub = FIG7_INPUT.get(p)
        rows.append(dict(sweep="input", length=p, ratio_paper=pub, ratio_sim=r, err=rel_err(r, pub) if pub else None))
    for g in (128, 256, 512):
        r = _ratio(hw, workload("random", n, prompt_len=200, gen=g), declared)
        pub = FIG7_OUTPUT.get(g)
        rows.append(dict(sweep="output", length=g, ratio_paper=pub, ratio_sim=r, err=rel_err(r, pub) if pub else None))
    return pd.DataFrame(rows)


def fig8(hw: Hardware, declared: Declared = DEFAULT) -> pd.DataFrame:
    rows = []
    for ds in ("livebench", "osc", "burstgpt"):
        wl = workload(ds, TRACE[ds], declared=declared)
        base = run(hw, _sparse(declared), wl)["output_throughput"]
        for rung, knobs in FIG8_RUNGS.items():
            r = run(hw, "engine", wl, knobs)["output_throughput"] / base
            pub = FIG8[rung].get(ds)
            rows.append(dict(dataset=ds, rung=rung, ratio_paper=pub, ratio_sim=r, err=rel_err(r, pub) if pub else None))
    return pd.DataFrame(rows)


TABLES = {"table4": table4, "fig3": fig3, "fig7": fig7, "fig8": fig8}
GPU_OF = {"table4": "l40s", "fig3": "rtx4090", "fig7": "l40s", "fig8": "l40s"}
