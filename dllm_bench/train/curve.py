"""The learning curve of `dllm-bench train`: a held-out probe (greedy low-confidence decoding of
synth dev questions through the model being trained) and its CSV + PNG."""
from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from dllm_bench.train.batches import Encoded
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.models import DenseLM
from workloads.tasks.scoring import score_gsm8k


def probe_generate(model: DenseLM, batch: Sequence[Encoded]) -> list[list[int]]:
    """Greedy LLaDA decoding of each example's answer region through the engine in exact mode
    (cache none; gen_length = steps = block = window: one token per step, low-confidence
    remasking), the way `dllm-bench accuracy` will decode the trained model."""
    model.eval()
    window = len(batch[0].answer)
    params = SamplingParams(gen_length=window, steps=window, block_length=window, temperature=0.0)
    engine = LLMEngine(EngineConfig(cache="none", sampling=False, device=str(model.device)), model=model)
    return [o.token_ids for o in engine.generate([e.prompt for e in batch], params)]


def probe_accuracy(model, tok, probe: Sequence[Encoded], pad_id: int, batch: int = 32) -> tuple[float, float]:
    """(strict-match accuracy, token accuracy over the answer tokens before the EOS padding)."""
    hits = tok_hits = tok_n = 0
    for s in range(0, len(probe), batch):
        chunk = list(probe[s:s + batch])
        for e, toks in zip(chunk, probe_generate(model, chunk), strict=True):
            text = tok.decode(toks[: toks.index(pad_id)] if pad_id in toks else toks, skip_special_tokens=True)
            hits += score_gsm8k(text, e.target)["strict-match"]
            n = e.answer.index(pad_id) if pad_id in e.answer else len(e.answer)
            tok_hits += sum(int(a == b) for a, b in zip(toks[:n], e.answer[:n], strict=True))
            tok_n += n
    return hits / max(1, len(probe)), tok_hits / max(1, tok_n)


def write_curve(curve: list[dict], out: Path, title: str = "tiny LLaDA on synth") -> None:
    if not curve:
        return
    with open(out / "learning_curve.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(curve[0]))
        w.writeheader()
        w.writerows(curve)
    # matplotlib costs ~1 s to import: paid only when a curve is drawn (dllm_bench.plots selects Agg)
    import matplotlib.pyplot as plt

    from dllm_bench.plots import save_png

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
    ax.set_title(f"{title}: learning curve", fontsize=10)
    fig.tight_layout()
    save_png(fig, out / "learning_curve.png")
