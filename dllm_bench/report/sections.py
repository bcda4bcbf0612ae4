"""The sections of `dllm-bench report`, one per run kind (serve, accuracy, ablate, sweep): each
renders its run's tables, copies its PNGs next to the report, and checks the paper's claims it
covers (numbers and verdict rule: dllm_bench.report.claims). The document around them:
dllm_bench.report.document.
"""
from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path

from dllm_bench import results
from dllm_bench.ablate import tables as ab
from dllm_bench.console import md_table, num
from dllm_bench.report.claims import PAPER, Claims, trend_verdict, verdict
from dllm_bench.sweep import lengths as sw


def _x(v: float | None, d: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{d}f}×"


def _copy_png(src: Path, files_dir: Path, prefix: str, rel_base: Path) -> str | None:
    if not src.is_file():
        return None
    files_dir.mkdir(parents=True, exist_ok=True)
    dst = files_dir / f"{prefix}-{src.name}"
    shutil.copyfile(src, dst)
    return dst.relative_to(rel_base).as_posix()


def _figures(run_dir: Path, pattern: str, files_dir: Path, prefix: str, rel_base: Path) -> str:
    out = ""
    for png in sorted(run_dir.glob(pattern)):
        rel = _copy_png(png, files_dir, prefix, rel_base)
        if rel:
            out += f"\n![{prefix} {png.stem}]({rel})\n"
    return out


# ---------------------------------------------------------------- sections
def serve_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:
    import pandas as pd


    df = results.metrics_frame(run_dir, aggregate=True)
    cfg = results.load_config(run_dir).get("config", {})
    out = ["## Serving throughput and latency (paper §6.2-6.3, Fig. 3-5, Table 4)\n",
           f"\nRun `{run_dir.name}` — {cfg.get('preset_line', '')}\n\n"]
    if df.empty:
        return "".join(out) + "\n_(the run has no finished points)_\n"
    if "is_baseline" not in df.columns:
        df["is_baseline"] = df["system"] != "engine"
    df["is_baseline"] = df["is_baseline"].astype(bool)
    name_col = "system_name" if "system_name" in df.columns else "system"
    rows, per_ds = [], {}
    for (ds, rps), g in df.groupby(["dataset", "rps"], sort=False):
        bl = g[g["is_baseline"]]
        best = bl.loc[bl["output_throughput"].astype(float).idxmax()] if not bl.empty and bl["output_throughput"].notna().any() else None
        eng = g[~g["is_baseline"]]
        eng_row = (eng[eng["system"] == "engine"].iloc[0] if (eng["system"] == "engine").any()
                   else (eng.iloc[0] if not eng.empty else None))
        sd = g[g[name_col] == "sparse-dllm"]
        sd_row = sd.iloc[0] if not sd.empty else None
        for _, r in g.iterrows():
            tp = num(r.get("output_throughput"))
            rows.append({"dataset": ds, "rps": "inf" if math.isinf(float(rps)) else f"{float(rps):g}",
                         "system": r["system"], "output tok/s": tp,
                         "mean E2EL s": (num(r.get("mean_e2el_ms")) or float("nan")) / 1e3,
                         "p99 E2EL s": (num(r.get("p99_e2el_ms")) or float("nan")) / 1e3,
                         "x best baseline": tp / num(best["output_throughput"]) if best is not None and tp is not None and num(best["output_throughput"]) else None,
                         "completed": r.get("completed")})
        per_ds.setdefault(ds, {})[float(rps)] = (eng_row, best, sd_row)
    out.append(md_table(pd.DataFrame(rows), {"output tok/s": "{:.2f}", "mean E2EL s": "{:.1f}", "p99 E2EL s": "{:.1f}",
                                             "x best baseline": "{:.2f}x"}))
    out.append("\n`x best baseline` = output throughput / the highest baseline output throughput at that point.\n")
    out.append(_figures(run_dir / "plots", "*.png", files_dir, "serve", rel_base))
    out.append("\n### Claims (at each dataset's heaviest load: its highest measured rps)\n\n")
    tp_x, sd_x, lat_x, p99_x = {}, {}, {}, {}
    for ds, by in per_ds.items():
        rps = max(by)
        eng, best, sd = by[rps]
        if eng is None:
            continue
        etp = num(eng.get("output_throughput"))
        if best is not None and etp is not None and num(best["output_throughput"]):
            tp_x[ds] = etp / num(best["output_throughput"])
            if num(best.get("mean_e2el_ms")) and num(eng.get("mean_e2el_ms")):
                lat_x[ds] = num(best["mean_e2el_ms"]) / num(eng["mean_e2el_ms"])
            if num(best.get("p99_e2el_ms")) and num(eng.get("p99_e2el_ms")):
                p99_x[ds] = num(best["p99_e2el_ms"]) / num(eng["p99_e2el_ms"])
        if sd is not None and etp is not None and num(sd["output_throughput"]):
            sd_x[ds] = etp / num(sd["output_throughput"])

    def listing(d: Mapping[str, float]) -> str:
        return ", ".join(f"{k} {_x(v)}" for k, v in d.items()) or "no engine/baseline pair"
    lo, hi, txt = PAPER["throughput_4090"]
    lo2, hi2, txt2 = PAPER["throughput_l40s"]
    best_v = max(tp_x.values()) if tp_x else None
    out.append(claims.add("serve", "Throughput vs the strongest baseline", f"{txt}; {txt2}",
                          f"engine / best baseline output throughput: {listing(tp_x)} (max {_x(best_v)})",
                          verdict(best_v, min(lo, lo2), max(hi, hi2))))
    t4 = PAPER["table4"]
    paper_sd = ", ".join(f"{k} {v[2]:.2f}×" for k, v in t4.items())
    sd_max = max(sd_x.values()) if sd_x else None
    out.append(claims.add("serve", "Up to 3.12× vs Sparse-dLLM (Table 4, L40S, 1.0 req/s)",
                          f"Table 4: dLLM-Serve vs Sparse-dLLM {paper_sd}",
                          f"engine / sparse-dllm: {listing(sd_x)} (max {_x(sd_max)})",
                          verdict(sd_max, min(v[2] for v in t4.values()), max(v[2] for v in t4.values()))))
    lat, txt = PAPER["latency"]
    p99_best = max(p99_x.values()) if p99_x else None
    out.append(claims.add("serve", "~4× lower tail latency under heavy contention", txt,
                          f"best baseline / engine p99 E2EL: {listing(p99_x)}; mean E2EL: {listing(lat_x)}",
                          verdict(p99_best, 3.0, lat)))
    sg, pg, txt = PAPER["jitter"]
    jit = _jitter(df)
    out.append(claims.add("serve", "Lower latency jitter (Fig. 5)", txt,
                          "σ gain / span gain vs best baseline: " + (", ".join(
                              f"{ds} @ {r:g} rps {_x(a)} / {_x(b)}" for ds, (r, a, b) in jit.items()) or "n/a"),
                          verdict(jit.get("livebench", next(iter(jit.values()), (None, None, None)))[1], sg, sg)
                          if jit else "no data"))
    return "".join(out)


def _jitter(df) -> dict:
    """Per dataset: (rps, σ gain, span gain) of the engine at 0.5 rps when measured, else the highest."""
    from dllm_bench.plots import jitter_gains

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
        j = j[j["system"] == "engine"] if (j["system"] == "engine").any() else j[~j["system"].isin(bls)]
        if len(j):
            out[ds] = (rps, num(j["std_gain"].iloc[0]), num(j["span_gain"].iloc[0]))
    return out


def accuracy_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:
    """One accuracy run: its table (the mean over models with the spread across seeds when it has
    several) and the Fig. 6 claims under each selection scoring rule it measured."""
    import pandas as pd

    summ = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    several = bool(summ.get("seeds"))
    pts = summ.get("seeds") or summ.get("points") or []
    task = summ.get("task") or "?"
    split = summ.get("split") or "test"
    models = summ.get("models") or [summ.get("model", "?")]
    out = [f"## Accuracy under KV retention (paper §6.4, Fig. 6): {task}\n\n",
           f"Run `{run_dir.name}` — task {task} ({split} split), model{'s' if several else ''} "
           f"{', '.join(models)}, metric {summ.get('metric', '?')}"
           + (f"; accuracy = mean over the {len(models)} models, CI = Wilson on the pooled counts" if several else "")
           + "\n\n"]
    cols = [c for c in ("point", "system", "selection", "score_query", "retention", "n", "accuracy", "ci_low", "ci_high",
                        "seed_sd", "seed_min", "seed_max", "flexible-extract_accuracy", "relative_to_dense")
            if any(c in p for p in pts)]
    df = pd.DataFrame([{c: p.get(c) for c in cols} for p in pts])
    out.append(md_table(df, {c: "{:.3f}" for c in ("accuracy", "ci_low", "ci_high", "seed_sd", "seed_min", "seed_max",
                                                    "flexible-extract_accuracy", "relative_to_dense")}))
    out.append(_figures(run_dir, "*.png", files_dir, f"accuracy-{task}", rel_base))
    chosen = {sel: c["score_query"] for sel, c in (summ.get("dev_choice") or {}).get("choice", {}).items()}
    if chosen:
        out.append(f"\nScoring rule chosen on dev run `{summ['dev_choice']['dev_run']}`: "
                   + ", ".join(f"{sel}: {q}" for sel, q in chosen.items()) + "\n")

    def acc_at(system: str, sel: str, rule: str) -> dict[float, float]:
        d = {}
        for p in pts:
            r, a = num(p.get("retention")), num(p.get("accuracy"))
            if (r is not None and a is not None and r < 1.0 and p.get("role") != "dense"
                    and p.get("system") == system and p.get("selection") == sel
                    and (p.get("score_query") or "mean") == rule):
                d[r] = a
        return d
    out.append("\n### Claims\n\n")
    ref = "humaneval" if task == "humaneval" else "gsm8k"
    ph, pu, txt = PAPER["accuracy"][ref]
    note = "" if task in ("gsm8k", "humaneval") else f" (our task is {task}; compared with the paper's GSM8K)"
    # (head's rule, uniform's rule, label): each rule for both selections, and each selection
    # under the rule its dev run chose when that pairs different rules
    pairs = [(q, q, {"mean": "mean-query rule, the paper's code", "max": "max-query rule"}[q])
             for q in ("mean", "max") if acc_at("engine", "head", q)] or [("mean", "mean", "mean-query rule, the paper's code")]
    dev_pair = (chosen.get("head"), chosen.get("uniform"))
    if None not in dev_pair:
        pairs = [(h, u, tag + (", chosen on dev" if (h, u) == dev_pair else "")) for h, u, tag in pairs]
        if dev_pair[0] != dev_pair[1]:
            pairs.append((*dev_pair, f"rules chosen on dev: head {dev_pair[0]}, uniform {dev_pair[1]}"))
    for head_rule, uni_rule, tag in pairs:
        head = acc_at("engine", "head", head_rule)
        # Uniform = the engine's uniform selection; else the Sparse-dLLM system (uniform by design).
        uni = acc_at("engine", "uniform", uni_rule) or (acc_at("sparse-dllm", "uniform", "mean") if uni_rule == "mean" else {})
        common = sorted(set(head) & set(uni))
        # the paper's points: r = 10 % (and 20 % for the halving claim), else the lowest swept r
        start = common.index(0.1) if 0.1 in common else 0
        if common:
            r0 = common[start]
            ratio = head[r0] / uni[r0] if uni[r0] else (math.inf if head[r0] > 0 else 1.0)
            shown = "uniform at 0" if math.isinf(ratio) else _x(ratio)
            ours = f"at r = {r0:g}: head {100 * head[r0]:.1f}% vs uniform {100 * uni[r0]:.1f}% ({shown}){note}"
            v = verdict(ratio, ph / pu)
        else:
            ours, v = "no retention with both head and uniform points", "no data"
        out.append(claims.add("accuracy", f"{task}: head-centric beats uniform at low retention ({tag})", txt, ours, v))
        if len(common) >= start + 2:
            r0, r1 = common[start], common[start + 1]
            ok = head[r0] >= (1 - 0.05) * uni[r1]
            out.append(claims.add("accuracy", f"{task}: head-centric at the lowest r ≈ uniform at the next r ({tag})",
                                  PAPER["accuracy_halving"],
                                  f"head at r = {r0:g}: {100 * head[r0]:.1f}%, uniform at r = {r1:g}: {100 * uni[r1]:.1f}%",
                                  "matches" if ok else "does not match"))
    return "".join(out)


def ablate_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:

    t = ab.run_tables(run_dir)
    cfg = t["config"]
    lt, ct = t["ladder"], t["cache"]
    out = ["## Ablation (paper §6.6, Fig. 8)\n\n",
           f"Run `{run_dir.name}` — {cfg.get('preset_line', '')}; {cfg.get('measurement', '')}; "
           f"{cfg.get('num_prompts')} prompts per dataset.\n\n"]
    paper_rows = []
    for ds, d in PAPER["ablation"].items():
        for k, title in (("engine", "+ inference engine"), ("scheduler", "+ phase-multiplexed scheduler"),
                         ("logits", "+ logit-aware budgeting")):
            paper_rows.append({"dataset": ds, "rung": title, "paper x": d[k]})
    if lt is not None:
        import pandas as pd

        m = lt.merge(pd.DataFrame(paper_rows), on=["dataset", "rung"], how="left")
        out.append(md_table(m[["dataset", "rung", "system", "throughput_tok_s", "x_vs_baseline", "delta_x_vs_prev",
                               "pct_vs_prev", "paper x"]], {**ab.LADDER_FMT, "paper x": "{:.2f}x"}))
        out.append("\n`paper x` = the cumulative speedup the paper states in §6.6 (`-`: not stated in its text).\n")
    out.append(_figures(run_dir / "plots", "*.png", files_dir, "ablate", rel_base))
    out.append("\n### Claims\n\n")
    keys = {"engine": "+ inference engine", "scheduler": "+ phase-multiplexed scheduler", "logits": "+ logit-aware budgeting"}
    if lt is not None:
        for k, title in keys.items():
            for ds in t["datasets"]:
                pv = PAPER["ablation"].get(ds, {}).get(k)
                row = lt[(lt["dataset"] == ds) & (lt["rung"] == title)]
                ours = num(row["x_vs_baseline"].iloc[0]) if len(row) else None
                if pv is None:
                    continue
                out.append(claims.add("ablate", f"{title} on {ds}", f"{pv:.2f}× vs Sparse-dLLM (cumulative)",
                                      _x(ours), verdict(ours, pv)))
        for ds in t["datasets"]:
            sub = lt[lt["dataset"] == ds]
            deltas = [(num(r["delta_x_vs_prev"]), r["rung"]) for _, r in sub.iterrows() if num(r["delta_x_vs_prev"]) is not None]
            if not deltas:
                continue
            pos = sum(1 for d, _ in deltas if d > 0)
            out.append(claims.add("ablate", f"Every component adds throughput on {ds}",
                                  "each rung raises the cumulative speedup (Fig. 8)",
                                  ", ".join(f"{n} {d:+.2f}×" for d, n in deltas),
                                  "matches" if pos == len(deltas) else f"does not match ({len(deltas) - pos} of {len(deltas)} rungs do not add)"))
            big = max(deltas)[1]
            out.append(claims.add("ablate", f"The inference engine is the largest single gain on {ds}",
                                  "§6.6: the engine 'alone delivers the most significant jump'",
                                  f"largest step: {big}", "matches" if big == "+ inference engine" else "does not match"))
    if ct is not None and len(ct):
        out.append("\n### Cache policies under the full engine (beyond the paper)\n\n")
        out.append("Same scheduler, token/logit budgets, memory budget and arrivals; only `cache`/`selection` differ. "
                   "`query_tokens_per_out_tok` (query rows run per generated token) and Refresh/Reuse request-steps "
                   "per generated token are the FLOP proxies; the KV pool is what the profiler left for each policy.\n\n")
        out.append(md_table(ct, ab.CACHE_FMT))
        for ds in dict.fromkeys(ct["dataset"]):
            sub = ct[ct["dataset"] == ds].set_index("cache policy")
            names = list(sub.index)
            sp = next((n for n in names if "head" in n), None)
            du = next((n for n in names if n.startswith("cache=dual")), None)
            if sp and du:
                a, b = num(sub.loc[sp, "throughput_tok_s"]), num(sub.loc[du, "throughput_tok_s"])
                qa, qb = num(sub.loc[sp, "query_tokens_per_out_tok"]), num(sub.loc[du, "query_tokens_per_out_tok"])
                if a and b:
                    who = "sparse (head) faster" if a > b else "dual faster"
                    out.append(f"\n- {ds}: sparse (head) {a:.2f} vs dual {b:.2f} tok/s ({a / b:.2f}×, {who}); query "
                               f"tokens per output token {'n/a' if qa is None else f'{qa:.1f}'} vs "
                               f"{'n/a' if qb is None else f'{qb:.1f}'}.\n")
    return "".join(out)


def sweep_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:

    t = sw.run_tables(run_dir)
    cfg, df, plan, ref = t["config"], t["table"], t["plan"], t["reference"]
    vary = plan["vary"]
    out = [f"## Sensitivity: {vary} (paper §6.5, Fig. 7{'a' if vary == 'input-len' else 'b'})\n\n",
           f"Run `{run_dir.name}` — {cfg.get('preset_line', '')}; {plan.get('rule', '')}; "
           f"{cfg.get('num_prompts')} prompts per point; {cfg.get('measurement', '')}.\n\n"]
    shown = sw.sweep_display(df, cfg.get("systems_labels") or [], ref)
    out.append(md_table(shown, sw.table_formats(shown)))
    out.append("\n`paper_len` = the paper-scale length the point stands for.\n")
    out.append(_figures(run_dir / "plots", "*.png", files_dir, f"sweep-{vary}", rel_base))
    pf, pl, txt = PAPER["sweep"][vary]
    xc = next((c for c in df.columns if c.startswith("x ") and c[2:].startswith("engine")), None) or \
        next((c for c in df.columns if c.startswith("x ")), None)
    out.append("\n### Claims\n\n")
    if xc is None:
        return "".join(out) + "_(no engine/reference pair)_\n"
    vals = [v for v in df[xc].map(num).tolist()]
    first, last = vals[0], vals[-1]
    out.append(claims.add("sweep", f"Speedup vs {ref} at the shortest {vary.split('-')[0]} length", txt,
                          _x(first), verdict(first, pf)))
    out.append(claims.add("sweep", f"Speedup vs {ref} at the longest {vary.split('-')[0]} length", txt,
                          _x(last), verdict(last, pl)))
    out.append(claims.add("sweep", f"Speedup falls as the {vary.split('-')[0]} length grows", f"{pf:.2f}× -> {pl:.2f}×",
                          " -> ".join(_x(v) for v in vals), trend_verdict(first, last, pf, pl)))
    return "".join(out)
