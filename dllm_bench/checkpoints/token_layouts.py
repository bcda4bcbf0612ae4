"""Each family's special tokens (names, real ids), the four a config.json carries, and its chat
template: what a made checkpoint's synthetic tokenizer puts where, keyed by config.json's
`model_type`. The only place in the repo that knows a family's token ids; everything else reads
them from config.json or the tokenizer."""
from __future__ import annotations

from dataclasses import dataclass

from dllm_bench.errors import UserError


@dataclass(frozen=True)
class TokenLayout:
    """A family's special tokens: at their real ids from `real_vocab` rows up, else at the top of
    a smaller vocabulary in the real relative order."""

    family: str
    real_ids: dict[str, int]  # special token -> its id in the real tokenizer
    real_vocab: int           # the real model's embedding rows
    bos: str
    eos: str                  # also the pad token in every family here
    mask: str
    eot: str                  # ends a chat turn
    chat_template: str

    @property
    def named(self) -> set[str]:
        """The tokens tokenizer_config.json names on their own (the rest are "additional")."""
        return {self.bos, self.eos, self.mask}

    def ids(self, vocab_size: int) -> dict[str, int]:
        """Where each special token goes in a vocabulary of `vocab_size` ids."""
        if vocab_size >= self.real_vocab:
            return dict(self.real_ids)
        names = sorted(self.real_ids, key=self.real_ids.get)
        first = vocab_size - len(names)
        return {name: first + i for i, name in enumerate(names)}

    def config_ids(self, vocab_size: int) -> dict[str, int]:
        """The ids config.json carries (bos/eos/pad/mask) for a vocabulary of `vocab_size`."""
        ids = self.ids(vocab_size)
        return {"bos_token_id": ids[self.bos], "eos_token_id": ids[self.eos], "pad_token_id": ids[self.eos],
                "mask_token_id": ids[self.mask]}


# LLaDA-8B-Instruct's special tokens at their real ids (its tokenizer_config.json on the Hugging
# Face Hub, GSAI-ML/LLaDA-8B-Instruct; mask id 126336 as in ML-GSAI/LLaDA@b7e6c35 generate.py).
LLADA_VOCAB_SIZE = 126464
LLADA_SPECIAL_IDS: dict[str, int] = {
    "<|startoftext|>": 126080,  # BOS
    "<|endoftext|>": 126081,  # EOS and PAD
    "<|mdm_mask|>": 126336,  # diffusion [MASK]
    "<role>": 126340,
    "</role>": 126341,
    "<|arithmetic_start|>": 126342,
    "<|arithmetic_end|>": 126343,
    "<|number_start|>": 126344,
    "<|number_end|>": 126345,
    "<|start_header_id|>": 126346,
    "<|end_header_id|>": 126347,
    "<|eot_id|>": 126348,
}
# Llama-3 layout as LLaDA uses it: BOS only before the first message, content trimmed. The
# assistant header is appended when add_generation_prompt (LLaDA appends it always; every
# upstream script passes add_generation_prompt=True, so the prompts are identical).
LLADA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# Dream-v0-Instruct-7B keeps Qwen2.5's tokenizer (151,643 BPE ids, then its special tokens) and adds
# `<|beginoftext|>` and `<|mask|>` after them; eos = pad = 151643, mask 151666 (the issue, the
# upstream DreamConfig defaults, and its generation_config.json: bos = eos = pad = 151643). Only
# the tokens a chat and the sampler use are kept; the embedding has 152,064 rows.
DREAM_VOCAB_SIZE = 152064
DREAM_SPECIAL_IDS: dict[str, int] = {
    "<|endoftext|>": 151643,  # BOS, EOS and PAD
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,  # ends a chat turn
    "<|beginoftext|>": 151665,
    "<|mask|>": 151666,  # diffusion [MASK]
}
# ChatML as Qwen2.5 and Dream write it: a default system turn when the first message is not one,
# each turn `<|im_start|>role\n...<|im_end|>\n`, content untrimmed.
DREAM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LAYOUTS: dict[str, TokenLayout] = {
    "llada": TokenLayout("LLaDA", LLADA_SPECIAL_IDS, LLADA_VOCAB_SIZE, bos="<|startoftext|>", eos="<|endoftext|>",
                         mask="<|mdm_mask|>", eot="<|eot_id|>", chat_template=LLADA_CHAT_TEMPLATE),
    "Dream": TokenLayout("Dream", DREAM_SPECIAL_IDS, DREAM_VOCAB_SIZE, bos="<|endoftext|>", eos="<|endoftext|>",
                         mask="<|mask|>", eot="<|im_end|>", chat_template=DREAM_CHAT_TEMPLATE),
}


def token_layout(model_type: str) -> TokenLayout:
    """The token layout of a config.json `model_type`; an unknown one is one error line."""
    try:
        return LAYOUTS[model_type]
    except KeyError:
        known = ", ".join(f"{lay.family} ({t!r})" for t, lay in LAYOUTS.items())
        raise UserError(f"no tokenizer layout for model_type {model_type!r}; known: {known}") from None


def tokenizer_config(layout: TokenLayout, specials: dict[str, int], model_max_length: int) -> dict:
    """tokenizer_config.json for a tokenizer holding `specials` (AutoTokenizer loads it offline)."""
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for t, i in sorted(specials.items(), key=lambda kv: kv[1])
    }
    return {
        "add_bos_token": False,  # BOS comes from the chat template only (LLaDA), or never (Dream)
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in sorted(specials, key=specials.get) if t not in layout.named],
        "bos_token": layout.bos,
        "chat_template": layout.chat_template,
        "clean_up_tokenization_spaces": False,  # keep decode an exact inverse of encode
        "eos_token": layout.eos,
        "mask_token": layout.mask,
        "model_max_length": model_max_length,
        "pad_token": layout.eos,  # pad = EOS as in LLaDA's SFT and Dream's config
        "padding_side": "left",  # what every upstream generation script sets
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
