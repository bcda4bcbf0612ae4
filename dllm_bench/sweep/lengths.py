"""`dllm-bench sweep` (paper §6.5, Fig. 7): throughput of the engine relative to Sparse-dLLM as
the prompt length (at a fixed output length) or the output length (at a fixed prompt length)
grows. Every point is a `random`-style workload with FIXED lengths (every request the same
prompt length and gen_length), all requests at t=0 (saturation), run through serve's worker
machinery (dllm_bench.serve.points.measure_points); run directory of kind "sweep".

The paper sweeps input 100-600 tokens (output 256) and output 128-512 tokens; a preset scales
them by its `length_scale`, outputs kept whole blocks (the rule: `plan_sweep`). GPU presets sweep
the paper's whole grids, CPU presets the two ends and the middle of each. The grids per preset:
docs/SWEEP.md.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dllm_bench import results
from dllm_bench.console import num, with_spreads
from dllm_bench.errors import UserError
from dllm_bench.repeats import aggregate_points, batch_text, compare
from dllm_bench.serve.workload import special_ids
from dllm_bench.units import comma_list
from workloads.serving import build_workload

VARY = ("input-len", "output-len")
PAPER_INPUT_LENS = (100, 200, 300, 400, 500, 600)
PAPER_OUTPUT_LENS = (128, 256, 384, 512)
CPU_INPUT_LENS = (100, 300, 600)
CPU_OUTPUT_LENS = (128, 256, 512)
PAPER_FIXED_OUTPUT = 256   # Table 3: generation length 256
PAPER_FIXED_INPUT = 300    # not stated in the paper: the middle of its input sweep
# Fig. 7 is the paper's dLLM-Serve (every request sparse) against Sparse-dLLM: named explicitly,
# not the `engine` system's default (cache=auto).
DEFAULT_SYSTEMS = "engine:cache=sparse,sparse-dllm"
REFERENCE = "sparse-dllm"
THROUGHPUT = "output_throughput"


@dataclass(frozen=True)
class SweepPlan:
    vary: str
    points: list                   # [(input_len, gen_length)] in the order swept
    fixed: int                     # the length held fixed (tokens)
    input_scale: float
    output_scale: float
    block_length: int
    paper_points: list             # the paper-scale length of each point (None for user points)
    rule: str

    @property
    def values(self) -> list[int]:
        i = 0 if self.vary == "input-len" else 1
        return [p[i] for p in self.points]

    def label(self, point: tuple[int, int]) -> str:
        return f"in{point[0]}-out{point[1]}"

    def to_dict(self) -> dict:
        return {**asdict(self), "values": self.values, "labels": [self.label(p) for p in self.points]}


def parse_vary(text: str) -> str:
    t = str(text).strip().lower().replace("_", "-")
    if t not in VARY:
        raise UserError(f"--vary must be one of {', '.join(VARY)}, got {text!r}")
    return t


def output_scale(length_scale: float, block_length: int) -> float:
    """Output lengths are whole blocks: never scale the paper's shortest (128) below one block."""
    return max(float(length_scale), block_length / PAPER_OUTPUT_LENS[0])


def scale_input(n: int, scale: float) -> int:
    return max(1, int(math.floor(n * scale + 0.5)))


def scale_output(n: int, scale: float, block_length: int) -> int:
    return max(block_length, math.ceil(n * scale / block_length - 1e-9) * block_length)


def _ints(text: str, flag: str) -> list[int]:
    def length(tok: str) -> int:
        try:
            v = int(tok)
        except ValueError:
            raise UserError(f"{flag}: expected comma-separated token counts, got {tok!r}") from None
        if v < 1:
            raise UserError(f"{flag}: lengths must be >= 1 token, got {v}")
        return v
    return comma_list(text, flag, length)


def plan_sweep(vary: str, *, length_scale: float, block_length: int, device: str = "cpu",
               points: str | None = None, fixed: int | None = None) -> SweepPlan:
    """The (input_len, gen_length) points of a sweep for a preset. Input lengths scale by
    `length_scale` (serve-126k 0.125: 100..600 -> 12..75 tokens); output lengths must be whole
    blocks (gen_length a block multiple, steps = gen_length), so they scale by
    max(length_scale, block_length / 128) (the paper's shortest output is at least one block) and
    round up to a block multiple (serve-126k: x0.25 -> 32, 64, 128 = 1..4 blocks of 32, the
    paper's 4..16 blocks / 4). The fixed other length (output 256, Table 3; input 300, the middle
    of the paper's input sweep, which it does not state) scales the same way. `points` (comma
    list, in tokens as sent) and `fixed` override the scaled defaults."""
    vary = parse_vary(vary)
    s_in, s_out = float(length_scale), output_scale(length_scale, block_length)
    gpu = str(device).startswith("cuda")
    if vary == "input-len":
        grid = PAPER_INPUT_LENS if gpu else CPU_INPUT_LENS
        vals = _ints(points, "--points") if points else [scale_input(x, s_in) for x in grid]
        paper = [None] * len(vals) if points else list(grid)
        fx = fixed if fixed is not None else scale_output(PAPER_FIXED_OUTPUT, s_out, block_length)
        if fx % block_length:
            raise UserError(f"--fixed-len: the output length must be a multiple of the block ({block_length}), got {fx}")
        pts = [(v, fx) for v in vals]
        rule = (f"input = paper input x {s_in:g} (length_scale), rounded; output fixed at {fx} "
                f"(paper 256 x {s_out:g}, whole blocks of {block_length})")
    else:
        grid = PAPER_OUTPUT_LENS if gpu else CPU_OUTPUT_LENS
        vals = _ints(points, "--points") if points else [scale_output(x, s_out, block_length) for x in grid]
        bad = [v for v in vals if v % block_length]
        if bad:
            raise UserError(f"--points: output lengths must be multiples of the block ({block_length}), got {bad}")
        paper = [None] * len(vals) if points else list(grid)
        fx = fixed if fixed is not None else scale_input(PAPER_FIXED_INPUT, s_in)
        pts = [(fx, v) for v in vals]
        rule = (f"output = paper output x {s_out:g} (max(length_scale, block/128)) rounded up to whole "
                f"blocks of {block_length}; input fixed at {fx} (paper 300 x {s_in:g})")
    if fixed is not None and fixed < 1:
        raise UserError(f"--fixed-len must be >= 1, got {fixed}")
    # Deduplicate (rounding can merge neighbours) keeping the first paper length.
    seen, P, PP = set(), [], []
    for p, q in zip(pts, paper, strict=True):
        if p not in seen:
            seen.add(p)
            P.append(p)
            PP.append(q)
    return SweepPlan(vary, P, fx, s_in, s_out, block_length, PP, rule)


def point_workload(run, point: tuple[int, int], num_prompts: int, rps: float, seed: int) -> list:
    """num_prompts requests of exactly `point`'s lengths (vLLM `random` with range ratio 0)."""
    L, G = point
    try:
        return build_workload("random", num_prompts=num_prompts, rps=rps, seed=seed,
                              vocab_size=run.model_info["vocab_size"], special_ids=special_ids(run.model_info),
                              length_scale=1.0, block_length=run.preset.block_length, gen_cap=None,
                              random_input_len=L, random_output_len=G, random_range_ratio=0.0,
                              fixed_gen_length=G)
    except ValueError as e:
        raise UserError(str(e)) from None


def reference_label(systems: Sequence) -> str:
    """The baseline the ratios are taken against: sparse-dllm if swept, else the first baseline."""
    bl = [v for v in systems if v.is_baseline]
    if not bl:
        raise UserError(f"--systems needs a baseline to compare with (default: {DEFAULT_SYSTEMS})")
    return next((v.label for v in bl if v.label == REFERENCE), bl[0].label)


# ---------------------------------------------------------------- tables / figures


def sweep_table(points: Iterable[Mapping], plan: Mapping | SweepPlan, systems: Sequence[str], reference: str):
    """One row per sweep point: throughput of every system and each non-reference system's
    throughput / the reference's (the paper's Fig. 7 y axis). Over repeated points (aggregated
    summaries, dllm_bench.repeats.aggregate_points) also each value's min–max (`... lo`/`... hi`
    columns) and whether the ratio is beyond noise; the reference's B and mean realised batch."""
    plan = plan.to_dict() if isinstance(plan, SweepPlan) else plan
    idx = {(p.get("dataset", ""), p["system"]): p for p in points}
    rows = []
    for (L, G), paper, label in zip(plan["points"], plan["paper_points"], plan["labels"], strict=True):
        row: dict[str, Any] = {"input_len": L, "output_len": G, "paper_len": paper}
        ref = idx.get((label, reference))
        row["repeats"] = max((idx[(label, s)].get("repeats", 1) for s in systems if (label, s) in idx), default=None)
        for s in systems:
            p = idx.get((label, s))
            tp = num(p.get(THROUGHPUT)) if p else None
            row[f"{s} tok/s"] = tp
            row[f"{s} tok/s lo"] = num(p.get(f"{THROUGHPUT}_min")) if p else None
            row[f"{s} tok/s hi"] = num(p.get(f"{THROUGHPUT}_max")) if p else None
            if s != reference:
                r, v = compare(p, ref, THROUGHPUT) if p and ref else (None, None)
                row[f"x {s}"] = r.median if r and r.n else None
                row[f"{s} x lo"], row[f"{s} x hi"] = (r.lo, r.hi) if r and r.n else (None, None)
                row[f"{s} vs {reference}"] = v
        if ref and ref.get("max_batch_size"):
            row[f"{reference} B"] = batch_text(ref)
            row[f"{reference} mean batch"] = num(ref.get("mean_batch_size"))
        rows.append(row)
    df = pd.DataFrame(rows)
    lead = ["input_len", "output_len", "paper_len"]
    tps = [c for c in df.columns if c.endswith(" tok/s")]
    return df[lead + tps + [c for c in df.columns if c not in lead and c not in tps]]


def sweep_display(df, systems: Sequence[str], reference: str):
    """The sweep table as printed: `median [min–max]` cells when repeated, verdicts only then."""
    specs = [(f"{s} tok/s", f"{s} tok/s lo", f"{s} tok/s hi", "{:.2f}") for s in systems]
    specs += [(f"x {s}", f"{s} x lo", f"{s} x hi", "{:.2f}x") for s in systems if s != reference]
    return with_spreads(df, specs, drop_when_single=["repeats"] + [f"{s} vs {reference}" for s in systems])


def table_formats(df) -> dict:
    return {c: ("{:.2f}x" if c.startswith("x ") else "{:.1f}" if c.endswith(" mean batch") else "{:.2f}")
            for c in df.columns if c.startswith("x ") or c.endswith(" tok/s") or c.endswith(" mean batch")}


def plot_fig7(df, plan: Mapping | SweepPlan, path: Path, reference: str, title: str = "") -> Path:
    """Paper Fig. 7: (left) throughput relative to the reference vs the swept length, (right)
    the absolute throughputs."""
    # matplotlib costs ~1 s to import: paid only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dllm_bench.plots import save_png

    plan = plan.to_dict() if isinstance(plan, SweepPlan) else plan
    xcol = "input_len" if plan["vary"] == "input-len" else "output_len"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.5, 4.0))
    xs = df[xcol].astype(float)
    for c in [c for c in df.columns if c.startswith("x ")]:
        ys = df[c].map(num)
        a1.plot(xs, ys, marker="o", label=f"{c[2:]} / {reference}")
        for x, y in zip(xs, ys, strict=True):
            if y is not None and not math.isnan(y):
                a1.annotate(f"{y:.2f}×", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    a1.axhline(1.0, color="red", linestyle="--", linewidth=1.0)
    a1.set_ylim(bottom=0, top=max([1.5] + [1.25 * v for c in df.columns if c.startswith("x ")
                                            for v in df[c].map(num) if v is not None and not math.isnan(v)]))
    a1.set_ylabel(f"Relative throughput (× {reference})")
    for i, c in enumerate([c for c in df.columns if c.endswith(" tok/s")]):
        a2.plot(xs, df[c].map(num), marker="os^D"[i % 4], label=c[: -len(" tok/s")])
    a2.set_ylabel("Output throughput (tok/s)")
    a2.set_ylim(bottom=0)
    what = "input (prompt) length" if xcol == "input_len" else "output length (gen_length)"
    for a in (a1, a2):
        a.set_xlabel(f"{what}, tokens")
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
        a.set_xticks(list(xs))
    fig.suptitle(title or f"Sensitivity to {what} (fixed {'output' if xcol == 'input_len' else 'input'} "
                          f"{plan['fixed']} tokens)", fontsize=11)
    fig.tight_layout()
    return save_png(fig, path)


def run_tables(run_dir: Path) -> dict:
    """The sweep table of a finished sweep run dir (what `report` renders)."""
    cfg = results.load_config(run_dir)["config"]
    pts = aggregate_points(results.load_points(run_dir))
    plan = cfg["plan"]
    df = sweep_table(pts, plan, cfg["systems_labels"], cfg["reference"])
    return {"config": cfg, "points": pts, "table": df, "plan": plan, "reference": cfg["reference"]}
