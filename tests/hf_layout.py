"""Test fixture: a tiny checkpoint in exactly LLaDA-8B-Instruct's on-disk layout (`hf-sharded`): bf16 shards
`model-0000K-of-0000N.safetensors` + `model.safetensors.index.json` (sorted weight_map,
metadata.total_size), config.json with the real file's keys and nothing else (auto_map
included, no torch_dtype, special ids as the real config carries them: eos, pad and mask, no
bos), generation_config.json, and the real tokenizer files' shape (tests.hf_tokenizer).
Only the sizes are small, so whatever loads, chats with and evaluates this
directory does the same with a real checkpoint; the real files are in tests/data/llada-8b-instruct/.

Weights are seeded per tensor name (dllm_bench.checkpoints.make.init_weight), so the bytes don't
depend on the shard count.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from dllm_bench.checkpoints.make import INDEX_FILE, init_weight, plan_shards, weight_shapes
from dllm_bench.checkpoints.presets import Preset
from dllm_bench.checkpoints.tokenizer import BOS, EOS, MASK
from dllm_bench.errors import UserError
from tests import hf_tokenizer

# LLaDA-8B-Instruct's shape ratios at toy size: MHA (n_kv_heads = n_heads), SwiGLU width 3·d,
# 300 learned tokens + the 269-token special block padded to 640 embedding rows.
N_LEARNED = 300
HF_TINY = Preset("hf-tiny", d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden_size=192,
                 vocab_size=hf_tokenizer.embedding_rows(N_LEARNED + hf_tokenizer.BLOCK_SIZE),
                 tokenizer_learned=N_LEARNED, dtype="bfloat16",
                 note="LLaDA-8B-Instruct's file layout at toy size (hf_layout); not registered")
GENERATION_CONFIG_VERSION = "4.38.2"  # the transformers_version the real generation_config.json names
# LLaDA-8B-Instruct's real config.json; its auto_map names remote code (written here, never imported)
REAL_LLADA_CONFIG: dict = json.loads((Path(__file__).resolve().parent / "data" / "llada-8b-instruct" / "config.json")
                                     .read_text(encoding="utf-8"))
LLADA_AUTO_MAP: dict = REAL_LLADA_CONFIG["auto_map"]


def shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_hf_checkpoint(out_dir: str | Path, preset: Preset = HF_TINY, shards: int = 3) -> Path:
    """Write `preset` in the real layout into out_dir (new or empty) and return it."""
    if shards < 2:
        raise UserError(f"the hf-sharded layout has several shards, got shards={shards}")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} is not an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    block = hf_tokenizer.save(out, preset.tokenizer_learned)
    if max(block.values()) >= preset.vocab_size:
        raise UserError(f"{len(block)} added tokens after {preset.tokenizer_learned} learned ones "
                        f"don't fit {preset.vocab_size} embedding rows")
    ids = {"eos_token_id": block[EOS], "pad_token_id": block[EOS], "mask_token_id": block[MASK]}
    cfg = preset.config_dict(ids) | {"auto_map": LLADA_AUTO_MAP}
    del cfg["torch_dtype"]  # the real config.json has none: upstream passes torch_dtype at load
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", {"_from_model_config": True, "bos_token_id": block[BOS],
                                                 "eos_token_id": block[EOS],
                                                 "transformers_version": GENERATION_CONFIG_VERSION})

    shapes = dict(sorted(weight_shapes(preset).items()))
    dtype = torch.bfloat16
    sizes = {n: 2 * torch.Size(s).numel() for n, s in shapes.items()}
    weight_map: dict[str, str] = {}
    for k, group in enumerate(plan_shards(sizes, shards), start=1):
        name = shard_name(k, shards)
        save_file({n: init_weight(preset, n, shapes[n]).to(dtype) for n in group}, str(out / name),
                  metadata={"format": "pt"})
        os.chmod(out / name, 0o644)  # safetensors creates 0600; match the other files
        weight_map.update(dict.fromkeys(group, name))
    _write_json(out / INDEX_FILE, {"metadata": {"total_size": sum(sizes.values())},
                                   "weight_map": dict(sorted(weight_map.items()))})
    return out
