"""The summary tables of the benchmark scripts (`make bench-mechanisms`, `bench-engine`,
`bench-server`), one row per measure with its goal: each script writes a run directory of its
kind (config.json, summary.json: `results.write_result`) and prints its table from there, and a
doc's current-results block renders the same table from the committed copy. A section the run
skipped has no row."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.console import md_table

MiB, GiB = 2**20, 2**30


def _goal(ok: bool, goal: str) -> str:
    return f"{goal}: {'met' if ok else 'missed'}"


def _md(rows: list[tuple], cols: tuple[str, ...]) -> str:
    return md_table(pd.DataFrame(rows, columns=list(cols)), as_text=True)


def mechanisms(cfg: dict, s: dict) -> str:
    """Each mechanism against its "off" state (benchmarks/bench_mechanisms.py)."""
    rows = []
    if "memory" in s:
        b, m = s["memory"]["budgeted"], s["memory"]["monolithic"]
        peak = m["refresh_peak"] / b["refresh_peak"]
        kv = b["kv_pool_tokens"] / max(1, m["kv_pool_tokens"])
        rows += [(f"peak activation of a Refresh step with {cfg['tokens']:,} query tokens, `{cfg['model']}`, "
                  f"{cfg['logit_rows']:,}-row logit budget vs monolithic", f"{b['refresh_peak'] / MiB:,.0f} MiB",
                  f"{m['refresh_peak'] / MiB:,.0f} MiB", f"**{peak:.2f}×** lower", _goal(peak >= 8, "≥ 8×")),
                 (f"KV pool at a {cfg['budget_gib']:g} GiB budget, logit-aware vs monolithic profile",
                  f"{b['kv_pool_tokens']:,} token slots", f"{m['kv_pool_tokens']:,}", f"**{kv:.2f}×** more",
                  _goal(kv >= 2, "≥ 2×")),
                 ("requests the pool admits (256 + 256 tokens, retention 0.5)", f"{b['fit']:,}", f"{m['fit']:,}",
                  f"{b['fit'] / max(1, m['fit']):.2f}×", "")]
    if "reuse_attention" in s:
        a = s["reuse_attention"]
        rows.append((f"Reuse-step attention, retention {a['retention']} vs dense, {a['context']:,} context tokens, "
                     f"{a['requests']} requests", f"{a['sparse'] * 1e3:,.0f} ms", f"{a['dense'] * 1e3:,.0f} ms",
                     f"**{a['dense'] / a['sparse']:.1f}×** faster", _goal(a["dense"] / a["sparse"] >= 3, "≥ 3×")))
    if "bookkeeping" in s:
        k = s["bookkeeping"]
        share = k["bookkeeping"] / k["total"]
        rows.append((f"scheduler + bookkeeping share of step time, {k['requests']} requests", f"{100 * share:.1f} %",
                     "", "", _goal(share < 0.05, "< 5 %")))
    return _md(rows, ("measure", "on", "off", "ratio", "goal"))


def engine(cfg: dict, s: dict) -> str:
    """The engine against the machine (benchmarks/bench_engine.py)."""
    rows = []
    if "throughput" in s:
        t = s["throughput"]
        ref = t["reference_s"]
        cells = ", ".join(f"{r['cache']}{' (exact, ' + r['same'] + ' equal)' if r['cache'] == 'none' else ''} "
                          f"**{ref / r['seconds']:.2f}×**" for r in t["engines"])
        rows.append((f"throughput × the reference sampler ({cfg['preset']}, {cfg['prompts']} prompts)", cells, "–"))
    mfu = s.get("mfu") or {}
    for dtype, goal in (("float32", 0.5), ("bfloat16", 0.4)):
        if dtype in mfu:
            r = mfu[dtype]
            parts = ", ".join(f"{label} {100 * r[k]:.1f} %" for k, label in
                              (("mfu_refresh", "Refresh"), ("mfu_reuse", "Reuse"), ("mfu_lm_head", "LM head")) if k in r)
            rows.append((f"MFU, {dtype} (peak {r['peak'] / 1e9:.1f} GFLOP/s), `{cfg['mfu_preset']}`",
                         f"**{100 * r['mfu']:.1f} %** ({parts})", _goal(r["mfu"] >= goal, f"≥ {100 * goal:.0f} %")))
    if mfu and "bfloat16" not in mfu and cfg.get("bf16_native") == []:
        rows.append(("MFU, bfloat16", "skipped: emulated on this CPU (no amx_bf16 or avx512_bf16)", "–"))
    if {"float32", "bfloat16"} <= mfu.keys():
        speed = mfu["bfloat16"]["tokens_per_s"] / mfu["float32"]["tokens_per_s"]
        rows.append(("bf16 / fp32 tokens/s", f"**{speed:.2f}×** (the peaks' ratio: "
                     f"{mfu['bfloat16']['peak'] / mfu['float32']['peak']:.2f}×)", _goal(speed >= 2.5, "≥ 2.5× (with AMX)")))
    host = s.get("host") or {}
    if host:
        worst = max(h["64"]["other_ms"] for h in host.values())
        rows.append(("host work outside the layers per step at 64 requests (1 request), one core",
                     ", ".join(f"**{h['64']['other_ms']:.2f} ms** {c} ({h['1']['other_ms']:.2f} ms)" for c, h in host.items()),
                     _goal(worst <= 2, "≤ 2 ms")))
    ops = s.get("ops") or {}
    if ops:
        syncs = max(v for o in ops.values() for v in o["syncs"].values())
        rows.append(("host syncs per step at 1 / 8 / 64 requests", ", ".join(
            f"**{' / '.join(str(o['syncs'][n]) for n in ('1', '8', '64'))}** {c}" for c, o in ops.items()),
            _goal(syncs <= 2, "≤ 2")))
        rows.append(("graph breaks of the step forward under `torch.compile`",
                     ", ".join(f"**{o['graph_breaks']}** {c}" for c, o in ops.items()),
                     _goal(all(o["graph_breaks"] == 0 for o in ops.values()), "0")))
        ratio = {c: o["ops"]["64"] / o["ops"]["1"] for c, o in ops.items()}
        met = [c for c, r in ratio.items() if r <= 1.2]
        rows.append(("operator calls per step, 64 / 1 request (64 / 8)", ", ".join(
            f"**{ratio[c]:.2f}** {c} ({o['ops']['64']} / {o['ops']['1']}; {o['ops']['64'] / o['ops']['8']:.2f})"
            for c, o in ops.items()), "≤ 1.2: " + ("met" if len(met) == len(ratio) else
                                                   f"met for {', '.join(met)}" if met else "missed")))
    return _md(rows, ("measure", "result", "goal"))


def server(cfg: dict, s: dict) -> str:
    """The HTTP server's own cost per request with a stub engine (benchmarks/bench_server.py):
    over the repeats, the median and the range."""
    runs = s["runs"]
    rows = []

    def spread(v: list[float], fmt: str) -> str:
        lo, hi = fmt.format(min(v)), fmt.format(max(v))
        return fmt.format(statistics.median(v)) + (f" ({lo}–{hi})" if lo != hi else "")
    for mode, label in (("whole", "whole response"), ("streamed", "streamed")):
        cpu = [r[mode]["server_cpu_s"] / r[mode]["requests"] for r in runs]
        med = statistics.median(cpu)
        rows.append((f"server CPU per request, {label}",
                     f"{spread([1e3 * c for c in cpu], '{:.2f}')} ms = **{1 / med:,.0f} req/s per core**",
                     _goal(1 / med >= 500, "≥ 500 req/s")))
        rows.append((f"requests/s the client saw, {label} ({cfg['concurrency']} in flight)",
                     spread([r[mode]["requests"] / r[mode]["wall_s"] for r in runs], "{:,.0f}"), "–"))
    head = f"{cfg['requests']:,} requests per mode, {len(runs)} run{'s' if len(runs) > 1 else ''}"
    return f"{head}; server pinned to core {cfg['server_core']}, load generator to core {cfg['client_core']}.\n\n" + \
        _md(rows, ("measure", "result", "goal"))


TABLES: dict[str, Callable[[dict, dict], str]] = {
    "bench-mechanisms": mechanisms, "bench-engine": engine, "bench-server": server}


def table_of(run_dir: Path) -> str:
    """The summary table of a benchmark's run directory."""
    doc = results.load_config(run_dir)
    summ = results.read_json(run_dir / "summary.json")
    return TABLES[doc["kind"]](doc.get("config") or {}, summ)
