"""Batches of synth examples for training and probing: prompt + fixed answer window, padded
and masked, and the model's batched, padding-masked bidirectional forward pass."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.attention import sdpa
from engine.models import DenseLM
from workloads.tasks import synth

ANSWER_DELIM = " "                      # lm-eval's target_delimiter: prompt "...Answer:" + " " + answer


@dataclass
class Encoded:
    prompt: list[int]
    answer: list[int]        # the answer region: answer tokens + EOS padding, len == window
    target: str


def encode_examples(tok, rows: Sequence[dict], window: int, eos: int) -> list[Encoded]:
    prompts = tok.encode_batch([synth.format_prompt(r["question"]) for r in rows], add_special_tokens=False)
    answers = tok.encode_batch([ANSWER_DELIM + r["answer"] for r in rows], add_special_tokens=False)
    out = []
    for r, p, a in zip(rows, prompts, answers, strict=True):
        if len(a.ids) >= window:
            raise ValueError(f"answer of {len(a.ids)} tokens does not fit window {window} with an EOS")
        out.append(Encoded(list(p.ids), list(a.ids) + [eos] * (window - len(a.ids)), r["target"]))
    return out


def collate(batch: Sequence[Encoded], pad_id: int, mask_answer: bool = False, mask_id: int = 0):
    """-> ids [B, T] (prompt, answer region, right padding), valid [B, T] (not padding),
    region [B, T] (answer region). With mask_answer the answer region holds mask_id."""
    T = max(len(e.prompt) + len(e.answer) for e in batch)
    B = len(batch)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    valid = torch.zeros((B, T), dtype=torch.bool)
    region = torch.zeros((B, T), dtype=torch.bool)
    for i, e in enumerate(batch):
        p, a = len(e.prompt), len(e.answer)
        ids[i, :p] = torch.tensor(e.prompt)
        ids[i, p:p + a] = mask_id if mask_answer else torch.tensor(e.answer)
        valid[i, :p + a] = True
        region[i, p:p + a] = True
    return ids, valid, region


def batched_logits(model: DenseLM, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, T] ids -> [B, T, V] logits through the engine's own blocks (differentiable), keys
    restricted to each row's valid (non-padding) positions; bidirectional; row p the prediction
    for token p with the family's shift applied as `DenseLM.forward` does (Dream: hidden p - 1)."""
    B, T = ids.shape
    pos = torch.arange(T, device=ids.device).repeat(B)
    keep = valid[:, None, None, :]                                    # [B, 1, 1, T]

    def attn(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q4, k4, v4 = (x.view(B, T, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))
        o = sdpa(q4, k4, v4, keep)
        return o.transpose(1, 2).reshape(B * T, q.shape[1], q.shape[2])

    h = model.hidden_states(ids.reshape(-1), pos, attn)
    logits = model.lm_head(h).view(B, T, -1)
    s = model.config.shift
    return torch.cat([logits[:, :s], logits[:, : T - s]], dim=1) if s else logits
