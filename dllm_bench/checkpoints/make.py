"""Write a preset as an HF-layout checkpoint of its family with seeded random weights.

Layout (docs/ARCHITECTURE.md "Checkpoints"): the family's config.json (LLaDA: every
LLaDA-8B-Instruct field), weights under the family's exact names (engine.models.hf_state_dict's
mapping) as `model.safetensors` or HF shards + index, and the offline tokenizer. Each tensor is drawn from its own generator seeded by (preset seed, tensor name), so
the values don't depend on the shard count or on the order tensors are written, and the same
preset always gives the same bytes. A preset with `draw_device="cuda"` (LLaDA-8B) is drawn on
the GPU (CUDA's generator: other bytes than a CPU's, the same on every CUDA machine).
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from dllm_bench.checkpoints.presets import STAMP_FILE, Preset, get_preset
from dllm_bench.checkpoints.tokenizer import save_tokenizer
from dllm_bench.errors import UserError
from engine.config import DTYPES
from engine.models import build_model

# The dtypes a checkpoint is stored in (engine.config.DTYPES minus float64: LLaDA ships bf16).
STORAGE_DTYPES = {k: v for k, v in DTYPES.items() if k != "float64"}
INDEX_FILE = "model.safetensors.index.json"
INIT_STD = 0.02  # LLaDA's init_std
# Files make_checkpoint owns: --force removes only these, never anything else in the directory.
OWNED_GLOBS = ("config.json", "model*.safetensors", INDEX_FILE, "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", STAMP_FILE)


def weight_shapes(preset: Preset) -> dict[str, tuple[int, ...]]:
    """The family's HF weight names -> shapes (nn.Linear is [out, in]), in checkpoint order: the
    engine's own module tree on the meta device, each name mapped by the family."""
    cfg = preset.model_config()
    with torch.device("meta"):
        state = build_model(cfg).state_dict()
    return {cfg.family.hf_name(k): tuple(v.shape) for k, v in state.items()}


def init_weight(preset: Preset, name: str, shape: tuple[int, ...],
                device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 init on `device`: RMSNorm weights 1, everything else (biases too, so a bias that
    is dropped or misplaced changes the output) N(0, 0.02) from a per-tensor generator."""
    if len(shape) == 1 and not name.endswith(".bias"):
        return torch.ones(shape, dtype=torch.float32, device=device)
    g = torch.Generator(device=device).manual_seed(preset.seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, INIT_STD, generator=g)


def draw_device(preset: Preset) -> torch.device:
    """Where the preset's weights are drawn; a CUDA-drawn preset on a machine without CUDA is
    bad input (8B values on a CPU: minutes and 32 GB of RAM)."""
    if preset.draw_device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"preset {preset.name!r} ({preset.n_params / 1e9:.1f}B parameters) draws its random weights "
                        f"on a CUDA device, and there is none here; on a CPU make a small preset (e.g. tiny)")
    return torch.device(preset.draw_device)


def to_dtype(dtype: str | torch.dtype | None, preset: Preset) -> tuple[str, torch.dtype]:
    if dtype is None:
        dtype = preset.dtype
    if isinstance(dtype, torch.dtype):
        names = {v: k for k, v in STORAGE_DTYPES.items()}
        if dtype not in names:
            raise UserError(f"unsupported dtype {dtype}; use one of {', '.join(STORAGE_DTYPES)}")
        return names[dtype], dtype
    if dtype not in STORAGE_DTYPES:
        raise UserError(f"unsupported dtype {dtype!r}; use one of {', '.join(STORAGE_DTYPES)}")
    return dtype, STORAGE_DTYPES[dtype]


def plan_shards(sizes: dict[str, int], shards: int) -> list[list[str]]:
    """Split tensors (kept in order) into `shards` non-empty groups of roughly equal bytes."""
    names = list(sizes)
    if shards > len(names):
        raise UserError(f"--shards {shards} is more than the {len(names)} tensors of the model")
    target = sum(sizes.values()) / shards
    groups: list[list[str]] = [[]]
    acc = 0
    for idx, name in enumerate(names):
        to_open = shards - len(groups)
        if groups[-1] and to_open > 0 and (acc >= target or len(names) - idx <= to_open):
            groups.append([])
            acc = 0
        groups[-1].append(name)
        acc += sizes[name]
    assert len(groups) == shards and all(groups)
    return groups


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _clear_owned(out: Path) -> None:
    for pattern in OWNED_GLOBS:
        for f in out.glob(pattern):
            if f.is_file():
                f.unlink()


def make_checkpoint(preset: Preset | str, out_dir: str | Path, shards: int | None = None,
                    dtype: str | torch.dtype | None = None, force: bool = False) -> Path:
    """Write the checkpoint into out_dir and return it. dtype None = the preset's storage dtype,
    shards None = the preset's shard count.

    A non-empty out_dir needs force=True, which removes only the files this function writes."""
    if isinstance(preset, str):
        preset = get_preset(preset)
    if not preset.makeable or preset.asset:  # shape-only, or a committed (trained) checkpoint
        raise UserError(f"preset {preset.name!r} can't be made ({preset.note or 'committed checkpoint'})")
    shards = preset.shards if shards is None else shards
    if not isinstance(shards, int) or shards < 1:
        raise UserError(f"--shards must be >= 1, got {shards}")
    device = draw_device(preset)
    dtype_name, torch_dtype = to_dtype(dtype, preset)
    shapes = weight_shapes(preset)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    sizes = {n: itemsize * _numel(s) for n, s in shapes.items()}
    groups = plan_shards(sizes, shards)  # refuses more shards than tensors: before anything is made
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise UserError(f"--out {out} is not empty (use --force to overwrite)")
        _clear_owned(out)
    out.mkdir(parents=True, exist_ok=True)

    ids = save_tokenizer(out, preset.vocab_size, preset.tokenizer_learned, preset.max_sequence_length,
                         preset.model_type)
    cfg = preset.config_dict(ids.config_fields())
    cfg["torch_dtype"] = dtype_name
    _write_json(out / "config.json", cfg)

    weight_map: dict[str, str] = {}
    for k, group in enumerate(groups, start=1):
        fname = "model.safetensors" if shards == 1 else f"model-{k:05d}-of-{shards:05d}.safetensors"
        # One shard in memory at a time: the 126k presets' embedding alone is 130 MB in fp32.
        tensors = {n: init_weight(preset, n, shapes[n], device).to(torch_dtype).cpu() for n in group}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        os.chmod(out / fname, 0o644)  # safetensors creates 0600; match the other files
        del tensors
        weight_map.update({n: fname for n in group})
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the caller (a serve parent, say) keeps no drawn blocks
    if shards > 1:
        _write_json(out / INDEX_FILE, {"metadata": {"total_size": sum(sizes.values())},
                                       "weight_map": weight_map})
    # Written last: its presence marks a complete checkpoint of exactly this preset.
    _write_json(out / STAMP_FILE, {**preset.fingerprint(), "shards": shards, "dtype": dtype_name})
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
