"""The task tokenizer of `dllm-bench train`: byte-level BPE learned on synth text (digits split
one by one, names and items end up as single tokens), learned tokens first and the family's special
tokens at the top of the vocab in their real relative order (dllm_bench.checkpoints.token_layouts),
saved so `AutoTokenizer` loads it offline."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from dllm_bench.checkpoints.token_layouts import token_layout, tokenizer_config
from dllm_bench.checkpoints.tokenizer import _pre_tokenizer, special_token_ids


def build_task_tokenizer(corpus: Sequence[str], vocab_size: int, model_type: str = "llada"):
    """A `tokenizers.Tokenizer` of exactly `vocab_size` dense ids: BPE learned on `corpus` (as many
    merges as min_frequency 2 allows, up to the budget), `<|reserved_N|>` fillers, then the
    family's special tokens at the top in their real relative order (token_layouts)."""

    specials = special_token_ids(vocab_size, model_type)
    budget = min(specials.values())
    if budget <= 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for the 256 byte tokens")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = _pre_tokenizer()
    bpe.train_from_iterator(list(corpus), trainers.BpeTrainer(
        vocab_size=budget, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(bpe.to_str())["model"]
    learned = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    vocab = {t: i for i, t in enumerate(learned)}
    by_id = {i: t for t, i in specials.items()}
    for i in range(len(learned), vocab_size):
        vocab[by_id.get(i, f"<|reserved_{i}|>")] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in model["merges"]]))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in sorted(specials, key=specials.get)])
    if {t: tok.token_to_id(t) for t in specials} != specials or tok.get_vocab_size() != vocab_size:
        raise AssertionError("special token ids moved")
    return tok


def save_task_tokenizer(tok, out: Path, model_max_length: int, model_type: str = "llada") -> dict[str, int]:
    """tokenizer.json + tokenizer_config.json exactly as dllm_bench.checkpoints.tokenizer.save_tokenizer writes
    them (AutoTokenizer-loadable offline); returns the config.json special ids."""
    layout = token_layout(model_type)
    specials = layout.ids(tok.get_vocab_size())
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(layout, specials, model_max_length), indent=2, sort_keys=True,
                   ensure_ascii=False) + "\n", encoding="utf-8")
    return layout.config_ids(tok.get_vocab_size())
