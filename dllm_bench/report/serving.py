"""The report's serving section (paper §6.2-6.3, Fig. 3-5, Table 4): a serve run's table with
each point's median [min–max] over its repeats, and the serving claims with the intervals the
repeats allow (dllm_bench.report.claims.mark). The simulated section renders its runs with the
same table and claims (dllm_bench.report.simulated)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.console import md_table, num
from dllm_bench.repeats import Spread, compare, point_spread
from dllm_bench.report.claims import PAPER, Claims, mark, single, spread_text, verdict
from dllm_bench.report.sections import _figures, _repeats, _x
from dllm_bench.systems.spec import ENGINE, PAPER_ENGINE, SPARSE_BASELINE


def serve_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:
    """A measured serve run: the table (median [min–max] over repeats) and the Fig. 3-5 / Table 4
    claims, each ratio with the interval its repeats allow. Simulated points never enter it."""
    df = points_frame(run_dir, simulated=False)
    cfg = results.load_config(run_dir).get("config", {})
    out = ["## Serving throughput and latency (paper §6.2-6.3, Fig. 3-5, Table 4)\n",
           f"\nRun `{run_dir.name}` — {cfg.get('preset_line', '')}{_repeats(cfg)}\n\n"]
    if df.empty:
        return "".join(out) + "\n_(the run has no finished points)_\n"
    table, per_ds = serve_table(df)
    out.append(table)
    out.append(_figures(run_dir / "plots", "*.png", files_dir, "serve", rel_base))
    out.append("\n### Claims (at each dataset's heaviest load: its highest measured rps)\n\n")
    out.append(serve_claims(per_ds, df, claims, "serve", ""))
    return "".join(out)


def points_frame(run_dir: Path, simulated: bool) -> pd.DataFrame:
    """A serve-like run's points aggregated over repeats: only the measured ones, or only the
    simulated ones (the two never share a table; a run without the column is one or the other)."""
    df = results.metrics_frame(run_dir, aggregate=True)
    if "simulated" in df.columns:
        sim = df["simulated"].fillna(False) == True  # noqa: E712 - a column of True/False/NaN
        df = df[sim if simulated else ~sim]
    return df


def serve_table(df) -> tuple[str, dict]:
    """The Markdown table of a serve-like run's aggregated points and, per dataset and rps, its
    (engine, best baseline, sparse-dllm) rows as dicts."""

    if "is_baseline" not in df.columns:
        df["is_baseline"] = df["system"] != ENGINE
    df["is_baseline"] = df["is_baseline"].fillna(True).astype(bool)
    name_col = "system_name" if "system_name" in df.columns else "system"
    served = endpoint_labels(df)
    rows, per_ds = [], {}
    for (ds, rps), g in df.groupby(["dataset", "rps"], sort=False):
        recs = [r.to_dict() for _, r in g.iterrows()]
        bl = [r for r in recs if r["is_baseline"] and num(r.get("output_throughput")) is not None]
        best = max(bl, key=lambda r: num(r["output_throughput"])) if bl else None
        eng = [r for r in recs if not r["is_baseline"] and r["system"] not in served]   # served is not the engine
        # The paper's claims are about its system: engine:cache=sparse when the run has it.
        eng_row = next((r for r in eng if r["system"] == PAPER_ENGINE),
                       next((r for r in eng if r["system"] == ENGINE), eng[0] if eng else None))
        sd_row = next((r for r in recs if r.get(name_col) == SPARSE_BASELINE), None)
        for r in recs:
            x = compare(r, best, "output_throughput")[0] if best is not None and r is not best else None
            rows.append({"dataset": ds, "rps": "inf" if math.isinf(float(rps)) else f"{float(rps):g}",
                         "system": r["system"], "output tok/s": _cell(r, "output_throughput"),
                         "mean E2EL s": _cell(r, "mean_e2el_ms", 1e-3, "{:.1f}"),
                         "p99 E2EL s": _cell(r, "p99_e2el_ms", 1e-3, "{:.1f}"),
                         "x best baseline": "1.00x" if r is best else spread_text(x, "x") if x else "-",
                         "B": r.get("max_batch_size") if r["is_baseline"] else None,
                         "KV pool": None if r["is_baseline"] else num(r.get("kv_pool_tokens")),
                         "mean batch": num(r.get("mean_batch_size")), "completed": r.get("completed")})
        per_ds.setdefault(ds, {})[float(rps)] = (eng_row, best, sd_row)
    table = pd.DataFrame(rows)
    empty = [c for c in LEGEND if c in table.columns and all(v in (None, "-") or v != v for v in table[c])]
    table = table.drop(columns=empty)     # a run without baselines (or without the engine)
    text = md_table(table, {"mean batch": "{:.1f}", "B": "{:.0f}", "KV pool": "{:,.0f}"})
    text += "\n" + "; ".join(v for k, v in LEGEND.items() if k in table.columns) + ".\n"
    return text, per_ds


LEGEND = {"x best baseline": "`x best baseline` = output throughput / the highest baseline output throughput at "
                             "that point (over repeats: the median and the extremes the two intervals allow)",
          "B": "`B` = a baseline's static batch, next to the mean realised batch (`mean batch`)",
          "KV pool": "`KV pool` = the engine's KV token slots (per rank under tensor parallelism)"}


def _cell(r: Mapping, metric: str, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    s = point_spread(r, metric)
    if s.n == 0 or math.isnan(s.median):
        return "-"
    return Spread(s.median * scale, s.lo * scale, s.hi * scale, s.n).text(fmt)


def serve_claims(per_ds: Mapping, df, claims: Claims, section: str, where: str) -> str:
    """The serving claims (throughput vs the best baseline and vs Sparse-dLLM, tail latency,
    jitter) from each dataset's heaviest load; `where` names a simulated hardware."""
    out = []
    tp_x, sd_x, lat_x, p99_x = {}, {}, {}, {}
    for ds, by in per_ds.items():
        rps = max(by)
        eng, best, sd = by[rps]
        if eng is None:
            continue
        if best is not None:
            tp_x[ds] = compare(eng, best, "output_throughput")[0]
            lat_x[ds] = compare(eng, best, "mean_e2el_ms", higher_better=False)[0]
            p99_x[ds] = compare(eng, best, "p99_e2el_ms", higher_better=False)[0]
        if sd is not None:
            sd_x[ds] = compare(eng, sd, "output_throughput")[0]

    def listing(d: Mapping[str, Spread]) -> str:
        return ", ".join(f"{k} {spread_text(v)}" for k, v in d.items() if v.n) or "no engine/baseline pair"

    def top(d: Mapping[str, Spread]) -> Spread | None:
        d = {k: v for k, v in d.items() if v.n and not math.isnan(v.median)}
        return max(d.values(), key=lambda v: v.median) if d else None
    lo, hi, txt = PAPER["throughput_4090"]
    lo2, hi2, txt2 = PAPER["throughput_l40s"]
    best_v = top(tp_x)
    out.append(claims.add(section, f"Throughput vs the strongest baseline{where}", f"{txt}; {txt2}",
                          f"engine / best baseline output throughput: {listing(tp_x)} (max {spread_text(best_v)})",
                          verdict(best_v.median if best_v else None, min(lo, lo2), max(hi, hi2)), mark(best_v)))
    t4 = PAPER["table4"]
    paper_sd = ", ".join(f"{k} {v[2]:.2f}×" for k, v in t4.items())
    sd_max = top(sd_x)
    out.append(claims.add(section, f"Up to 3.12× vs Sparse-dLLM (Table 4, L40S, 1.0 req/s){where}",
                          f"Table 4: dLLM-Serve vs Sparse-dLLM {paper_sd}",
                          f"engine / sparse-dllm: {listing(sd_x)} (max {spread_text(sd_max)})",
                          verdict(sd_max.median if sd_max else None, min(v[2] for v in t4.values()),
                                  max(v[2] for v in t4.values())), mark(sd_max)))
    lat, txt = PAPER["latency"]
    p99_best = top(p99_x)
    out.append(claims.add(section, f"~4× lower tail latency under heavy contention{where}", txt,
                          f"best baseline / engine p99 E2EL: {listing(p99_x)}; mean E2EL: {listing(lat_x)}",
                          verdict(p99_best.median if p99_best else None, 3.0, lat), mark(p99_best)))
    sg, pg, txt = PAPER["jitter"]
    jit = _jitter(df)
    gain = None
    if jit:
        ds, (r, a, _) = next(((k, v) for k, v in jit.items() if k == "livebench"), next(iter(jit.items())))
        eng, best, _ = per_ds.get(ds, {}).get(r, (None, None, None))
        gain = compare(eng, best, "latency_std_ms", higher_better=False)[0] if eng and best else single(a)
    out.append(claims.add(section, f"Lower latency jitter (Fig. 5){where}", txt,
                          "σ gain / span gain vs best baseline: " + (", ".join(
                              f"{ds} @ {r:g} rps {_x(a)} / {_x(b)}" for ds, (r, a, b) in jit.items()) or "n/a"),
                          verdict(jit.get("livebench", next(iter(jit.values()), (None, None, None)))[1], sg, sg)
                          if jit else "no data", mark(gain) if jit else "no data"))
    return "".join(out)


def endpoint_labels(df) -> set:
    """Labels of the rows measured over HTTP (`serve --endpoint`): never the in-process engine."""
    if "system_name" in df.columns:
        return set(df.loc[df["system_name"] == "endpoint", "system"])
    return set(df.loc[df["system"] == "endpoint", "system"])


def _jitter(df) -> dict:
    """Per dataset: (rps, σ gain, span gain) of the engine at 0.5 rps when measured, else the highest."""
    from dllm_bench.plots import jitter_gains  # imports matplotlib (~1 s): only a report with jitter pays

    out = {}
    bls = sorted(set(df.loc[df["is_baseline"], "system"]))
    if not bls:
        return out
    for ds, g in df.groupby("dataset", sort=False):
        rates = sorted({float(r) for r in g["rps"]})
        rps = 0.5 if 0.5 in rates else rates[-1]
        try:
            j = jitter_gains(g, bls, rps)
        except Exception:  # noqa: BLE001 - a section never fails the report
            continue
        j = j[j["system"] == ENGINE] if (j["system"] == ENGINE).any() else \
            j[~j["system"].isin(set(bls) | endpoint_labels(df))]
        if len(j):
            out[ds] = (rps, num(j["std_gain"].iloc[0]), num(j["span_gain"].iloc[0]))
    return out
