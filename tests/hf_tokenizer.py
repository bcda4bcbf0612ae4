"""Test fixture: LLaDA-8B-Instruct's tokenizer files in their real shape, at a small vocabulary.

The real tokenizer (tokenizer_config.json on the Hub, GSAI-ML/LLaDA-8B-Instruct; a copy is in
tests/data/llada-8b-instruct/) is a byte-level BPE whose ids end with one contiguous block of
269 added special tokens, BOS first and `<|eot_id|>` last, with `<|mdm_mask|>` and the role /
header tokens at fixed offsets inside it and `<|reserved_token_N|>` filling the rest; the
embedding then has a few more rows than the tokenizer has ids (126,349 ids, 126,464 rows). Its
tokenizer_config.json has the keys and the chat template below. Here the same block sits right
after a small learned BPE (dllm_bench.checkpoints.tokenizer's corpus), so the ids are small
but every relative offset, name, flag and key is the real one: what the `hf-sharded` checkpoints
(tests.hf_layout) are for.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, processors

from dllm_bench.checkpoints.tokenizer import BOS, EOS, LLADA_SPECIAL_IDS, _pre_tokenizer, _train_bpe

# The real template verbatim (Llama-3-Instruct's first template: the assistant header comes
# after the messages whether or not add_generation_prompt is set). It renders what
# tokenizer.CHAT_TEMPLATE renders with add_generation_prompt=True, the only way we call it.
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
)
CLS, GMASK = "[CLS]", "[gMASK]"
_BASE = LLADA_SPECIAL_IDS[BOS]
# Offsets inside the block that are not reserved fillers: the named tokens, and [CLS] / [gMASK]
# right after BOS and EOS (GLM heritage; the real file has them, nothing here uses them).
BLOCK_NAMES = {**{t: i - _BASE for t, i in LLADA_SPECIAL_IDS.items()}, CLS: 2, GMASK: 3}
BLOCK_SIZE = max(BLOCK_NAMES.values()) + 1  # 269
FIRST_RESERVED = 4  # <|reserved_token_0|> sits at offset 4; offset k holds reserved_token_{k-4}
ADDITIONAL = ["<role>", "</role>", "<|arithmetic_start|>", "<|arithmetic_end|>", "<|number_start|>",
              "<|number_end|>"]  # additional_special_tokens, in the real order
HF_MAX_LENGTH = 1000000000000000019884624838656  # what transformers writes for "no limit" (int(1e30))
EMBEDDING_MULTIPLE = 128  # 126,349 ids padded to 126,464 embedding rows


def block_tokens(first_id: int) -> dict[str, int]:
    """The added-token block starting at `first_id`: content -> id."""
    by_offset = {k: f"<|reserved_token_{k - FIRST_RESERVED}|>" for k in range(FIRST_RESERVED, BLOCK_SIZE)}
    by_offset.update({k: t for t, k in BLOCK_NAMES.items()})
    return {by_offset[k]: first_id + k for k in range(BLOCK_SIZE)}


def embedding_rows(n_ids: int) -> int:
    return -(-n_ids // EMBEDDING_MULTIPLE) * EMBEDDING_MULTIPLE


def build(n_learned: int) -> tuple[Tokenizer, dict[str, int]]:
    """A fast tokenizer: `n_learned` BPE tokens, then the block; and the block's ids."""
    learned, merges = _train_bpe(n_learned)
    block = block_tokens(len(learned))
    vocab = {t: i for i, t in enumerate(learned)} | block
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # Already in the vocab, so they keep their ids; special: atomic in text, skipped by decode.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in block])
    if any(tok.token_to_id(t) != i for t, i in block.items()):
        raise AssertionError("an added token moved")
    return tok, block


def _token_entry(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def save(out_dir: str | Path, n_learned: int) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json with the real keys and
    values (ids shifted with the block); returns the block's ids. Written by hand, sorted, so
    the bytes don't depend on the transformers version."""
    out = Path(out_dir)
    tok, block = build(n_learned)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False), encoding="utf-8")
    config = {
        "add_bos_token": False, "add_eos_token": False,
        "added_tokens_decoder": {str(i): _token_entry(t) | {"special": True} for t, i in block.items()},
        "additional_special_tokens": ADDITIONAL,
        "bos_token": BOS, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "cls_token": CLS, "eos_token": EOS, "fast_tokenizer": True, "gmask_token": GMASK,
        "merges_file": None, "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": HF_MAX_LENGTH, "pad_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast",
        "trust_remote_code": True, "vocab_file": None,
    }
    special_map = {"additional_special_tokens": ADDITIONAL, "bos_token": _token_entry(BOS),
                   "cls_token": _token_entry(CLS), "eos_token": _token_entry(EOS), "pad_token": _token_entry(EOS)}
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", special_map)):
        (out / name).write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return block
