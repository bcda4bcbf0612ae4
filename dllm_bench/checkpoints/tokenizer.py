"""An offline, deterministic tokenizer for the embedded checkpoints of any family.

The real tokenizers can't be downloaded here, so presets ship their own: a byte-level BPE
(digits split one by one, as arithmetic needs) trained on a small corpus generated in code,
with the family's special tokens and chat template (token_layouts: LLaDA's Llama-3 layout,
Dream's ChatML), saved as a `PreTrainedTokenizerFast` (tokenizer.json + tokenizer_config.json)
that `transformers.AutoTokenizer.from_pretrained(dir)` loads with no network.
"""
from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from dllm_bench.checkpoints.token_layouts import (  # noqa: F401  (re-exported for the commands and tests)
    LAYOUTS,
    LLADA_CHAT_TEMPLATE,
    LLADA_SPECIAL_IDS,
    LLADA_VOCAB_SIZE,
    TokenLayout,
    token_layout,
    tokenizer_config,
)

# LLaDA's names, kept for the code and tests that speak LLaDA (token_layouts has every family's).
BOS, EOS, MASK = "<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>"
EOT, START_HEADER, END_HEADER = "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"
CHAT_TEMPLATE = LLADA_CHAT_TEMPLATE
_NAMED = LAYOUTS["llada"].named


@dataclass(frozen=True)
class SpecialIds:
    """A written tokenizer's special tokens and the ids its config.json carries."""

    tokens: dict[str, int]
    layout: TokenLayout

    def config_fields(self) -> dict[str, int]:
        ids = self.tokens
        return {"bos_token_id": ids[self.layout.bos], "eos_token_id": ids[self.layout.eos],
                "pad_token_id": ids[self.layout.eos], "mask_token_id": ids[self.layout.mask]}


def special_token_ids(vocab_size: int, model_type: str = "llada") -> dict[str, int]:
    """Where each special token of the family goes for a vocab of this size. At or above the real
    vocabulary: at the real ids (LLaDA's BOS 126080, ...), the ids no learned token uses filled by
    `<|reserved_N|>` tokens in the BPE vocab, so ids stay dense 0..V-1 (a BPE merge never produces
    a filler, so no text encodes to one). Smaller vocab: learned tokens first, the specials at the
    end in the real order."""
    return token_layout(model_type).ids(vocab_size)


# --------------------------------------------------------------------------- corpus
_NAMES = "Tom Anna Ben Maria Li Sam Omar Julia Ken Sara Noah Emma Ravi Zoe Max Ella".split()
_ITEMS = "apples pencils books marbles cookies stickers cards coins eggs shells toys candies".split()
_ADJ = "small large quick quiet bright dark old new simple careful happy green blue red".split()
_NOUNS = ("cat dog house river city garden table window student teacher computer program "
          "function system model question answer number letter market school road tree").split()
_VERBS = "sees finds makes takes reads writes opens builds moves counts checks likes".split()
_PLACES = "the park|the store|school|the library|the kitchen|the office|the beach|home".split("|")
_IDENTS = "x y n i j k value total count result items data text index left right acc".split()
# Frequent English words, drawn with Zipf-like weights, so BPE learns real sub-words too.
_COMMON = """the of and to in is that it was for on are as with his they at be this have from or
one had by word but not what all were we when your can said there use each which she do how their
if will up other about out many then them these so some her would make like him into time has look
two more write go see way could people my than first water been call who oil its now find long down
day did get come made may part over new sound take only little work know place year live me back give
most very after thing our just name good sentence man think say great where help through much before
line right too mean old any same tell boy follow came want show also around form three small set put
end does another well large must big even such because turn here why ask went men read need land
different home us move try kind hand picture again change off play spell air away animal house point
page letter mother answer found study still learn should world high every near add food between own
below country plant last father keep tree never start city earth eye light thought head under story
saw left few while along might close something seem next hard open example begin life always those
both paper together got group often run important until children side feet car mile night walk white
sea began grow took river four carry state once book hear stop without second later miss idea enough
eat face watch far really almost let above girl sometimes mountain cut young talk soon list song being
leave family""".split()


def _english(rng: random.Random) -> str:
    a, b = rng.choice(_ADJ), rng.choice(_ADJ)
    n1, n2, who = rng.choice(_NOUNS), rng.choice(_NOUNS), rng.choice(_NAMES)
    forms = [
        f"The {a} {n1} {rng.choice(_VERBS)} a {b} {n2}.",
        f"{who} went to {rng.choice(_PLACES)} and {rng.choice(_VERBS)[:-1]}ed the {n1}.",
        f"Is the {n1} {a}? Yes, and it is also {b}.",
        f"In the morning, {who} {rng.choice(_VERBS)} the {n2} near {rng.choice(_PLACES)}.",
        f"This is a {a} example of how a {n1} works, which is why the {n2} matters.",
        f"You are a helpful assistant. Please answer the question about the {n1}.",
    ]
    return rng.choice(forms)


def _arithmetic(rng: random.Random) -> str:
    who, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    forms = [
        f"{who} has {a} {item}. {who} buys {b} more. How many {item} does {who} have now?\n"
        f"{who} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}.\n#### {a + b}",
        f"{who} had {a + b} {item} and gave away {b}. How many are left?\n"
        f"{a + b} - {b} = {a}. The answer is {a}.",
        f"Each box holds {c} {item}. There are {a} boxes. How many {item} are there in total?\n"
        f"{a} * {c} = <<{a}*{c}={a * c}>>{a * c}\n#### {a * c}",
        f"{a * c} {item} are shared equally among {c} friends. How many does each friend get?\n"
        f"{a * c} / {c} = {a}. The answer is {a}.",
        f"What is {a} + {b} - {c}? First {a} + {b} = {a + b}, then {a + b} - {c} = {a + b - c}.",
        f"Q: {a} * {b} = ? A: {a * b}",
    ]
    return rng.choice(forms)


def _code(rng: random.Random) -> str:
    f, x, y = rng.choice(_IDENTS), rng.choice(_IDENTS), rng.choice(_IDENTS)
    fn = f"{rng.choice(['get', 'compute', 'find', 'count', 'sum', 'is'])}_{rng.choice(_NOUNS)}"
    forms = [
        f"def {fn}({x}, {y}):\n    return {x} + {y}\n",
        f"def {fn}({x}: List[int]) -> int:\n    \"\"\"Return the {rng.choice(_ADJ)} {f}.\"\"\"\n"
        f"    {f} = 0\n    for {y} in {x}:\n        if {y} > 0:\n            {f} += {y}\n    return {f}\n",
        f"class {rng.choice(_NOUNS).title()}:\n    def __init__(self, {x}):\n        self.{x} = {x}\n",
        f"import math\nprint(math.sqrt({rng.randint(1, 999)}))\n",
        f"{f} = [{x} * 2 for {x} in range({rng.randint(1, 50)}) if {x} % 2 == 0]\n",
        f"while {x} < {rng.randint(1, 100)}:\n    {x} = {x} + 1\nelse:\n    print({x})\n",
        f"assert {fn}([{rng.randint(0, 9)}, {rng.randint(0, 9)}]) == {rng.randint(0, 18)}\n",
    ]
    return rng.choice(forms)


def _words(rng: random.Random) -> str:
    words = rng.choices(_COMMON, weights=_ZIPF, k=rng.randint(6, 16))
    return " ".join(words).capitalize() + rng.choice([".", ".", "?", "!", ","])


_ZIPF = [1.0 / (r + 1) for r in range(len(_COMMON))]


def build_corpus(n_lines: int = 16000, seed: int = 0) -> list[str]:
    """English, arithmetic word problems (GSM8K style) and Python, interleaved; deterministic."""
    rng = random.Random(seed)
    makers = (_english, _arithmetic, _code, _words)
    return [makers[i % 4](rng) for i in range(n_lines)]


# --------------------------------------------------------------------------- training
def _pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])


@functools.lru_cache(maxsize=4)
def _train_bpe(n_learned: int) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """Learned tokens (in id order) and merges; cached since every preset of a size shares them."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=n_learned, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(build_corpus(), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    return tuple(t for t, _ in vocab), tuple(tuple(m) for m in model["merges"])


def build_tokenizer(vocab_size: int, n_learned: int, model_type: str = "llada"):
    """A `tokenizers.Tokenizer` with exactly `vocab_size` dense ids (learned, specials, fillers)."""
    specials = special_token_ids(vocab_size, model_type)
    budget = min(specials.values())  # learned tokens must stay below the first special id
    if n_learned > budget:
        raise ValueError(f"{n_learned} learned tokens don't fit below special id {budget}")
    learned, merges = _train_bpe(n_learned)
    vocab = {t: i for i, t in enumerate(learned)}
    by_id = {i: t for t, i in specials.items()}
    for i in range(len(learned), vocab_size):
        vocab[by_id.get(i, f"<|reserved_{i}|>")] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # Already in the vocab, so these keep their ids; marking them special makes them atomic in
    # text and dropped by decode(skip_special_tokens=True).
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in sorted(specials, key=specials.get)])
    got = {t: tok.token_to_id(t) for t in specials}
    if got != specials or tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"special ids moved: {got}")
    return tok


def save_tokenizer(out_dir: str | Path, vocab_size: int, n_learned: int,
                   model_max_length: int = 4096, model_type: str = "llada") -> SpecialIds:
    """Write tokenizer.json + tokenizer_config.json into out_dir; return the special ids.

    Files are written by hand (sorted keys) rather than by save_pretrained so the bytes don't
    depend on the transformers version, which keeps checkpoint hashes stable."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layout = token_layout(model_type)
    tok = build_tokenizer(vocab_size, n_learned, model_type)
    specials = layout.ids(vocab_size)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(layout, specials, model_max_length), indent=2, sort_keys=True,
                   ensure_ascii=False) + "\n", encoding="utf-8")
    return SpecialIds(specials, layout)
