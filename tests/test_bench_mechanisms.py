"""benchmarks/bench_mechanisms.py's bookkeeping share times the compute the engine really runs:
both hooks (the model's forward, the logits decode) are reached in the timed steps, and the
model is left as it was."""
from __future__ import annotations

import importlib
from pathlib import Path

import torch

from tests.helpers import tiny_model

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_bookkeeping_share_times_the_forward_and_the_decode(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))      # the script imports its sibling bench_result
    bench = importlib.import_module("bench_mechanisms")
    model = tiny_model(torch.float32)
    calls = {"decode": 0}
    real = bench.logits_mod.decode_rows

    def counting(*a, **k):
        calls["decode"] += 1
        return real(*a, **k)
    monkeypatch.setattr(bench.logits_mod, "decode_rows", counting)
    r = bench.bench_bookkeeping(model, concurrent=4, prompt=8, gen=8, block=4, steps=3)
    assert calls["decode"] >= 3                        # every timed step decoded through the hook
    assert 0 < r["compute"] < r["total"] and r["bookkeeping"] == r["total"] - r["compute"]
    assert "hidden_states" not in vars(model) and "decode_rows" not in vars(model)
