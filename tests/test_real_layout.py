"""LLaDA-8B-Instruct's real checkpoint files (tests/data/llada-8b-instruct/, provenance in its
README) against the engine: the model built on the meta device from the real config.json has
exactly the index's tensors, at the shapes the config implies, and the index's byte count; the
presets and the hf-sharded writer reproduce the real files' facts."""
from __future__ import annotations

import json
import math
import os
import struct
import sys
from pathlib import Path

import pytest

REAL = Path(__file__).resolve().parent / "data" / "llada-8b-instruct"
N_PARAMS = 8_015_581_184  # LLaDA-8B: the parameters config.json implies


def _json(name: str) -> dict:
    return json.loads((REAL / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def expected():
    from dllm_bench.checkpoints.layout import expected_shapes, load_config

    return expected_shapes(load_config(REAL))


def test_meta_model_has_exactly_the_indexed_tensors_at_the_configs_shapes(expected):
    index = _json("model.safetensors.index.json")
    assert set(expected) == set(index["weight_map"]) and len(expected) == 291
    d, f, v = 4096, 12288, 126464
    per_kind = {"attn_norm": (d,), "ff_norm": (d,), "q_proj": (d, d), "k_proj": (d, d), "v_proj": (d, d),
                "attn_out": (d, d), "ff_proj": (f, d), "up_proj": (f, d), "ff_out": (d, f)}
    for name, shape in expected.items():
        kind = name.split(".")[-2]
        if ".blocks." in name:
            assert shape == per_kind[kind], name
        else:
            assert shape == {"wte": (v, d), "ff_out": (v, d), "ln_f": (d,)}[kind], name
    n = sum(math.prod(s) for s in expected.values())
    assert n == N_PARAMS and round(n / 1e9, 2) == 8.02
    assert index["metadata"]["total_size"] == 2 * n  # bf16, not a byte more or less
    assert sorted(set(index["weight_map"].values())) == [f"model-0000{k}-of-00006.safetensors" for k in range(1, 7)]


# More than this on disk for a header-only file means the filesystem wrote the zeros out.
SPARSE_MAX_ALLOCATED = 2**20
PROBE_BYTES = 64 * 2**20


def _allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _skip_unless_sparse(path: Path) -> None:
    """16 GB of shards must never land on a disk whose filesystem has no sparse files (or
    allocates them eagerly): such a file is deleted at once and the test skipped."""
    allocated, apparent = _allocated_bytes(path), path.stat().st_size
    if allocated > SPARSE_MAX_ALLOCATED:
        path.unlink()
        pytest.skip(f"the filesystem of {path.parent} allocates sparse files ({allocated} bytes on disk for a "
                    f"header-only file of {apparent}); the real-size shards would take 16 GB")


def _sparse_file(path: Path, header: bytes, size: int) -> None:
    with path.open("wb") as fh:
        fh.write(header)
        fh.truncate(size)


def _header_only_shards(root: Path, shapes: dict[str, tuple[int, ...]], weight_map: dict[str, str]) -> None:
    """The real shards as sparse files: true safetensors headers (BF16, the real shard of each
    tensor) and the file sizes they imply, with no data written (16 GB apparent, ~0 on disk).
    A small probe goes first, so a filesystem that allocates what it is given costs 64 MiB of
    disk for a moment, not a 2.7 GB shard; the first shard is checked again all the same."""
    probe = root / "sparse-probe"
    _sparse_file(probe, b"probe", PROBE_BYTES)
    _skip_unless_sparse(probe)
    probe.unlink()
    by_file: dict[str, list[str]] = {}
    for name, f in weight_map.items():
        by_file.setdefault(f, []).append(name)
    for f, names in by_file.items():
        header, off = {}, 0
        for name in sorted(names):
            n = 2 * math.prod(shapes[name])
            header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [off, off + n]}
            off += n
        blob = json.dumps(header).encode()
        _sparse_file(root / f, struct.pack("<Q", len(blob)) + blob, 8 + len(blob) + off)
        _skip_unless_sparse(root / f)


def test_check_layout_passes_the_real_layout_from_headers_alone(tmp_path, expected):
    from dllm_bench.checkpoints.layout import check_layout

    for name in ("config.json", "model.safetensors.index.json"):
        (tmp_path / name).write_bytes((REAL / name).read_bytes())
    _header_only_shards(tmp_path, expected, _json("model.safetensors.index.json")["weight_map"])
    report = check_layout(tmp_path)
    assert report.ok, report.problems
    assert (report.n_tensors, report.n_params, report.shards) == (291, N_PARAMS, 6)
    assert report.total_bytes == _json("model.safetensors.index.json")["metadata"]["total_size"]
    assert report.dtypes == ["BF16"]


def test_presets_carry_the_real_config():
    """The LLaDA family's config.json template at LLaDA-8B's shape is the real file, but for the
    remote code it names (auto_map) and the storage dtype the presets record."""
    from dllm_bench.checkpoints.presets import get_preset

    real = _json("config.json")
    ids = {k: real[k] for k in ("eos_token_id", "pad_token_id", "mask_token_id")}
    assert ids == {"eos_token_id": 126081, "pad_token_id": 126081, "mask_token_id": 126336}
    gen = _json("generation_config.json")
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (126080, 126081)
    shape = get_preset("llada-8b").config_dict(ids)
    assert shape.pop("torch_dtype") == "bfloat16"
    assert shape | {"auto_map": real["auto_map"]} == real


def test_tokenizer_modules_carry_the_real_special_tokens_and_template():
    from dllm_bench.checkpoints.tokenizer import LLADA_SPECIAL_IDS
    from tests import hf_tokenizer

    real = _json("tokenizer_config.json")
    added = {int(i): t for i, t in real["added_tokens_decoder"].items()}
    assert {t: i for t, i in LLADA_SPECIAL_IDS.items()} == {
        added[i]["content"]: i for i in LLADA_SPECIAL_IDS.values()}
    first = min(added)
    assert {added[i]["content"]: i for i in added} == hf_tokenizer.block_tokens(first)
    assert len(added) == hf_tokenizer.BLOCK_SIZE and max(added) - first + 1 == len(added)
    assert hf_tokenizer.embedding_rows(first + len(added)) == _json("config.json")["embedding_size"]
    assert real["chat_template"] == hf_tokenizer.CHAT_TEMPLATE
    assert real["additional_special_tokens"] == hf_tokenizer.ADDITIONAL
    assert real["model_max_length"] == hf_tokenizer.HF_MAX_LENGTH


def test_header_only_shards_skip_and_leave_nothing_where_files_are_not_sparse(tmp_path, monkeypatch, expected):
    """A filesystem that writes the zeros out: the probe is deleted at once and the test skipped
    before any 2.7 GB shard is made."""
    monkeypatch.setattr(sys.modules[__name__], "_allocated_bytes", lambda path: path.stat().st_size)
    with pytest.raises(pytest.skip.Exception, match="allocates sparse files"):
        _header_only_shards(tmp_path, expected, _json("model.safetensors.index.json")["weight_map"])
    assert list(tmp_path.iterdir()) == []
