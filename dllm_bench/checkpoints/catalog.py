"""`dllm-bench models list|make`: the embedded checkpoint presets as a table (shape, size, made or
not and where), and making one (into the cache, or a directory the command has checked)."""
from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from dllm_bench.checkpoints.layout import load_config
from dllm_bench.checkpoints.make import make_checkpoint
from dllm_bench.checkpoints.presets import PRESETS, Preset, get_preset
from dllm_bench.checkpoints.store import is_made, make_cached, preset_path
from dllm_bench.console import console
from dllm_bench.errors import UserError
from engine.config import DTYPES
from engine.models import family_of


def human(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G"):
        if n < 1000:
            return f"{n:.3g}{suffix}{unit}"
        n /= 1000
    return f"{n:.3g}T{unit}"


def status(p: Preset) -> str:
    path = preset_path(p)
    if path is None:
        return "shape only"
    if p.asset:
        return str(path) if (path / "config.json").is_file() else f"missing asset {path}"
    return str(path) if is_made(p, path) else "not made"


def list_presets() -> None:
    table = Table(title="model presets (each in its family's HF layout)")
    for col in ("name", "family", "vocab", "d_model", "layers", "heads", "kv heads", "head dim", "mlp",
                "params", "weights", "made? / path"):
        left = col in ("name", "family", "made? / path")
        table.add_column(col, justify="left" if left else "right", no_wrap=col != "made? / path",
                         overflow="fold")
    for p in PRESETS.values():
        disk = p.n_params * DTYPES[p.dtype].itemsize
        table.add_row(p.name, family_of(p.model_type).name, str(p.vocab_size), str(p.d_model), str(p.n_layers), str(p.n_heads),
                      str(p.n_kv_heads), str(p.head_dim), str(p.mlp_hidden_size), human(p.n_params),
                      f"{human(disk, 'B')} {p.dtype}", status(p))
    console(stderr=False, width=200).print(table)  # piped: paths are not squeezed into 80 columns


def makeable(name: str, shards: int | None) -> Preset:
    """The preset `models make` may write, checked before its --out is."""
    preset = get_preset(name)
    if shards is not None and shards < 1:
        raise UserError(f"--shards must be >= 1, got {shards}")
    if not preset.makeable or preset.asset:
        raise UserError(f"preset {name!r} can't be made ({preset.note or 'packaged checkpoint'})")
    return preset


def make(preset: Preset, out: Path | None, shards: int | None, force: bool) -> str:
    """Make `preset` into `out` (checked writable), or into the cache when None; the line that
    says where, how large, and its special token ids."""
    path = make_cached(preset, shards=shards, force=force) if out is None else \
        make_checkpoint(preset, out, shards=shards, force=force)
    cfg = json.loads((path / "config.json").read_text())
    shape = load_config(path)  # the family reads its own keys
    ids = {k: getattr(shape, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id")}
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return (f"{preset.name}: {path} ({human(size, 'B')}, {cfg['torch_dtype']}); "
            + ", ".join(f"{k}={v}" for k, v in ids.items()))
