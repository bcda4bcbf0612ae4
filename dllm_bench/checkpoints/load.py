"""Load a model (preset name or checkpoint directory) and its tokenizer for the CLI, turning
every way a checkpoint can be bad into one UserError line."""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import torch

from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.errors import UserError
from engine.config import DTYPES
from engine.engine import resolve_device
from engine.models.llada import LLaDAConfig, LLaDAModelLM, load_llada

# config.json fields the model's shapes come from: (name, optional). Checked before
# LLaDAConfig sees them, so a mistyped value is one line rather than an error deep in torch.
_SHAPE_FIELDS = (("d_model", False), ("n_heads", False), ("n_kv_heads", True), ("n_layers", False),
                 ("mlp_hidden_size", False), ("vocab_size", False), ("embedding_size", True),
                 ("max_sequence_length", False))


def model_dir(name_or_dir: str) -> Path:
    """The checkpoint directory of a preset name or path, its config and weights verified."""
    path = resolve_model(name_or_dir)
    verify_weights(path, load_config(path))
    return path


def load_config(path: Path) -> LLaDAConfig:
    bad = f"bad checkpoint {path}: config.json"
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is not a checkpoint directory (no config.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{bad} is not readable JSON ({e})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{bad} is not a JSON object")
    for name, optional in _SHAPE_FIELDS:
        v = raw.get(name)
        if (v is None and optional) or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            continue
        raise UserError(f"{bad}: '{name}' must be a positive integer, got {v!r}")
    theta = raw.get("rope_theta", 1.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not (theta > 0 and math.isfinite(theta)):
        raise UserError(f"{bad}: 'rope_theta' must be a positive number, got {theta!r}")
    try:
        return LLaDAConfig.from_dict(raw)
    except (TypeError, ValueError) as e:
        raise UserError(f"{bad}: {e}") from None


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"bad checkpoint {path}: {index.name} is not a safetensors index ({e})") from None
        missing = [f for f in files if not (path / str(f)).is_file()]
        if missing:
            raise UserError(f"bad checkpoint {path}: shard {missing[0]} listed in {index.name} is missing")
        return [path / str(f) for f in files]
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    raise UserError(f"bad checkpoint {path}: no model.safetensors or model.safetensors.index.json")


def verify_weights(path: Path, cfg: LLaDAConfig) -> None:
    """The safetensors headers name exactly the tensors `LLaDAModelLM(cfg)` has, with its shapes.
    Reads headers only (no tensor data), so a wrong checkpoint fails before any run starts."""
    from safetensors import SafetensorError, safe_open

    with torch.device("meta"):  # shapes without allocating weights
        expected = {k: tuple(v.shape) for k, v in LLaDAModelLM(cfg).state_dict().items()}
    found: dict[str, tuple[int, ...]] = {}
    for f in _weight_files(path):
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    found[k] = tuple(st.get_slice(k).get_shape())
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"bad checkpoint {path}: corrupt safetensors file {f.name} ({e})") from None
    missing = sorted(set(expected) - set(found))
    if missing:
        raise UserError(f"bad checkpoint {path}: {len(missing)} tensor(s) missing, e.g. {missing[0]}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise UserError(f"bad checkpoint {path}: {len(extra)} tensor(s) config.json does not describe, "
                        f"e.g. {extra[0]}")
    for k, shape in expected.items():
        if found[k] != shape:
            raise UserError(f"bad checkpoint {path}: tensor {k} has shape {found[k]}, config.json implies {shape}")


def load_model(name_or_dir: str, dtype: str = "float32", device: str = "auto") -> LLaDAModelLM:
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    path = model_dir(name_or_dir)
    dev = parse_device(device)
    try:
        return load_llada(path, DTYPES[dtype], dev)
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"cannot load checkpoint {path}: {e}") from None


def parse_device(device: str) -> torch.device:
    """`auto` (CUDA when present), `cpu`, `cuda` or `cuda:N`."""
    try:
        dev = resolve_device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: CUDA is not available here (use --device cpu)")
    return dev


def has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()


def load_tokenizer(path: Path):
    """The checkpoint's own tokenizer via AutoTokenizer, offline; None when it has none."""
    if not has_tokenizer(path):
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # Imported here, after the offline switches above (read at import), and because transformers
    # costs about a second to import that commands without text prompts never pay.
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "model of type llada" chatter: the config is ours, not HF's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return AutoTokenizer.from_pretrained(str(path))
        except Exception as e:  # noqa: BLE001 - the Rust `tokenizers` parser raises bare Exception
            raise UserError(f"cannot load the tokenizer in {path}: {e}") from None


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def parse_ids(spec: str) -> list[int]:
    try:
        ids = [int(t) for t in spec.replace(" ", "").split(",") if t]
    except ValueError:
        raise UserError(f"--prompt-ids takes comma-separated integers, got {spec!r}") from None
    if not ids:
        raise UserError("empty prompt (--prompt-ids with no ids)")
    return ids
