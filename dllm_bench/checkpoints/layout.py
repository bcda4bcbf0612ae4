"""Does a checkpoint directory hold the model its config.json describes? Checked from the
files' headers alone, for any family: config.json (read by its family, named by `model_type`),
the safetensors index and every shard's JSON header (names, dtypes, shapes, byte ranges) against
`build_model(config)` built on the meta device, its names mapped by the family. No tensor
data is read, so an 8B checkpoint is checked in well under a second and a truncated download or
a mis-assembled shard set is found before anything is loaded.

`check_layout` collects every problem (for `doctor`); `load.model_dir` turns the first one into a
UserError for the commands that take `--model`.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dllm_bench.errors import UserError
from engine.models import Family, ModelConfig, build_model, config_from_dict, family_of

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Bytes per element of the safetensors dtypes a checkpoint can hold; LLaDA's are all BF16.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}  # what the loader can cast to the run dtype faithfully
MAX_HEADER = 100_000_000  # the safetensors format's own bound on its JSON header
MAX_LISTED = 5  # per kind of problem, so a wholly wrong checkpoint is a few lines, not hundreds

# ModelConfig fields the model's shapes come from: (field, optional). Each family names them in
# its own config.json (`family_keys`); they are checked there before the family reads them, so a
# mistyped value is one line naming the family's key rather than an error deep in torch.
SHAPE_FIELDS = (("d_model", False), ("n_heads", False), ("n_kv_heads", True), ("n_layers", False),
                ("mlp_hidden_size", False), ("vocab_size", False), ("embedding_size", True),
                ("max_sequence_length", True))
ID_FIELDS = ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id")


def family_keys(family: Family) -> dict[str, str]:
    """ModelConfig field -> the family's config.json key, found by writing a config of distinct
    values through the family's own `to_hf` (fields its config.json does not carry are absent)."""
    probe = {f: 1_000_003 + i for i, f in enumerate(ModelConfig.__dataclass_fields__) if f in _INT_FIELDS}
    hf = family.to_hf(ModelConfig(**probe, model_type=family.model_type))
    by_value = {v: k for k, v in hf.items() if isinstance(v, int) and not isinstance(v, bool)}
    return {f: by_value[v] for f, v in probe.items() if v in by_value}


_INT_FIELDS = {f for f, _ in SHAPE_FIELDS} | set(ID_FIELDS)


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


@dataclass
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    file: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class LayoutReport:
    ok: bool
    problems: list[str]
    n_tensors: int  # tensors found in the weight files
    n_params: int  # their elements
    shards: int  # weight files (1 for a single model.safetensors)
    total_bytes: int = 0  # tensor data bytes, as the index's metadata.total_size counts them
    dtypes: list[str] = field(default_factory=list)  # safetensors dtypes present, e.g. ["BF16"]


def load_config(path: Path) -> ModelConfig:
    """config.json as a ModelConfig of its family; any way it is bad -> one UserError line."""
    bad = f"bad checkpoint {path}: config.json"
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is not a checkpoint directory (no config.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{bad} is not readable JSON ({e})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{bad} is not a JSON object")
    try:
        family = family_of(raw.get("model_type"))
    except ValueError as e:
        raise UserError(f"{bad}: {e}") from None
    keys = family_keys(family)
    for name, optional in SHAPE_FIELDS:
        key = keys.get(name)
        if key is None:
            continue  # the family derives it (Dream: embedding rows = vocab_size)
        v = raw.get(key)
        if (v is None and optional) or _positive_int(v):
            continue
        raise UserError(f"{bad}: '{key}' must be a positive integer, got {v!r}")
    for name in ID_FIELDS:
        v = raw.get(keys.get(name, name))
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise UserError(f"{bad}: '{keys.get(name, name)}' must be a token id (an integer >= 0), got {v!r}")
    theta = raw.get(keys.get("rope_theta", "rope_theta"), 1.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not (theta > 0 and math.isfinite(theta)):
        raise UserError(f"{bad}: 'rope_theta' must be a positive number, got {theta!r}")
    try:
        cfg = config_from_dict(raw)
    except (TypeError, ValueError) as e:
        raise UserError(f"{bad}: {e}") from None
    rows = cfg.padded_vocab
    for name in ID_FIELDS:
        v = getattr(cfg, name)
        if v is not None and v >= rows:
            raise UserError(f"{bad}: '{keys.get(name, name)}' {v} is outside the {rows}-row embedding")
    return cfg


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight name of the model `cfg` describes, as its family names it in a checkpoint ->
    its shape, from the engine's own module tree on the meta device (nothing allocated), so this
    can never drift from what loads."""
    with torch.device("meta"):
        state = build_model(cfg).state_dict()
    return {cfg.family.hf_name(k): tuple(v.shape) for k, v in state.items()}


def read_header(file: Path) -> dict[str, TensorInfo]:
    """A safetensors file's tensors from its header only (8-byte length + JSON); ValueError
    says how the file is corrupt, including data a truncated download no longer holds."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, shorter than a header")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER, size - 8):
            raise ValueError(f"header length {n} does not fit the {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    out: dict[str, TensorInfo] = {}
    data_end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            ok = (dtype in DTYPE_BYTES and all(isinstance(s, int) and s >= 0 for s in shape)
                  and isinstance(start, int) and isinstance(end, int) and 0 <= start <= end)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"bad header entry for {name}: {entry!r}"[:200])
        if end - start != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise ValueError(f"{name}: {end - start} data bytes for {dtype} {list(shape)}")
        out[name] = TensorInfo(dtype, shape, file.name)
        data_end = max(data_end, end)
    if 8 + n + data_end > size:
        raise ValueError(f"truncated: the header needs {8 + n + data_end} bytes, the file has {size}")
    return out


def _read_index(path: Path, problems: list[str]) -> tuple[dict[str, str], int | None] | None:
    """The index's weight_map and metadata.total_size; None (and a problem) if unusable."""
    try:
        index = json.loads((path / INDEX_FILE).read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map must map tensor names to file names")
        if not weight_map:
            raise ValueError("its weight_map is empty")
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        problems.append(f"{INDEX_FILE} is not a safetensors index ({e})")
        return None
    meta = index.get("metadata")
    total = meta.get("total_size") if isinstance(meta, dict) else None
    return weight_map, total if isinstance(total, int) and not isinstance(total, bool) else None


def _examples(names: list[str]) -> str:
    return ", ".join(names[:MAX_LISTED]) + (f" (+{len(names) - MAX_LISTED} more)" if len(names) > MAX_LISTED else "")


def _check_index(weight_map: dict[str, str], total: int | None, found: dict[str, TensorInfo],
                 read: set[str], problems: list[str]) -> None:
    """Index vs what the shards hold: every tensor where the index says, nothing unlisted."""
    misplaced = sorted(k for k, f in weight_map.items() if f in read and k in found and found[k].file != f)
    absent = sorted(k for k, f in weight_map.items() if f in read and k not in found)
    unlisted = sorted(k for k in found if k not in weight_map)
    if misplaced:
        k = misplaced[0]
        problems.append(f"{INDEX_FILE} puts {len(misplaced)} tensor(s) in the wrong shard, e.g. {k} "
                        f"in {weight_map[k]} (it is in {found[k].file})")
    if absent:
        problems.append(f"{len(absent)} tensor(s) listed in {INDEX_FILE} are in no shard: {_examples(absent)}")
    if unlisted:
        problems.append(f"{len(unlisted)} tensor(s) in the shards are not in {INDEX_FILE}: {_examples(unlisted)}")
    data = sum(t.numel * DTYPE_BYTES[t.dtype] for t in found.values())
    if total is not None and total != data:
        problems.append(f"{INDEX_FILE} metadata.total_size is {total}, the shards hold {data} bytes of tensors")


def _check_model(expected: dict[str, tuple[int, ...]], found: dict[str, TensorInfo], problems: list[str]) -> None:
    missing = sorted(set(expected) - set(found))
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing, e.g. {_examples(missing)}")
    extra = sorted(set(found) - set(expected))
    if extra:
        problems.append(f"{len(extra)} tensor(s) config.json does not describe, e.g. {_examples(extra)}")
    wrong = [k for k, shape in expected.items() if k in found and found[k].shape != shape]
    for k in wrong[:MAX_LISTED]:
        problems.append(f"tensor {k} has shape {found[k].shape}, config.json implies {expected[k]}")
    if len(wrong) > MAX_LISTED:
        problems.append(f"... and {len(wrong) - MAX_LISTED} more tensor(s) with a shape config.json does not imply")
    odd = sorted(k for k, t in found.items() if t.dtype not in FLOAT_DTYPES)
    if odd:
        problems.append(f"{len(odd)} tensor(s) not stored as floating point (quantized?), e.g. {odd[0]} "
                        f"as {found[odd[0]].dtype}")


def check_layout(model_dir: str | Path) -> LayoutReport:
    """Check config.json, the index (or a single model.safetensors) and every shard's header
    against the meta-device model config.json describes; reads no tensor data, never raises
    for a bad checkpoint (every problem is a line of the report)."""
    path = Path(model_dir)
    problems: list[str] = []
    expected = None
    try:
        expected = expected_shapes(load_config(path))
    except UserError as e:
        problems.append(str(e).replace(f"bad checkpoint {path}: ", ""))

    files: list[str] = []  # weight files the checkpoint names (the index's shards, or the single file)
    index = None
    if (path / INDEX_FILE).is_file():
        index = _read_index(path, problems)
        files = sorted(set(index[0].values())) if index is not None else []
    elif (path / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    elif path.is_dir():
        problems.append(f"no {SINGLE_FILE} or {INDEX_FILE}")

    found: dict[str, TensorInfo] = {}
    read: set[str] = set()
    for f in files:
        if Path(f).name != f:  # a file name, not a path out of the directory
            problems.append(f"{INDEX_FILE} names {f!r}, which is not a file name in the checkpoint")
            continue
        if not (path / f).is_file():
            problems.append(f"shard {f} listed in {INDEX_FILE} is missing")
            continue
        try:
            tensors = read_header(path / f)
        except (OSError, ValueError) as e:
            problems.append(f"corrupt safetensors file {f} ({e})")
            continue
        read.add(f)
        for k in sorted(set(tensors) & set(found)):
            problems.append(f"tensor {k} is in both {found[k].file} and {f}")
        found.update(tensors)
    complete = bool(files) and len(read) == len(files)  # else "missing" would only echo the shard problem
    if index is not None and complete:
        _check_index(*index, found, read, problems)
    if expected is not None and complete:
        _check_model(expected, found, problems)
    return LayoutReport(
        ok=not problems, problems=problems, n_tensors=len(found),
        n_params=sum(t.numel for t in found.values()), shards=len(files),
        total_bytes=sum(t.numel * DTYPE_BYTES[t.dtype] for t in found.values()),
        dtypes=sorted({t.dtype for t in found.values()}),
    )
