"""Vocabulary-parallel decoding: each rank proposes from its columns, one all-gather combines them."""
from __future__ import annotations

import torch

from engine.logits import DecodeResult, RowSegment, by_rule, decode_rows
from engine.unmask import gumbel_noise, gumbel_scores, proposal_argmax

KEY, TOKEN, LOGIT, MAX, SUM, ENT = range(6)


class VocabParallelDecode:
    """`engine.logits.decode_rows` for a rank's logit columns [start, start + V/N) of `vocab`."""

    def __init__(self, tp, start: int, vocab: int):
        self.tp, self.start, self.vocab = tp, start, vocab

    def __call__(self, *args, **kwargs) -> DecodeResult:
        return decode_rows(*args, chunk=self.chunk, **kwargs)

    def chunk(self, logits: torch.Tensor, c0: int, segments: list[RowSegment], mask_id: int, entropy: bool):
        """Rows [c0, c0 + len), this rank's columns -> (x0, conf, entropy or None), on every rank;
        Dream's rule (a segment's `dream`) reads its rows' whole vocabulary, gathered."""
        def plain(part: torch.Tensor, at: int):
            return combine(self.tp.all_gather(self.local(part, at, segments, mask_id, entropy)), part.dtype, entropy)
        return by_rule(logits, c0, segments, mask_id, entropy, plain, self.columns)

    def columns(self, part: torch.Tensor) -> torch.Tensor:
        """[rows, V/N] on every rank -> [rows, V], the ranks' columns side by side."""
        got = self.tp.all_gather(part)
        return got.permute(1, 0, 2).reshape(part.shape[0], -1)

    def local(self, logits: torch.Tensor, c0: int, segments: list[RowSegment], mask_id: int,
              entropy: bool) -> torch.Tensor:
        """[rows, 5 or 6] float64: this rank's candidate and log-sum-exp parts per row."""
        n, width = logits.shape
        owns_mask = self.start <= mask_id < self.start + width
        col = _argmax(logits, mask_id - self.start if owns_mask else None)
        key = logits.gather(1, col[:, None])[:, 0].to(torch.float64)
        c1 = c0 + n
        for seg in segments:
            a, b = max(seg.start, c0), min(seg.start + seg.count, c1)
            if seg.temperature == 0 or a >= b:
                continue
            part = logits[a - c0 : b - c0]
            noise = gumbel_noise((b - a, self.vocab), seg.temperature, seg.gen, logits.device)
            scores = gumbel_scores(part, noise[:, self.start : self.start + width])
            c = _argmax(scores, mask_id - self.start if owns_mask else None)
            col[a - c0 : b - c0] = c
            key[a - c0 : b - c0] = scores.gather(1, c[:, None])[:, 0]
        # as engine.unmask.confidence_at, in place; entropy adds one [rows, V/N] temporary
        dt = torch.promote_types(logits.dtype, torch.float32)
        m = logits.amax(-1, keepdim=True)
        cols = [key, (col + self.start).to(torch.float64), logits.gather(1, col[:, None])[:, 0].double(),
                m[:, 0].double()]
        shifted = logits.sub_(m)
        if entropy:
            e = shifted.exp()
            cols += [e.sum(-1, dtype=dt).double(), (e * shifted).sum(-1, dtype=dt).double()]
        else:
            cols.append(shifted.exp_().sum(-1, dtype=dt).double())
        return torch.stack(cols, dim=1)


def combine(gathered: torch.Tensor, dtype: torch.dtype, entropy: bool):
    """gathered [N, rows, 5|6] (every rank's `local`) -> (x0, conf, entropy or None)."""
    dt = torch.promote_types(dtype, torch.float32)
    winner = gathered[..., KEY].argmax(0)                         # ties: the first (lowest) rank
    best = gathered.gather(0, winner[None, :, None].expand(1, *gathered.shape[1:]))[0]
    x0 = best[:, TOKEN].long()
    l_x0 = best[:, LOGIT].to(dt)
    m, s = gathered[..., MAX].to(dt), gathered[..., SUM].to(dt)
    conf = (s * (m - l_x0).exp()).sum(0).reciprocal()
    if not entropy:
        return x0, conf, None
    # H = log S − Σ_r e^{m_r − M} (u_r + (m_r − M) s_r) / S with S = Σ_r e^{m_r − M} s_r
    top = m.amax(0)
    w = (m - top).exp()
    total = (w * s).sum(0)
    spread = (w * (gathered[..., ENT].to(dt) + (m - top) * s)).sum(0)
    return x0, conf, total.log() - spread / total


def _argmax(scores: torch.Tensor, mask_col: int | None) -> torch.Tensor:
    return scores.argmax(-1) if mask_col is None else proposal_argmax(scores, mask_col)
