"""The dLLM-Serve paper's quoted numbers and the rules that turn ours into a mark and a verdict
per claim (used by `dllm-bench report`, dllm_bench.report.sections).

Every number attributed to the paper below is quoted from its text (PAPER: abstract, §6.2-§6.6,
Table 4). Each claim gets, computed from the data:
* a mark on the direction of the effect (`mark`): "reproduced" when our ratio is on the paper's
  side of 1.0, "not reproduced" when on the other side, "within noise" when the interval our
  repeats allow (dllm_bench.repeats: min–max over repeats, the ratio's extremes) straddles 1.0;
  a figure from a single run says "(one run)";
* a verdict on the magnitude (`verdict`): "matches" when our value lies within the paper's
  value/range widened by ±TOLERANCE, "same direction" when it is on the same side of 1.0 but
  outside that band, "does not match" otherwise; trend claims compare the sign of the trend.
Missing runs or points make a claim "no data", never a mark or a verdict.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from dllm_bench.repeats import Spread

# Relative band around the paper's value that still "matches": our runs are small models on a
# CPU, so only a gross disagreement should read as one.
TOLERANCE = 0.15

# Quoted from the paper (dllm-serve-paper.md). Values are speedups (x) unless stated.
PAPER = {
    "throughput_4090": (1.61, 1.81, "abstract: throughput 1.61x-1.81x vs the state-of-the-art baseline on the RTX 4090"),
    "throughput_l40s": (1.60, 1.74, "abstract: 1.60x-1.74x on the L40S"),
    "peak_4090_burst": "§6.2: 76.6 tok/s on Burst vs Fast-dLLM's 42.4 tok/s = 1.81x (RTX 4090)",
    "table4": {  # L40S at 1.0 req/s: (dLLM-Serve tok/s, Sparse-dLLM tok/s, speedup vs Sparse-dLLM)
        "livebench": (90.17, 32.26, 2.79), "burstgpt": (106.95, 34.23, 3.12), "osc": (94.32, 32.87, 2.87)},
    "table4_latency": {  # L40S at 1.0 req/s, avg latency s: (dLLM-Serve, Sparse-dLLM)
        "livebench": (218.50, 435.18), "burstgpt": (1551.40, 6466.96), "osc": (1849.79, 6791.42)},
    "latency": (4.0, "abstract: tail latency reduced by nearly 4x under heavy contention; §6.3: OSC on "
                     "the L40S 6791 s -> 1849 s (3.7x), Burst on the 4090 >4000 s -> 1370 s (~3x)"),
    "jitter": (1 / (1 - 0.56), 1 / (1 - 0.53), "§6.3 / Fig. 5: on LiveBench at 0.5 req/s (RTX 4090) the "
                                                "latency std is 56% and the tail span 53% lower than the best "
                                                "baseline's (gains 2.27x and 2.13x)"),
    "accuracy": {  # Fig. 6 at r = 10%: (head-centric, uniform) accuracy in %
        "humaneval": (20.1, 7.9, "Fig. 6a: HumanEval pass@1 at r = 10%: head-centric 20.1% vs uniform 7.9% (2.5x)"),
        "gsm8k": (75.1, 40.0, "Fig. 6b: GSM8K (flexible extract) at r = 10%: head-centric 75.1% vs uniform "
                              "40.0% (+87.7%)")},
    "accuracy_halving": "§6.4: on GSM8K, head-centric at r = 10% matches uniform at r = 20%",
    "ablation": {  # Fig. 8 cumulative speedups vs Sparse-dLLM as stated in §6.6 (None: not stated)
        "livebench": {"engine": 1.48, "scheduler": None, "logits": 1.75},
        "osc": {"engine": 1.58, "scheduler": 1.68, "logits": 1.76},
        "burstgpt": {"engine": 1.76, "scheduler": 1.82, "logits": 1.97}},
    "sweep": {  # Fig. 7 (§6.5): (ratio at the shortest, ratio at the longest)
        "input-len": (3.12, 2.45, "§6.5 / Fig. 7a: vs Sparse-dLLM, 3.12x at short prompts falling to ~2.45x "
                                  "at 600 tokens (inverse correlation)"),
        "output-len": (3.21, 2.47, "§6.5 / Fig. 7b: 3.21x for short generations settling around 2.47x for "
                                   "long ones (128-512 tokens)")},
}


# ---------------------------------------------------------------- verdicts
def verdict(ours: float | None, lo: float, hi: float | None = None, tol: float = TOLERANCE) -> str:
    """Our speedup against the paper's value [lo] or range [lo, hi] (both > 1 or < 1 = sides of parity)."""
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return "no data"
    hi = lo if hi is None else hi
    if lo * (1 - tol) <= ours <= hi * (1 + tol):
        return "matches"
    if (ours > 1) == (lo > 1) and ours != 1:
        return f"same direction, {'smaller' if ours < lo else 'larger'} magnitude — does not match the value"
    return "does not match"


def trend_verdict(first: float | None, last: float | None, paper_first: float, paper_last: float) -> str:
    if first is None or last is None:
        return "no data"
    ps, os_ = math.copysign(1, paper_last - paper_first), (last - first)
    if os_ == 0:
        return "does not match (flat)"
    return "matches (same trend)" if math.copysign(1, os_) == ps else "does not match (opposite trend)"


def mark(ours: Spread | None, paper_above_one: bool = True) -> str:
    """Is the paper's direction of effect (a ratio above 1.0, or below) reproduced? From the
    median and the interval of our repeats (a ratio's interval straddling 1.0 is "within noise");
    a single run can only say which side its one figure is on, and says so."""
    if ours is None or ours.n == 0 or math.isnan(ours.median):
        return "no data"
    if ours.n > 1 and not (math.isnan(ours.lo) or math.isnan(ours.hi)) and ours.lo <= 1.0 <= ours.hi:
        return "within noise"
    m = "reproduced" if (ours.median > 1.0) == paper_above_one and ours.median != 1.0 else "not reproduced"
    return m + (" (one run)" if ours.n <= 1 else "")


def single(value: float | None, n: int = 1) -> Spread | None:
    """A figure without an interval (n repeats behind its median, when known)."""
    return None if value is None else Spread(float(value), float("nan"), float("nan"), n)


def spread_text(s: Spread | None, unit: str = "×") -> str:
    """A ratio as printed in a claim: `1.61×`, or `1.61× [1.40–1.85]` over repeats."""
    if s is None or s.n == 0 or math.isnan(s.median):
        return "n/a"
    if s.n > 1 and not (math.isnan(s.lo) or math.isnan(s.hi)):
        return f"{s.median:.2f}{unit} [{s.lo:.2f}–{s.hi:.2f}] over {s.n} repeats"
    return f"{s.median:.2f}{unit}"


class Claims:
    """The claims checked so far: each section adds its own; render() lists them all in a summary."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, section: str, claim: str, paper: str, ours: str, v: str, m: str = "no data") -> str:
        """One claim: the paper's figure, ours, the mark (direction, noise) and the verdict (magnitude)."""
        self.rows.append({"section": section, "claim": claim, "paper": paper, "ours": ours, "mark": m, "verdict": v})
        return f"- **{claim}** — paper: {paper}. Ours: {ours}. **Mark: {m}.** **Verdict: {v}.**\n"


def mark_counts(rows: Iterable[Mapping]) -> dict[str, int]:
    """Claims per mark: reproduced / not reproduced / within noise / no data (one run folded in)."""
    out: dict[str, int] = {}
    for r in rows:
        k = str(r.get("mark", "no data")).replace(" (one run)", "")
        out[k] = out.get(k, 0) + 1
    return out


def counts(rows: Iterable[Mapping]) -> dict[str, int]:
    """Claims per verdict class: matches / same direction / does not match / no data."""
    out: dict[str, int] = {}
    for r in rows:
        v = str(r["verdict"])
        k = ("matches" if v.startswith("matches") else "same direction" if v.startswith("same direction")
             else "no data" if v == "no data" else "does not match")
        out[k] = out.get(k, 0) + 1
    return out
