"""Readers of a run's files for the tests: metrics.csv as a frame, an aggregate row's Spread."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from dllm_bench.repeats import Spread


def load_metrics(run_dir: str | os.PathLike) -> pd.DataFrame:
    """metrics.csv of a run (rps column as float, "inf" included)."""
    df = pd.read_csv(Path(run_dir) / "metrics.csv")
    if "rps" in df.columns:
        df["rps"] = df["rps"].map(lambda v: math.inf if v == "inf" else float(v))
    return df


def spread_of(row: pd.Series | dict, metric: str, repeats_col: str = "repeats") -> Spread:
    """The Spread a `dllm_bench.repeats.aggregate` row holds for `metric`."""
    n = int(row.get(repeats_col, 1) or 1)
    return Spread(float(row[metric]), float(row[f"{metric}_min"]), float(row[f"{metric}_max"]), n)
