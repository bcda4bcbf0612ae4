"""Load a model (preset name or checkpoint directory) and its tokenizer for the CLI, turning
every way a checkpoint can be bad into one UserError line.

`load_config` lives in dllm_bench.checkpoints.layout and is re-exported here for the commands.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from dllm_bench.checkpoints.layout import check_layout, load_config
from dllm_bench.checkpoints.presets import get_preset
from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.device_defaults import resolve_device
from dllm_bench.errors import UserError
from engine.config import DTYPES
from engine.models import DenseLM, ModelConfig
from engine.models import load_model as load_checkpoint


def model_dir(name_or_dir: str) -> Path:
    """The checkpoint directory of a preset name or path, its config and weights verified
    (headers only: `layout.check_layout`); the first problem found is the error."""
    path = resolve_model(name_or_dir)
    load_config(path)  # its own messages for a bad config.json
    report = check_layout(path)
    if not report.ok:
        raise UserError(f"bad checkpoint {path}: {report.problems[0]}")
    return path


def load_shape(name_or_dir: str) -> ModelConfig:
    """The config of a checkpoint directory or of any preset, for byte counts: no weights are
    read, no preset is made, and shape-only presets (`llada-8b`) are included."""
    raw = str(name_or_dir)
    if Path(raw).expanduser().is_dir() or os.sep in raw or "/" in raw or raw.startswith((".", "~")):
        return load_config(resolve_model(raw))
    preset = get_preset(raw)
    if preset.asset:
        return load_config(resolve_model(raw))
    return preset.model_config()


def load_model(name_or_dir: str, dtype: str = "float32", device: str = "auto") -> DenseLM:
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    path = model_dir(name_or_dir)
    dev = parse_device(device)
    try:
        return load_checkpoint(path, DTYPES[dtype], dev)
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
            # trust_remote_code=False: a real LLaDA config.json has an auto_map naming the checkpoint's
            # own Python files, and transformers then asks on the terminal whether to run them (and
            # runs them on "y") although the tokenizer needs none of that code.
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
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
