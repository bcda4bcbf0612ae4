"""Index arrays for ragged batches in numpy: concatenated ranges (`ragged`) and padded rows (`padded`)."""
from __future__ import annotations

import numpy as np
import torch


def offsets(lens) -> np.ndarray:
    """[len + 1] running offsets of consecutive lengths, from 0."""
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def ragged(starts, lens) -> np.ndarray:
    """Concatenated ranges [starts[i], starts[i] + lens[i]) as one index array."""
    starts, lens = np.asarray(starts, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    return np.repeat(starts - offsets(lens)[:-1], lens) + np.arange(int(lens.sum()))


def padded(starts, lens, width: int) -> tuple[np.ndarray, np.ndarray]:
    """[G, width] indices starts[g] + j, valid where j < lens[g] (a pad repeats the row's first) -> (index, valid)."""
    j = np.arange(width)
    valid = j < np.asarray(lens, dtype=np.int64)[:, None]
    return np.asarray(starts, dtype=np.int64)[:, None] + j * valid, valid


def to_device(a: np.ndarray, device) -> torch.Tensor:
    """A host array as a tensor: shared memory on the CPU, one copy to an accelerator."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if torch.device(device).type == "cpu" else t.to(device, non_blocking=True)
