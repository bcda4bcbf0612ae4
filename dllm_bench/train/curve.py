"""The learning curve of `dllm-bench train`: a held-out probe (greedy LLaDA decoding of synth test
questions through the model being trained) and its CSV + PNG."""
from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import torch

from dllm_bench.train.batches import Encoded, batched_logits, collate
from engine.models.llada import LLaDAModelLM
from engine.unmask import proposal_argmax


@torch.no_grad()
def probe_generate(model: LLaDAModelLM, batch: Sequence[Encoded], mask_id: int, pad_id: int) -> list[list[int]]:
    """Greedy LLaDA decoding of each example's answer region (gen_length = steps = block =
    window: one token per step, low-confidence remasking), batched with padding masks.
    Same decisions as the engine's exact mode up to float summation order."""
    model.eval()
    ids, valid, region = collate(batch, pad_id, mask_answer=True, mask_id=mask_id)
    steps = len(batch[0].answer)
    for _ in range(steps):
        masked = (ids == mask_id) & region
        if not masked.any():
            break
        logits = batched_logits(model, ids, valid).float()
        probs = logits.softmax(-1)
        pred = proposal_argmax(probs, mask_id)                          # never the mask id, as the engine
        conf = probs.gather(-1, pred[..., None])[..., 0]
        conf = torch.where(masked, conf, torch.full_like(conf, -1.0))
        best = conf.argmax(1)                                           # one token per row per step
        rows = torch.nonzero(masked.any(1)).squeeze(-1)
        ids[rows, best[rows]] = pred[rows, best[rows]]
    out = []
    for i, e in enumerate(batch):
        p = len(e.prompt)
        out.append(ids[i, p:p + len(e.answer)].tolist())
    return out


def probe_accuracy(model, tok, probe: Sequence[Encoded], mask_id: int, pad_id: int,
                   batch: int = 32) -> tuple[float, float]:
    """(strict-match accuracy, token accuracy over the answer tokens before the EOS padding)."""
    from workloads.tasks.scoring import score_gsm8k

    hits = tok_hits = tok_n = 0
    for s in range(0, len(probe), batch):
        chunk = list(probe[s:s + batch])
        for e, toks in zip(chunk, probe_generate(model, chunk, mask_id, pad_id), strict=True):
            text = tok.decode(toks[: toks.index(pad_id)] if pad_id in toks else toks, skip_special_tokens=True)
            hits += score_gsm8k(text, e.target)["strict-match"]
            n = e.answer.index(pad_id) if pad_id in e.answer else len(e.answer)
            tok_hits += sum(int(a == b) for a, b in zip(toks[:n], e.answer[:n], strict=True))
            tok_n += n
    return hits / max(1, len(probe)), tok_hits / max(1, tok_n)


def write_curve(curve: list[dict], out: Path) -> None:
    if not curve:
        return
    with open(out / "learning_curve.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(curve[0]))
        w.writeheader()
        w.writerows(curve)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = [r["train_seconds"] / 60 for r in curve]
    ax.plot(xs, [100 * r["probe_accuracy"] for r in curve], marker="o", color="tab:blue",
            label="answer correct (strict-match)")
    if "probe_token_accuracy" in curve[0]:
        ax.plot(xs, [100 * r["probe_token_accuracy"] for r in curve], marker=".", color="tab:cyan",
                label="answer tokens correct")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_xlabel(f"training time (minutes, {curve[-1]['step']} steps)")
    ax.set_ylabel("held-out synth probe (%)", color="tab:blue")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(xs, [r["loss"] for r in curve], color="tab:red", alpha=0.6, linestyle="--")
    ax2.set_ylabel("train loss", color="tab:red")
    ax.set_title("tiny LLaDA on synth: learning curve", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=110)
    plt.close(fig)
