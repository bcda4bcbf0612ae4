"""The sections of `dllm-bench report`, one per run kind (accuracy, ablate, sweep; serve:
dllm_bench.report.serving, simulate: dllm_bench.report.simulated): each
renders its run's tables, copies its PNGs next to the report, and checks the paper's claims it
covers (numbers and verdict rule: dllm_bench.report.claims). The document around them:
dllm_bench.report.document. Each table is a function of its own: the docs' current-results
blocks render the same ones (dllm_bench.report.current).
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.ablate import tables as ab
from dllm_bench.console import md_table, num
from dllm_bench.repeats import Spread, ratio
from dllm_bench.report.claims import PAPER, Claims, mark, single, spread_text, trend_verdict, verdict
from dllm_bench.sweep import lengths as sw
from dllm_bench.systems.spec import ENGINE, SPARSE_BASELINE


def _x(v: float | None, d: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{d}f}×"


def _repeats(cfg: dict) -> str:
    n = int(cfg.get("repeats", 1) or 1)
    return f"; {n} repeats per point (seeds {cfg.get('repeat_seeds')}), median [min–max]" if n > 1 else ""


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


# ---------------------------------------------------------------- tables (also the docs' current results)
def accuracy_line(summ: dict) -> str:
    """What an accuracy run measured, in one line: task, split, models, metric."""
    several = bool(summ.get("seeds"))
    models = summ.get("models") or [summ.get("model", "?")]
    return (f"task {summ.get('task') or '?'} ({summ.get('split') or 'test'} split), model{'s' if several else ''} "
            f"{', '.join(models)}, metric {summ.get('metric', '?')}"
            + (f"; accuracy = mean over the {len(models)} models, CI = Wilson on the pooled counts" if several else ""))


def accuracy_table(summ: dict) -> str:
    """An accuracy run's points (the mean over its models when it has several)."""
    pts = summ.get("seeds") or summ.get("points") or []
    cols = [c for c in ("point", "system", "selection", "score_query", "retention", "n", "accuracy", "ci_low", "ci_high",
                        "seed_sd", "seed_min", "seed_max", "flexible-extract_accuracy", "relative_to_dense")
            if any(c in p for p in pts)]
    df = pd.DataFrame([{c: p.get(c) for c in cols} for p in pts])
    return md_table(df, {c: "{:.3f}" for c in ("accuracy", "ci_low", "ci_high", "seed_sd", "seed_min", "seed_max",
                                                "flexible-extract_accuracy", "relative_to_dense")})


def ablate_line(cfg: dict) -> str:
    return (f"{cfg.get('preset_line', '')}; {cfg.get('measurement', '')}; "
            f"{cfg.get('num_prompts')} prompts per dataset{_repeats(cfg)}.")


def ablate_ladder(lt: pd.DataFrame) -> str:
    """The ladder (each rung's throughput and speedups) beside the paper's §6.6 speedups."""
    paper_rows = []
    for ds, d in PAPER["ablation"].items():
        for k, title in (("engine", "+ inference engine"), ("scheduler", "+ phase-multiplexed scheduler"),
                         ("logits", "+ logit-aware budgeting")):
            paper_rows.append({"dataset": ds, "rung": title, "paper x": d[k]})
    shown = ab.ladder_display(lt.merge(pd.DataFrame(paper_rows), on=["dataset", "rung"], how="left"))
    cols = [c for c in ("dataset", "rung", "system", "throughput_tok_s", "x_vs_baseline", "delta_x_vs_prev",
                        "pct_vs_prev", "step_vs_prev", "max_batch_size", "mean_batch_size", "paper x")
            if c in shown.columns]
    return (md_table(shown[cols], {**ab.LADDER_FMT, "paper x": "{:.2f}x"})
            + "\n`paper x` = the cumulative speedup the paper states in §6.6 (`-`: not stated in its text).\n")


def sweep_line(cfg: dict) -> str:
    return (f"{cfg.get('preset_line', '')}; {cfg['plan'].get('rule', '')}; "
            f"{cfg.get('num_prompts')} prompts per point; {cfg.get('measurement', '')}{_repeats(cfg)}.")


def sweep_markdown(t: dict) -> str:
    """A sweep's table: each system's throughput and the ratio to the reference per length."""
    shown = sw.sweep_display(t["table"], t["config"].get("systems_labels") or [], t["reference"])
    return md_table(shown, sw.table_formats(shown)) + "\n`paper_len` = the paper-scale length the point stands for.\n"


# ---------------------------------------------------------------- sections
def accuracy_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:
    """One accuracy run: its table (the mean over models with the spread across seeds when it has
    several) and the Fig. 6 claims under each selection scoring rule it measured."""

    summ = results.read_json(run_dir / "summary.json")
    pts = summ.get("seeds") or summ.get("points") or []
    task = summ.get("task") or "?"
    out = [f"## Accuracy under KV retention (paper §6.4, Fig. 6): {task}\n\n",
           f"Run `{run_dir.name}` — {accuracy_line(summ)}\n\n"]
    out.append(accuracy_table(summ))
    out.append(_figures(run_dir, "*.png", files_dir, f"accuracy-{task}", rel_base))
    chosen = {sel: c["score_query"] for sel, c in (summ.get("dev_choice") or {}).get("choice", {}).items()}
    if chosen:
        out.append(f"\nScoring rule chosen on dev run `{summ['dev_choice']['dev_run']}`: "
                   + ", ".join(f"{sel}: {q}" for sel, q in chosen.items()) + "\n")

    def acc_at(system: str, sel: str, rule: str, field: str = "accuracy") -> dict[float, float]:
        d = {}
        for p in pts:
            r, a = num(p.get("retention")), num(p.get(field))
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
        head = acc_at(ENGINE, "head", head_rule)
        # Uniform = the engine's uniform selection; else the Sparse-dLLM system (uniform by design).
        uni_sys = ENGINE if acc_at(ENGINE, "uniform", uni_rule) else SPARSE_BASELINE
        uni = acc_at(ENGINE, "uniform", uni_rule) or (acc_at(SPARSE_BASELINE, "uniform", "mean") if uni_rule == "mean" else {})
        uni_rule_used = uni_rule if uni_sys == ENGINE else "mean"
        common = sorted(set(head) & set(uni))
        # the paper's points: r = 10 % (and 20 % for the halving claim), else the lowest swept r
        start = common.index(0.1) if 0.1 in common else 0
        if common:
            r0 = common[start]
            ratio = head[r0] / uni[r0] if uni[r0] else (math.inf if head[r0] > 0 else 1.0)
            shown = "uniform at 0" if math.isinf(ratio) else _x(ratio)
            ours = f"at r = {r0:g}: head {100 * head[r0]:.1f}% vs uniform {100 * uni[r0]:.1f}% ({shown}){note}"
            v = verdict(ratio, ph / pu)
            # The interval the two Wilson intervals allow (the accuracies' own noise, not repeats).
            hl, hh = acc_at("engine", "head", head_rule, "ci_low").get(r0), acc_at("engine", "head", head_rule, "ci_high").get(r0)
            ul = acc_at(uni_sys, "uniform", uni_rule_used, "ci_low").get(r0)
            uh = acc_at(uni_sys, "uniform", uni_rule_used, "ci_high").get(r0)
            if None in (hl, hh, ul, uh) or math.isinf(ratio):
                m = mark(single(ratio, 2) if not math.isinf(ratio) else single(2.0, 2))
            else:
                m = mark(Spread(ratio, hl / uh if uh else math.inf, hh / ul if ul else math.inf, 2))
        else:
            ours, v, m = "no retention with both head and uniform points", "no data", "no data"
        out.append(claims.add("accuracy", f"{task}: head-centric beats uniform at low retention ({tag})", txt, ours, v, m))
        if len(common) >= start + 2:
            r0, r1 = common[start], common[start + 1]
            ok = head[r0] >= (1 - 0.05) * uni[r1]
            out.append(claims.add("accuracy", f"{task}: head-centric at the lowest r ≈ uniform at the next r ({tag})",
                                  PAPER["accuracy_halving"],
                                  f"head at r = {r0:g}: {100 * head[r0]:.1f}%, uniform at r = {r1:g}: {100 * uni[r1]:.1f}%",
                                  "matches" if ok else "does not match", "reproduced" if ok else "not reproduced"))
    return "".join(out)


def ablate_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:

    t = ab.run_tables(run_dir)
    cfg = t["config"]
    lt, ct = t["ladder"], t["cache"]
    out = ["## Ablation (paper §6.6, Fig. 8)\n\n", f"Run `{run_dir.name}` — {ablate_line(cfg)}\n\n"]
    if lt is not None:
        out.append(ablate_ladder(lt))
    out.append(_figures(run_dir / "plots", "*.png", files_dir, "ablate", rel_base))
    out.append("\n### Claims\n\n")
    keys = {"engine": "+ inference engine", "scheduler": "+ phase-multiplexed scheduler", "logits": "+ logit-aware budgeting"}
    if lt is not None:
        for k, title in keys.items():
            for ds in t["datasets"]:
                pv = PAPER["ablation"].get(ds, {}).get(k)
                row = lt[(lt["dataset"] == ds) & (lt["rung"] == title)]
                if pv is None:
                    continue
                ours = _rung_spread(row.iloc[0]) if len(row) else None
                out.append(claims.add("ablate", f"{title} on {ds}", f"{pv:.2f}× vs Sparse-dLLM (cumulative)",
                                      spread_text(ours), verdict(ours.median if ours else None, pv),
                                      mark(ours, pv > 1)))
        for ds in t["datasets"]:
            sub = lt[lt["dataset"] == ds]
            steps = [(num(r["delta_x_vs_prev"]), r["rung"], r.get("step_vs_prev"), int(num(r.get("repeats")) or 1))
                     for _, r in sub.iterrows() if num(r["delta_x_vs_prev"]) is not None]
            if not steps:
                continue
            pos = sum(1 for d, *_ in steps if d > 0)
            n = min(s[3] for s in steps)
            worse = [nm for d, nm, v, _ in steps if (v == "worse" if n > 1 else d <= 0)]
            noisy = [nm for d, nm, v, _ in steps if n > 1 and v == "within noise"]
            m = "not reproduced" if worse else "within noise" if noisy else "reproduced"
            out.append(claims.add("ablate", f"Every component adds throughput on {ds}",
                                  "each rung raises the cumulative speedup (Fig. 8)",
                                  ", ".join(f"{nm} {d:+.2f}×" + (f" ({v})" if n > 1 and v else "")
                                            for d, nm, v, _ in steps),
                                  "matches" if pos == len(steps) else
                                  f"does not match ({len(steps) - pos} of {len(steps)} rungs do not add)",
                                  m + (" (one run)" if n <= 1 and m != "within noise" else "")))
            big = max(steps)[1]
            out.append(claims.add("ablate", f"The inference engine is the largest single gain on {ds}",
                                  "§6.6: the engine 'alone delivers the most significant jump'",
                                  f"largest step: {big}", "matches" if big == "+ inference engine" else "does not match",
                                  ("reproduced" if big == "+ inference engine" else "not reproduced")
                                  + (" (one run)" if n <= 1 else "")))
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


def _rung_spread(row) -> Spread | None:
    """A ladder row's x vs the baseline rung as a Spread (its repeats' interval when it has one)."""
    x = num(row.get("x_vs_baseline"))
    if x is None:
        return None
    lo, hi, n = num(row.get("x_min")), num(row.get("x_max")), int(num(row.get("repeats")) or 1)
    return Spread(x, lo if lo is not None else float("nan"), hi if hi is not None else float("nan"), n)


def sweep_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:

    t = sw.run_tables(run_dir)
    cfg, df, plan, ref = t["config"], t["table"], t["plan"], t["reference"]
    vary = plan["vary"]
    out = [f"## Sensitivity: {vary} (paper §6.5, Fig. 7{'a' if vary == 'input-len' else 'b'})\n\n",
           f"Run `{run_dir.name}` — {sweep_line(cfg)}\n\n", sweep_markdown(t)]
    out.append(_figures(run_dir / "plots", "*.png", files_dir, f"sweep-{vary}", rel_base))
    pf, pl, txt = PAPER["sweep"][vary]
    xc = next((c for c in df.columns if c.startswith("x ") and c[2:].startswith("engine")), None) or \
        next((c for c in df.columns if c.startswith("x ")), None)
    out.append("\n### Claims\n\n")
    if xc is None:
        return "".join(out) + "_(no engine/reference pair)_\n"
    sysname = xc[2:]
    vals = []
    for _, r in df.iterrows():
        x, lo, hi = num(r[xc]), num(r.get(f"{sysname} x lo")), num(r.get(f"{sysname} x hi"))
        n = int(num(r.get("repeats")) or 1)
        vals.append(None if x is None else Spread(x, lo if lo is not None else float("nan"),
                                                   hi if hi is not None else float("nan"), n))
    first, last = vals[0], vals[-1]
    what = vary.split("-")[0]
    out.append(claims.add("sweep", f"Speedup vs {ref} at the shortest {what} length", txt,
                          spread_text(first), verdict(first.median if first else None, pf), mark(first, pf > 1)))
    out.append(claims.add("sweep", f"Speedup vs {ref} at the longest {what} length", txt,
                          spread_text(last), verdict(last.median if last else None, pl), mark(last, pl > 1)))
    trend = None
    if first is not None and last is not None:
        trend = ratio(last, first) if first.n > 1 and last.n > 1 else single(last.median / first.median, min(first.n, last.n))
    out.append(claims.add("sweep", f"Speedup falls as the {what} length grows", f"{pf:.2f}× -> {pl:.2f}×",
                          " -> ".join(spread_text(v) for v in vals) + f" (last / first {spread_text(trend)})",
                          trend_verdict(first.median if first else None, last.median if last else None, pf, pl),
                          mark(trend, pl > pf)))
    return "".join(out)
