"""Named model presets (gpt-fast `ModelArgs.from_name` style): data only.

A preset is LLaDA-8B-Instruct's config with only the size fields changed, plus a weight seed and
a tokenizer size, so every preset exercises the same code paths as the real model. Presets are
made on first use into a cache directory (random weights: dllm_bench.checkpoints.make), or, for
a preset with `asset=`, point at a checkpoint committed inside the package (a trained model);
where a preset lives and how a name becomes a directory is dllm_bench.checkpoints.store.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dllm_bench.checkpoints.tokenizer import LLADA_VOCAB_SIZE
from dllm_bench.errors import UserError

# Bump when the bytes make_checkpoint writes for a preset change, so stale caches are remade.
FORMAT_VERSION = 1
STAMP_FILE = "dllm_bench_preset.json"

# LLaDA-8B-Instruct's config.json (Hugging Face Hub, GSAI-ML/LLaDA-8B-Instruct), all fields minus auto_map (no remote
# code here) and minus the special-token ids (they come from the tokenizer that is written). The real file is in
# tests/data/llada-8b-instruct/, and tests/test_real_layout.py holds this dict to it.
LLADA_8B_CONFIG: dict = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0, "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True, "bias_for_layer_norm": False, "block_group_size": 1,
    "block_type": "llama", "d_model": 4096, "embedding_dropout": 0.0, "embedding_size": 126464,
    "flash_attention": False, "include_bias": False, "include_qkv_bias": False,
    "init_cutoff_factor": None, "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02,
    "input_emb_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
    "max_sequence_length": 4096, "mlp_hidden_size": 12288, "mlp_ratio": 4, "model_type": "llada",
    "multi_query_attention": None, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32,
    "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05, "rope": True,
    "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 126464, "weight_tying": False,
}
# The real config's auto_map (remote code it names; the hf-sharded layout writes it, nothing here imports it).
LLADA_AUTO_MAP = {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                  "AutoModel": "modeling_llada.LLaDAModelLM"}


def param_count(d_model: int, n_layers: int, kv_dim: int, mlp_hidden_size: int, vocab_rows: int) -> int:
    """Parameters of a LLaDA model of this shape: per block two RMSNorm weights, Q and O (d×d),
    K and V (d×kv_dim), the SwiGLU MLP (3 matrices d×mlp); plus embedding and LM head
    (vocab_rows×d each, untied) and the final norm."""
    d = d_model
    per_block = 2 * d + 2 * d * d + 2 * d * kv_dim + 3 * d * mlp_hidden_size
    return 2 * vocab_rows * d + n_layers * per_block + d


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

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_params(self) -> int:
        return param_count(self.d_model, self.n_layers, self.n_kv_heads * self.head_dim, self.mlp_hidden_size,
                           self.vocab_size)

    def config_dict(self, special_ids: dict[str, int] | None = None) -> dict:
        """LLaDA config.json for this size; special_ids are the tokenizer's (bos/eos/pad/mask)."""
        cfg = dict(LLADA_8B_CONFIG)
        cfg.update(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads, mlp_hidden_size=self.mlp_hidden_size,
            vocab_size=self.vocab_size, embedding_size=self.vocab_size,
            max_sequence_length=self.max_sequence_length, torch_dtype=self.dtype,
        )
        cfg.update(special_ids or {})
        return cfg

    def fingerprint(self) -> dict:
        """Everything that determines the bytes of a made checkpoint (not the note)."""
        d = asdict(self)
        for k in ("note", "asset", "shards"):  # the stamp records the shard count made
            d.pop(k)
        if d["draw_device"] == "cpu":  # added after format 1: only when set, so made caches stay valid
            d.pop("draw_device")
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
    # Committed trained checkpoint: `dllm-bench train` on synth (docs/ACCURACY.md); 4 KV heads.
    _P("tiny-math", 128, 4, 4, 4, 344, 512, tokenizer_learned=500, asset="assets/tiny-math",
       note="trained on synth (dllm-bench train); docs/ACCURACY.md"),
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
