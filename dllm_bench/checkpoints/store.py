"""Where model presets live and how `--model` becomes a checkpoint directory: the cache
(`$DLLM_BENCH_CACHE/models/<name>`, default `~/.cache/dllm-bench/models/<name>`), checkpoints
committed inside the package (`asset=` presets), making a preset on first use (make_cached), and
resolve_model (a path or a preset name).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from dllm_bench.checkpoints.make import draw_device, make_checkpoint
from dllm_bench.checkpoints.presets import STAMP_FILE, Preset, get_preset
from dllm_bench.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # dllm_bench/: assets live there


def cache_root() -> Path:
    base = os.environ.get("DLLM_BENCH_CACHE") or Path.home() / ".cache" / "dllm-bench"
    return Path(base).expanduser() / "models"


def asset_dir(preset: Preset) -> Path | None:
    return PACKAGE_DIR / preset.asset if preset.asset else None


def read_stamp(path: Path) -> dict | None:
    try:
        return json.loads((path / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_made(preset: Preset, path: Path) -> bool:
    """A made checkpoint for exactly this preset (any shard count) lives at path."""
    stamp = read_stamp(path)
    return stamp is not None and {k: stamp.get(k) for k in ("format", "preset")} == preset.fingerprint()


def preset_path(preset: Preset) -> Path | None:
    """Where the preset's checkpoint is (or will be made); None if it can't exist."""
    if preset.asset:
        return asset_dir(preset)
    return cache_root() / preset.name if preset.makeable else None


def make_cached(preset: Preset, shards: int | None = None, force: bool = False) -> Path:
    """Make the preset into the cache atomically (temp dir + rename) unless already there
    (shards None: the preset's own count)."""
    if not preset.makeable or preset.asset:
        raise UserError(f"preset {preset.name!r} can't be made: {preset.note or 'committed asset'}")
    final = cache_root() / preset.name
    if not force and is_made(preset, final):
        return final
    draw_device(preset)  # a GPU-drawn preset without a GPU: one error line, nothing made
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{preset.name}.tmp-", dir=final.parent))
    try:
        make_checkpoint(preset, tmp, shards=shards, force=True)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if final.exists() and not force and is_made(preset, final):
            return final  # a concurrent maker finished first; its bytes equal ours
        if final.exists():  # stale (older preset/format) or forced: move aside, then swap in
            old = Path(tempfile.mkdtemp(prefix=f".{preset.name}.old-", dir=final.parent))
            try:
                os.rename(final, old / "ckpt")
            except FileNotFoundError:
                pass  # a concurrent maker moved it first
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process renamed its (byte-identical) copy in first: use that one.
            if not is_made(preset, final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_model(name_or_dir: str | os.PathLike) -> Path:
    """A checkpoint directory for a path or a preset name (made on first use)."""
    raw = str(name_or_dir)
    path = Path(raw).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"{raw} is not a checkpoint directory (no config.json)")
        return path
    if os.sep in raw or "/" in raw or raw.startswith((".", "~")):
        raise UserError(f"no such checkpoint directory: {raw}")
    preset = get_preset(raw)
    if preset.asset:
        d = asset_dir(preset)
        if not (d / "config.json").is_file():
            raise UserError(f"preset {raw!r}: packaged checkpoint {d} is missing")
        return d
    if not preset.makeable:
        raise UserError(f"preset {raw!r} describes a shape only ({preset.note}); it can't be loaded")
    return make_cached(preset)

