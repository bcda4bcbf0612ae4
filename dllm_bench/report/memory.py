"""The current-results table of `dllm-bench memory` runs (docs/MEMORY.md): one row per system
(the engine by its cache, whatever token budget each run gave it), for each run its longest
canvas within its budget (measured), and with `--derive` the longest canvas and the bytes per
token at the target, then each run's peak-to-average over one request's steps (allocated and
dynamic; derived); beneath it, each run's lines on the engine's longest canvas against
Fast-dLLM's (as the command prints them; the token budget is in the run's line). A run whose every system reached the search's cap says
so in its line instead of a column of caps. Read from each run's summary.json."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.console import md_table
from dllm_bench.memory_bench.output import canvas_goals
from dllm_bench.systems.spec import ENGINE

MiB, GiB = 2**20, 2**30
# Knobs a run sets for its engine rows (its budgets): the same system across runs without them.
_BUDGETS = ("max_num_batched_tokens", "max_num_logits")


def _summary(run_dir: Path) -> dict:
    return results.read_json(run_dir / "summary.json")


def _size(n: float) -> str:
    return f"{n / GiB:,.0f} GiB" if n >= GiB and n % GiB == 0 else f"{n / MiB:,.0f} MiB"


def _row_name(entry: dict, knobs: dict) -> str:
    """The system without the run's budgets; the engine's default cache named (e.g. cache=auto)."""
    name, _, _ = entry["system"].partition(":")
    kept = {k: v for k, v in knobs.items() if k not in _BUDGETS}
    label = name + (":" + ",".join(f"{k}={v}" for k, v in kept.items()) if kept else "")
    if name == ENGINE and "cache" not in kept and entry.get("cache"):
        label += f" (cache={entry['cache']}, the default)"
    return label


def _capped(entry: dict) -> bool:
    s = entry.get("search") or {}
    return s.get("max_length") is not None and s.get("first_failing") is None


def _longest(entry: dict) -> str:
    s = entry.get("search") or {}
    n = s.get("max_length")
    return "–" if n is None else ("≥ " if _capped(entry) else "") + f"{n:,}"


def _per_token(b: float | None) -> str:
    return "–" if b is None else f"{b / 1e6:.2f} M" if b >= 1e6 else f"{b / 1e3:.0f} K"


def _ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def memory_line(run_dir: Path) -> str:
    """What one run measured, in one line."""
    d = _summary(run_dir)
    cfg = results.load_config(run_dir).get("config") or {}
    tokens = sorted({s["max_num_batched_tokens"] for s in d["systems"] if s.get("max_num_batched_tokens")})
    systems = [s for s in d["systems"] if s.get("search")]
    line = (f"`{d['model']}` ({d['dtype']}, {d['device']}) within {_size(d['budget_bytes'])}, trained length "
            f"{d['trained_length']:,}")
    if systems:
        line += f"; longest canvas searched up to {cfg.get('max_length', 0):,} on a {cfg.get('resolution', '?')}-token grid"
        if all(_capped(s) for s in systems):
            line += " (every system reached it)"
    line += f"; one request of {d['length']:,} tokens step by step"
    if tokens:
        line += f"; the engine's token budget {', '.join(f'{t:,}' for t in tokens)}"
    if d.get("derive"):
        t = d["derive"]
        line += f"; derived to `{t['model']}` ({t['dtype']}) within {_size(t['budget_bytes'])}"
    return line


def memory_table(run_dirs: list[Path]) -> str:
    """One row per system over the runs (see the module's docstring)."""
    rows: dict[str, dict] = {}
    goals: list[str] = []
    cols: dict[str, list[str]] = {"measured": [], "derived": [], "ratio": []}
    for d in run_dirs:
        doc, cfg = _summary(d), results.load_config(d).get("config") or {}
        knobs = {s["label"]: s.get("knobs") or {} for s in cfg.get("systems") or []}
        entries = doc["systems"]
        goals += [f"* `{doc['model']}`: {line}" for line in canvas_goals(
            doc, lambda e, knobs=knobs: _row_name(e, knobs.get(e["system"], {})), budget=False)]
        where = f"`{doc['model']}` at {_size(doc['budget_bytes'])}"
        searched = [e for e in entries if e.get("search")]
        measured = f"longest canvas, {where} (measured)"
        if searched and not all(_capped(e) for e in searched):
            cols["measured"].append(measured)
        target = doc.get("derive") or {}
        derived = f"derived, `{target.get('model')}` at {_size(target.get('budget_bytes') or 0)}"
        per_token, dyn = "bytes / token (derived)", f"dynamic, derived (`{doc['model']}`)"
        if target:
            cols["derived"] += [derived, per_token]
        ratio = f"peak/avg allocated · dynamic (`{doc['model']}`, {doc['length']:,} tokens)"
        cols["ratio"] += [ratio] + ([dyn] if target else [])
        for e in entries:
            r = rows.setdefault(_row_name(e, knobs.get(e["system"], {})), {})
            r[measured] = _longest(e)
            if target:
                x = e.get("derived") or {}
                n = x.get("max_length")
                r[derived] = "–" if n is None else f"{n:,}" + (f" ({x['mode']})" if x.get("mode") else "")
                r[per_token] = _per_token(x.get("bytes_per_token"))
                r[dyn] = _ratio(x.get("dynamic_peak_to_average"))
            st = (e.get("profile") or {}).get("stats") or {}
            r[ratio] = (f"{_ratio(st.get('peak_to_average'))} · {_ratio(st.get('dynamic_peak_to_average'))}"
                        if st else "–")
    order = [c for k in ("measured", "derived", "ratio") for c in cols[k]]
    engines = [n for n in rows if n.split(":")[0].split(" ")[0] == ENGINE]
    table = pd.DataFrame([{"system": n, **{c: rows[n].get(c, "–") for c in order}}
                          for n in engines + [n for n in rows if n not in engines]])
    return md_table(table, as_text=True) + ("\n" + "\n".join(goals) + "\n" if goals else "")
