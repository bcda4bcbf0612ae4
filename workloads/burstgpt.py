"""BurstGPT: replay of a real trace CSV, and a synthetic length model from its published statistics.

The real trace (HPMLL/BurstGPT, CC-BY-4.0) is not bundled: its data files are Git LFS objects.
`load_burstgpt_csv` reads a downloaded copy by column name (v1 and v3 files differ in columns)
and drops failed requests, as vLLM does. Since the trace itself could not be obtained here,
`synthetic_lengths` samples request and response lengths from the statistics published with it
(a log-normal request, a response rising linearly with the request); its sources and known gaps
are in its docstring. `--dataset burstgpt` / `--dataset-path`: docs/SERVE.md ("Options").
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                    "Log Type")
# Only these are needed to build a workload; Model is needed too when a model filter is given.
_REQUIRED = ("Timestamp", "Request tokens", "Response tokens")
BURSTGPT_MODELS = ("ChatGPT", "GPT-4")

# Synthetic length model constants (`synthetic_lengths` says where each comes from).
REQUEST_MEDIAN = 400.0
REQUEST_MEAN = 620.0
REQUEST_CLIP = (1, 4096)
RESPONSE_INTERCEPT = 100.0
RESPONSE_SLOPE = 0.17
RESPONSE_REL_SD = 0.6
RESPONSE_CLIP = (1, 2000)


def synthetic_lengths(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample n (request, response) token counts at full scale from the published statistics.

    Request tokens ~ log-normal with median 400 and mean 620 (mu = ln 400, sigma = sqrt(2 ln 1.55)
    = 0.936), clipped to [1, 4096]: mean request ~622 (a third-party MLPerf KV-cache benchmark doc,
    not re-verified); the paper (arXiv 2401.17644) calls request lengths Zipf-like. Response tokens
    ~ Normal(100 + 0.17 * request, sd = 0.6 * that mean), rounded, clipped to [1, 2000]: BurstGPT's
    README Fig. 4 (conversation logs), a mean rising roughly linearly to ~450 at 2000 request
    tokens, 90% band ~10-700. Known gaps: the model's response mean is ~205 tokens, above the ~126
    the third-party doc reports over the whole trace (API logs included, unverified); ChatGPT's
    bimodal response lengths and the long answers to very short (< 50 token) requests are not
    modelled."""
    sigma = float(np.sqrt(2.0 * np.log(REQUEST_MEAN / REQUEST_MEDIAN)))
    req = rng.lognormal(np.log(REQUEST_MEDIAN), sigma, size=n)
    req = np.clip(np.rint(req), *REQUEST_CLIP).astype(np.int64)
    # The response depends on the (unclipped-by-scale) request length: the trend of README Fig. 4.
    mean = RESPONSE_INTERCEPT + RESPONSE_SLOPE * req
    resp = rng.normal(mean, RESPONSE_REL_SD * mean)
    resp = np.clip(np.rint(resp), *RESPONSE_CLIP).astype(np.int64)
    return req, resp


def _numeric(df: pd.DataFrame, col: str, where: str) -> np.ndarray:
    """Column as float64; the first non-numeric or negative cell is reported with its CSV line."""
    raw = df[col].astype(str).str.strip()
    vals = pd.to_numeric(raw, errors="coerce")
    bad = vals.isna() | ~np.isfinite(vals.to_numpy(dtype=np.float64, na_value=np.nan))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"{where}: column '{col}' has a non-numeric value {raw.iloc[i]!r} "
                         f"at line {i + 2}")
    arr = vals.to_numpy(dtype=np.float64)
    if np.any(arr < 0):
        i = int(np.flatnonzero(arr < 0)[0])
        raise ValueError(f"{where}: column '{col}' has a negative value {raw.iloc[i]!r} at line {i + 2}")
    return arr


def load_burstgpt_csv(path: str | Path, model_filter: str | None = None) -> pd.DataFrame:
    """Read a BurstGPT CSV by column name and return the usable rows, sorted by time.

    v1 header `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type` (Timestamp =
    seconds from 0:00 of the first day, Model in {ChatGPT, GPT-4}, Log Type in {Conversation log,
    API log}); v3 files add `Session ID, Elapsed time`, so columns are read by name, never by
    position (vLLM's loader reads positions and breaks on v3). Failed requests are the rows with
    `Response tokens == 0` (1.8% of BurstGPT_1), dropped as vLLM does.

    Returns a DataFrame with columns `timestamp` (float s), `model` (str, '' if absent),
    `request_tokens`, `response_tokens` (int64) and `line` (1-based line in the CSV, header = 1),
    failed requests (0 response tokens) dropped and, if `model_filter` is given ('ChatGPT' or
    'GPT-4', case-insensitive), only that model's rows kept. Every problem — missing file, empty
    file, missing columns, non-numeric or negative values, nothing left after filtering — raises a
    ValueError with a one-line message naming it.
    """
    path = Path(path)
    where = f"BurstGPT CSV {path}"
    try:
        # Everything as text so a bad cell can be quoted back verbatim in the error message.
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except FileNotFoundError:
        raise ValueError(f"{where}: file not found") from None
    except pd.errors.EmptyDataError:
        raise ValueError(f"{where}: file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{where}: not a readable CSV ({first})") from None
    df.columns = [str(c).strip() for c in df.columns]
    need = list(_REQUIRED) + (["Model"] if model_filter is not None else [])
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: missing column(s) {', '.join(missing)}; expected the BurstGPT "
                         f"header {','.join(BURSTGPT_COLUMNS)}")
    if len(df) == 0:
        raise ValueError(f"{where}: has a header but no data rows")
    out = pd.DataFrame({
        "timestamp": _numeric(df, "Timestamp", where),
        "model": df["Model"].astype(str).str.strip() if "Model" in df.columns else "",
        "request_tokens": np.rint(_numeric(df, "Request tokens", where)).astype(np.int64),
        "response_tokens": np.rint(_numeric(df, "Response tokens", where)).astype(np.int64),
        "line": np.arange(2, len(df) + 2),
    })
    out = out[out["response_tokens"] > 0]
    if len(out) == 0:
        raise ValueError(f"{where}: every row is a failed request (0 response tokens)")
    if model_filter is not None:
        wanted = {m.lower(): m for m in BURSTGPT_MODELS}.get(str(model_filter).strip().lower())
        if wanted is None:
            raise ValueError(f"model filter {model_filter!r} is not a BurstGPT model; choose one of "
                             f"{', '.join(BURSTGPT_MODELS)}")
        present = sorted(set(out["model"]))
        out = out[out["model"] == wanted]
        if len(out) == 0:
            raise ValueError(f"{where}: no successful {wanted} rows (models present: "
                             f"{', '.join(present) or 'none'})")
    # Stable sort: the released files are already in time order, so this normally changes nothing,
    # but trace replay needs non-decreasing timestamps with arrival i belonging to row i.
    return out.sort_values("timestamp", kind="stable").reset_index(drop=True)
