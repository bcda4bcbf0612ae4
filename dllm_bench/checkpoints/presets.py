"""Named model presets (gpt-fast `ModelArgs.from_name` style): data only.

A preset names its family (config.json's `model_type`) and a shape; its config.json is the
family's template for that shape (`Family.to_hf` through engine.models), its special ids the
family's (token_layouts), plus a weight seed and a tokenizer size, so every preset exercises
the same code paths as the real model of its family. Presets are made on first use into a cache
directory (random weights: dllm_bench.checkpoints.make), or, for a preset with `asset=`, point at
a checkpoint committed inside the package (a trained model); where a preset lives and how a name
becomes a directory is dllm_bench.checkpoints.store.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dllm_bench.checkpoints.token_layouts import DREAM_VOCAB_SIZE, LLADA_VOCAB_SIZE, token_layout
from dllm_bench.errors import UserError
from engine.models import ModelConfig, config_from_dict

# Bump when the bytes make_checkpoint writes for a preset change, so stale caches are remade.
FORMAT_VERSION = 1
STAMP_FILE = "dllm_bench_preset.json"


def param_count(d_model: int, n_layers: int, kv_dim: int, mlp_hidden_size: int, vocab_rows: int,
                qkv_bias: bool = False) -> int:
    """Parameters of a dense model of this shape: per block two RMSNorm weights, Q and O (d×d),
    K and V (d×kv_dim), q/k/v biases when the family has them (Dream), the SwiGLU MLP (3 matrices
    d×mlp); plus embedding and LM head (vocab_rows×d each, untied) and the final norm."""
    d = d_model
    per_block = 2 * d + 2 * d * d + 2 * d * kv_dim + 3 * d * mlp_hidden_size + (d + 2 * kv_dim) * qkv_bias
    return 2 * vocab_rows * d + n_layers * per_block + d


def model_params(cfg: ModelConfig) -> int:
    """`param_count` of a ModelConfig."""
    return param_count(cfg.d_model, cfg.n_layers, cfg.kv_heads * cfg.head_dim, cfg.mlp_hidden_size,
                       cfg.padded_vocab, cfg.qkv_bias)


@dataclass(frozen=True)
class Preset:
    name: str
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden_size: int
    vocab_size: int  # embedding rows = LM-head rows = tokenizer ids
    tokenizer_learned: int  # BPE budget incl. the 256 bytes (the corpus may stop short: fillers)
    seed: int = 0
    max_sequence_length: int = 4096
    dtype: str = "float32"  # storage dtype of the weights on disk
    makeable: bool = True  # False: describes a shape only (docs / profiling math)
    asset: str | None = None  # package-relative checkpoint dir used instead of making one
    note: str = ""
    # Where `make` draws the random weights: "cuda" for a model too big to draw on a CPU in
    # reasonable time (LLaDA-8B: seconds on a GPU, minutes and 32 GB of RAM on a CPU).
    draw_device: str = "cpu"
    shards: int = 1  # safetensors shards a made checkpoint has unless asked otherwise
    model_type: str = "llada"  # the family: config.json's model_type (engine.models' registry key)
    rope_theta: float | None = None  # None: ModelConfig's default (LLaDA's)
    rms_norm_eps: float | None = None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_params(self) -> int:
        return model_params(self.model_config())

    def special_ids(self) -> dict[str, int]:
        """The bos/eos/pad/mask ids the preset's tokenizer gives (its family's layout)."""
        return token_layout(self.model_type).config_ids(self.vocab_size)

    def model_config(self, special_ids: dict[str, int] | None = None) -> ModelConfig:
        """The preset as its family reads it back from config.json (biases, shift: the family's)."""
        ids = self.special_ids() if special_ids is None else special_ids
        rope = {k: v for k in ("rope_theta", "rms_norm_eps") if (v := getattr(self, k)) is not None}
        base = ModelConfig(d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                           n_layers=self.n_layers, mlp_hidden_size=self.mlp_hidden_size, vocab_size=self.vocab_size,
                           embedding_size=self.vocab_size, max_sequence_length=self.max_sequence_length,
                           model_type=self.model_type, **rope, **ids)
        return config_from_dict(base.family.to_hf(base))

    def config_dict(self, special_ids: dict[str, int] | None = None) -> dict:
        """The family's config.json for this size; special_ids (bos/eos/pad/mask) default to the
        preset's tokenizer's. An id not given is left out (the real LLaDA config has no bos)."""
        cfg = self.model_config(special_ids)
        hf = cfg.family.to_hf(cfg)
        hf = {k: v for k, v in hf.items() if not (k.endswith("_token_id") and v is None)}
        if special_ids is not None:
            hf = {k: v for k, v in hf.items() if not k.endswith("_token_id") or k in special_ids}
        return hf | {"torch_dtype": self.dtype}

    def fingerprint(self) -> dict:
        """Everything that determines the bytes of a made checkpoint (not the note)."""
        d = asdict(self)
        for k in ("note", "asset", "shards"):  # the stamp records the shard count made
            d.pop(k)
        # added after format 1: only when set, so made caches stay valid
        for k, default in (("draw_device", "cpu"), ("model_type", "llada"), ("rope_theta", None),
                           ("rms_norm_eps", None)):
            if d[k] == default:
                d.pop(k)
        return {"format": FORMAT_VERSION, "preset": d}


_P = Preset
PRESETS: dict[str, Preset] = {p.name: p for p in [
    # Unit tests in seconds; 4 query heads over 2 KV heads so GQA paths are always tested.
    _P("tiny", 64, 2, 4, 2, 128, 512, tokenizer_learned=500,
       note="tests: seconds to make and run; GQA 4q/2kv; small vocab"),
    # LLaDA's real vocab and head size: a [T, 126464] logit tensor dwarfs the model, so the
    # logit-memory problem (chunked LM head) is as real as for LLaDA-8B.
    _P("mini-126k", 256, 2, 2, 2, 512, LLADA_VOCAB_SIZE, tokenizer_learned=4096,
       note="LLaDA vocab + head_dim 128; logit memory dominates"),
    # Logit-memory stress model: LLaDA vocab/head size, a few cheap layers, >1 head so the
    # head-centric mechanisms mean something; its LM head is ~128x LLaDA-8B's share of a step
    # (docs/SCALING.md). Stored bf16 like LLaDA's own safetensors: with 126464 x 256 embedding
    # + LM head alone, fp32 would be ~260 MB.
    _P("serve-126k", 256, 4, 2, 2, 768, LLADA_VOCAB_SIZE, tokenizer_learned=4096, dtype="bfloat16",
       note="logit-memory stress preset (profile, bench-mechanisms); bf16 on disk"),
    # Scale-similar to LLaDA-8B (docs/SCALING.md), the default serving model: the LM head / body
    # FLOPs and the logit row / KV token bytes within 4 % of LLaDA-8B's (V ≈ 13·L·d·0.074); at the
    # paper's prompt lengths the attention share (2·ctx / 13d) within ~3.4× of it, which needs a
    # wide model (d = 1024, head 128, f = 3d as LLaDA); and eight layers, because dLLM-Cache
    # recomputes its first layer in full at every step, so with few layers it caches little:
    # its mean step costs 0.20 of a full forward here, 0.16 for LLaDA-8B (1.0 with one layer).
    _P("similar-1024", 1024, 8, 8, 8, 3072, 8192, tokenizer_learned=4096,
       note="scale-similar to LLaDA-8B (docs/SCALING.md); default CPU serving model"),
    # The first scale-similar model: the same head and logit ratios on one d = 1536 layer. With
    # one layer dLLM-Cache's always-refreshed first layer is the whole model (it degenerates
    # into plain LLaDA), so it is kept for comparison only, not as the default.
    _P("similar-1536", 1536, 1, 12, 12, 4608, 1536, tokenizer_learned=1500,
       note="one-layer scale model: dLLM-Cache degenerates here (docs/SCALING.md)"),
    # The real shape and sharded layout (6 bf16 shards, 16 GB) with random weights drawn on a
    # GPU: with `--decoding fixed` every timing equals LLaDA-8B-Instruct's (`bench-gpu`).
    _P("llada-8b", 4096, 32, 32, 32, 12288, LLADA_VOCAB_SIZE, tokenizer_learned=4096,
       dtype="bfloat16", draw_device="cuda", shards=6,
       note="LLaDA-8B-Instruct shape and layout; random weights, made on a CUDA device"),
    # Dream (Qwen2 blocks: q/k/v biases, GQA, the hidden at p - 1 predicts token p). Unit tests in
    # seconds, as `tiny`: 4 query heads over 2 KV heads, biases, a small vocab.
    _P("tiny-dream", 64, 2, 4, 2, 128, 512, tokenizer_learned=500, model_type="Dream", rope_theta=1e6,
       rms_norm_eps=1e-6, note="tests: Dream family (biases, shift), GQA 4q/2kv; small vocab"),
    # Scale-similar to Dream-7B as similar-1024 is to LLaDA-8B (docs/SCALING.md): Dream-7B's FFN
    # width (f = 37d/7) and KV share (kv = d/7: 7 query heads a KV head) keep LM head / body and
    # logit row / KV token together, V ≈ 1357·L here; 2 KV heads so per-KV-head selection and
    # TP=2 mean something (Qwen2.5-0.5B's attention: 14 heads of 64), eight layers as similar-1024.
    _P("similar-dream", 896, 8, 14, 2, 4736, 10880, tokenizer_learned=4096, model_type="Dream", rope_theta=1e6,
       rms_norm_eps=1e-6, note="scale-similar to Dream-7B (docs/SCALING.md)"),
    # Dream-v0-Instruct-7B's shape in its sharded layout (4 bf16 shards, as Qwen2.5-7B) with random
    # weights drawn on a GPU. max_position_embeddings: Dream's config.json is in no readable public
    # copy; 131072 is Qwen2.5-7B's, which Dream is initialised from (its README: 2048 usable).
    _P("dream-7b", 3584, 28, 28, 4, 18944, DREAM_VOCAB_SIZE, tokenizer_learned=4096, dtype="bfloat16",
       draw_device="cuda", shards=4, max_sequence_length=131072, model_type="Dream", rope_theta=1e6,
       rms_norm_eps=1e-6, note="Dream-v0-Instruct-7B shape and layout; random weights, made on a CUDA device"),
    # Committed trained checkpoint: `dllm-bench train` on synth (docs/ACCURACY.md); 4 KV heads.
    _P("tiny-math", 128, 4, 4, 4, 344, 512, tokenizer_learned=500, asset="assets/tiny-math",
       note="trained on synth (dllm-bench train); docs/ACCURACY.md"),
    # Committed trained Dream: tiny-math's recipe with `--model-type Dream --n-kv-heads 2` (Dream's
    # tokens, q/k/v biases, shifted prediction, its CART objective); docs/ACCURACY.md.
    _P("tiny-math-dream", 128, 4, 4, 2, 344, 512, tokenizer_learned=500, asset="assets/tiny-math-dream",
       model_type="Dream", note="a Dream trained on synth (dllm-bench train --model-type Dream); docs/ACCURACY.md"),
]}
# Trained checkpoints that exist only once made (`make train-synth-cot`, `make train-seeds`):
# assets/<name>[-s<seed>], tiny-math's shape, registered when their directory is there.
TRAINED = {"tiny-math": "trained on synth (dllm-bench train); docs/ACCURACY.md",
           "synth-cot": "trained on synth-cot (dllm-bench train --task synth-cot); docs/ACCURACY.md"}
SEEDS = (1, 2)
for _base, _note in TRAINED.items():
    for _seed in (0, *SEEDS):
        _name = _base if _seed == 0 else f"{_base}-s{_seed}"
        if _name not in PRESETS and (Path(__file__).resolve().parent.parent / "assets" / _name / "config.json").is_file():
            PRESETS[_name] = replace(PRESETS["tiny-math"], name=_name, seed=_seed, asset=f"assets/{_name}",
                                     note=_note if _seed == 0 else f"{_base}'s recipe, training seed {_seed}")


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}") from None
