"""Logit-aware activation budgeting: logits only for rows that can commit, `max_num_logits` at a time."""
from dataclasses import dataclass

import torch

from engine.regions import DECODE, LM_HEAD, region
from engine.unmask import confidence_at, dream_rows, gumbel_argmax, proposal_argmax

MONOLITHIC_DECODE_ROWS = 64


@dataclass
class RowSegment:
    start: int
    count: int
    temperature: float
    gen: torch.Generator | None
    dream: object | None = None   # its SamplingParams when it decodes by Dream's rule


@dataclass
class DecodeResult:
    x0: torch.Tensor
    conf: torch.Tensor            # [R] the proposal's confidence (its rule's score; LLaDA: the clean softmax)
    rows_materialized: int
    max_rows_at_once: int         # the largest logits tensor that existed, in rows
    entropy: torch.Tensor | None = None


def by_rule(logits: torch.Tensor, c0: int, segments: list[RowSegment], mask_id: int, entropy: bool = False,
            plain=None, full=None) -> tuple:
    """Rows [c0, c0 + len) -> (x0, conf, entropy or None): Dream's rule on its segments (over `full`), else `plain`."""

    def argmax_or_gumbel(part: torch.Tensor, at: int) -> tuple:
        x0 = proposal_argmax(part, mask_id)
        for seg in segments:
            a, b = max(seg.start, at), min(seg.start + seg.count, at + part.shape[0])
            if seg.temperature != 0 and a < b:
                x0[a - at : b - at] = gumbel_argmax(part[a - at : b - at], seg.temperature, seg.gen, mask_id)
        logp = torch.log_softmax(part.to(torch.promote_types(part.dtype, torch.float32)), dim=-1) if entropy else None
        ent = -(logp.exp() * logp).sum(-1) if entropy else None
        return x0, confidence_at(part, x0, inplace=True), ent    # the chunk is consumed: read last

    plain, n = plain or argmax_or_gumbel, logits.shape[0]
    spans = [(max(s.start - c0, 0), min(s.start + s.count - c0, n), s) for s in segments if s.dream is not None]
    parts, at = [], 0
    for a, b, s in [t for t in spans if t[0] < t[1]] + [(n, n, None)]:
        if at < a:
            parts.append(plain(logits[at:a], c0 + at))
        if s is not None:
            parts.append(dream_rows(full(logits[a:b]) if full else logits[a:b], s.dream, s.gen, mask_id, entropy))
        at = b
    x0, conf, ent = zip(*parts)
    return parts[0] if len(parts) == 1 else (torch.cat(x0), torch.cat(conf), torch.cat(ent) if entropy else None)


@region(DECODE)
def decode_rows(lm_head, hidden: torch.Tensor, row_index: torch.Tensor, segments: list[RowSegment],
                max_num_logits: int | None, mask_id: int, entropy: bool = False, chunk=by_rule) -> DecodeResult:
    """Proposals for `row_index`'s rows of `hidden`, `chunk` decoding each logits chunk (None: monolithic)."""
    R = row_index.numel()
    if max_num_logits is None:
        with region(LM_HEAD):
            full = lm_head(hidden)
        parts = [chunk(full[row_index[c0 : c0 + MONOLITHIC_DECODE_ROWS]], c0, segments, mask_id, entropy)
                 for c0 in range(0, R, MONOLITHIC_DECODE_ROWS)]
        rows = at_once = hidden.shape[0]
    else:
        picked, parts = hidden[row_index], []
        for c0 in range(0, R, max_num_logits):
            with region(LM_HEAD):
                logits = lm_head(picked[c0 : c0 + max_num_logits])
            parts.append(chunk(logits, c0, segments, mask_id, entropy))
            del logits                              # freed before the next chunk exists
        rows, at_once = R, min(R, max_num_logits)
    parts = parts or [(hidden.new_zeros(0, dtype=torch.long), hidden.new_zeros(0, dtype=torch.float64), None)]
    x0, conf, ent = ((p[0] if len(p) == 1 else torch.cat(p)) if p[0] is not None else None for p in zip(*parts))
    return DecodeResult(x0, conf, rows, at_once, ent)
