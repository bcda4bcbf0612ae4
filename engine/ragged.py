"""Index tensors for ragged batches, built with a fixed number of tensor ops whatever the
number of sequences: concatenated ranges (`ragged`) and padded rows (`padded`)."""
from __future__ import annotations

import torch


def _t(xs: list[int], device) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long, device=device)


def ragged(starts: list[int], lens: list[int], device) -> torch.Tensor:
    """Concatenated ranges [starts[i], starts[i] + lens[i]) as one index tensor."""
    total = sum(lens)
    if total == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    ln = _t(lens, device)
    row = torch.repeat_interleave(torch.arange(len(lens), device=device), ln, output_size=total)
    base = _t([s - c for s, c in zip(starts, excl_cumsum(lens))], device)
    return base[row] + torch.arange(total, device=device)


def padded(starts: list[int], lens: list[int], width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[G, width] indices starts[g] + j, valid where j < lens[g]; a pad repeats the row's first
    index (a real row of the source, so the padding stays finite) -> (index, valid)."""
    j = torch.arange(width, device=device)
    valid = j < _t(lens, device)[:, None]
    return _t(starts, device)[:, None] + j * valid, valid


def excl_cumsum(xs: list[int]) -> list[int]:
    out, acc = [], 0
    for x in xs:
        out.append(acc)
        acc += x
    return out
