"""Embedded checkpoints: presets, the offline tokenizer, make_checkpoint, `dllm-bench models`."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from dllm_bench.checkpoints import tokenizer as tb
from dllm_bench.checkpoints.make import INDEX_FILE, make_checkpoint, weight_shapes
from dllm_bench.checkpoints.presets import PRESETS, STAMP_FILE, get_preset
from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.errors import UserError
from engine.models import config_from_pretrained
from tests.hf_layout import REAL_LLADA_CONFIG

REPO = Path(__file__).resolve().parents[1]


def dir_hashes(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


def read_weights(d: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            out.update({k: sf.get_tensor(k) for k in sf.keys()})
    return out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_checkpoint("tiny", tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DLLM_BENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


# ------------------------------------------------------------------ presets / checkpoint layout
def test_preset_table_shapes():
    tiny = PRESETS["tiny"]
    assert tiny.n_kv_heads < tiny.n_heads  # GQA is exercised by the tests' preset
    for name in ("mini-126k", "serve-126k", "llada-8b"):
        assert PRESETS[name].vocab_size == tb.LLADA_VOCAB_SIZE and PRESETS[name].head_dim == 128
    # The parameter formula reproduces LLaDA-8B-Instruct's real count (its safetensors index on the
    # Hugging Face Hub, GSAI-ML/LLaDA-8B-Instruct).
    assert PRESETS["llada-8b"].n_params == 8_015_581_184
    big = PRESETS["llada-8b"]
    assert big.makeable and (big.draw_device, big.shards, big.dtype) == ("cuda", 6, "bfloat16")


def test_tiny_bytes_are_deterministic(tiny_dir, tmp_path):
    again = make_checkpoint("tiny", tmp_path / "again")
    assert dir_hashes(again) == dir_hashes(tiny_dir)
    # Another process, with other hash seeds (Python's and the Rust BPE trainer's), must train
    # the same tokenizer; the weights come from torch.Generator, which has no such state.
    code = "import sys; from dllm_bench.checkpoints.tokenizer import save_tokenizer; save_tokenizer(sys.argv[1], 512, 500)"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "proc")], check=True, env=env)
    theirs, ours = dir_hashes(tmp_path / "proc"), dir_hashes(tiny_dir)
    assert theirs == {k: ours[k] for k in ("tokenizer.json", "tokenizer_config.json")}


def test_config_has_llada_fields(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert set(REAL_LLADA_CONFIG) - {"auto_map"} <= set(cfg)      # the real file's keys but its remote code
    p = get_preset("tiny")
    assert (cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"]) == (64, 2, 4, 2)
    assert cfg["vocab_size"] == cfg["embedding_size"] == p.vocab_size
    assert cfg["model_type"] == "llada" and cfg["architectures"] == ["LLaDAModelLM"]
    assert cfg["rope_theta"] == 500000.0 and cfg["rms_norm_eps"] == 1e-5 and not cfg["weight_tying"]
    ids = tb.special_token_ids(p.vocab_size)
    assert cfg["bos_token_id"] == ids[tb.BOS]
    assert cfg["eos_token_id"] == cfg["pad_token_id"] == ids[tb.EOS]
    assert cfg["mask_token_id"] == ids[tb.MASK] != cfg["pad_token_id"]
    # Small vocab: the special tokens occupy the last ids.
    assert sorted(ids.values()) == list(range(p.vocab_size - len(ids), p.vocab_size))


def test_weight_names_and_shapes(tiny_dir):
    w = read_weights(tiny_dir)
    p = get_preset("tiny")
    assert {k: tuple(v.shape) for k, v in w.items()} == weight_shapes(p)
    assert w["model.transformer.blocks.1.k_proj.weight"].shape == (p.n_kv_heads * p.head_dim, p.d_model)
    assert w["model.transformer.blocks.0.ff_out.weight"].shape == (p.d_model, p.mlp_hidden_size)
    assert w["model.transformer.ff_out.weight"].shape == (p.vocab_size, p.d_model)
    assert all(v.dtype == torch.float32 for v in w.values())
    assert torch.equal(w["model.transformer.ln_f.weight"], torch.ones(p.d_model))
    assert abs(w["model.transformer.wte.weight"].std().item() - 0.02) < 2e-3
    assert not torch.equal(w["model.transformer.wte.weight"], w["model.transformer.ff_out.weight"])


def test_sharded_index_is_consistent(tiny_dir, tmp_path):
    d = make_checkpoint("tiny", tmp_path / "sharded", shards=3)
    index = json.loads((d / INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert sorted(f.name for f in d.glob("*.safetensors")) == files
    for f in files:
        with safe_open(str(d / f), "pt") as sf:
            assert set(sf.keys()) == {k for k, v in index["weight_map"].items() if v == f}
    w, ref = read_weights(d), read_weights(tiny_dir)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in w.values())
    assert w.keys() == ref.keys() and all(torch.equal(w[k], ref[k]) for k in ref)


def test_engine_loads_made_checkpoints(tiny_dir, tmp_path):
    from engine.models import load_model

    cfg = config_from_pretrained(tiny_dir)
    assert (cfg.head_dim, cfg.kv_heads, cfg.mask_token_id) == (16, 2, tb.special_token_ids(512)[tb.MASK])
    sharded = make_checkpoint("tiny", tmp_path / "s2", shards=2)
    single = load_model(tiny_dir)
    ids = torch.tensor([[1, 2, 3, cfg.mask_token_id]])
    a, b = single(ids), load_model(sharded)(ids)
    assert a.shape == (1, 4, 512) and torch.equal(a, b)


# ------------------------------------------------------------------ tokenizer
@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    return tb.build_tokenizer(512, 500)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=80))
def test_tokenizer_round_trips_any_text(text):
    tok = tiny_tokenizer()
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_digits_are_split_one_by_one():
    tok = tiny_tokenizer()
    pieces = tok.encode("12345 + 678").tokens
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("12345678")


def _load_auto(d: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(d), local_files_only=True)


def test_autotokenizer_offline_and_chat_template(tiny_dir):
    tok = _load_auto(tiny_dir)
    ids = tb.special_token_ids(512)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (
        ids[tb.BOS], ids[tb.EOS], ids[tb.EOS], ids[tb.MASK])
    assert len(tok) == 512
    msgs = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "What is 2+3?\n"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == ("<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    enc = tok(text, add_special_tokens=False)["input_ids"]  # LLaDA tokenizes the template text
    assert enc[0] == ids[tb.BOS] and enc.count(ids[tb.BOS]) == 1
    assert enc.count(ids[tb.EOT]) == 2 and enc[-3] == ids[tb.END_HEADER]
    assert tok.decode(enc) == text
    assert tok.decode(enc, skip_special_tokens=True) == "system\n\nBe brief.user\n\nWhat is 2+3?assistant\n\n"
    left = tok(["hi", "a longer prompt"], padding=True, add_special_tokens=False)["input_ids"]
    assert left[0][0] == ids[tb.EOS]  # left padding with pad = EOS, as upstream generation


def test_llada_vocab_tokenizer_uses_llada_ids(tmp_path):
    special = tb.save_tokenizer(tmp_path, tb.LLADA_VOCAB_SIZE, 4096)
    real = tb.LLADA_SPECIAL_IDS
    assert special.config_fields() == {"bos_token_id": real[tb.BOS], "eos_token_id": real[tb.EOS],
                                       "pad_token_id": real[tb.EOS], "mask_token_id": real[tb.MASK]}
    assert special.tokens == real
    tok = _load_auto(tmp_path)
    assert len(tok) == tb.LLADA_VOCAB_SIZE
    assert {t: tok.convert_tokens_to_ids(t) for t in real} == real
    text = "Tom has 23 apples.<|mdm_mask|><|mdm_mask|><|eot_id|>"
    enc = tok(text, add_special_tokens=False)["input_ids"]
    assert enc[-3:] == [real[tb.MASK], real[tb.MASK], real[tb.EOT]]
    assert max(enc[:-3]) < min(real.values()) and tok.decode(enc) == text


# ------------------------------------------------------------------ resolve_model / cache
def test_resolve_model_makes_once_into_cache(cache, tiny_dir):
    d = resolve_model("tiny")
    assert d == cache / "tiny" and dir_hashes(d) == dir_hashes(tiny_dir)
    mtime = (d / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny") == d and (d / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temp dirs left
    # A stamp from another preset version means a stale cache: it is made again.
    stamp = json.loads((d / STAMP_FILE).read_text())
    stamp["format"] = -1
    (d / STAMP_FILE).write_text(json.dumps(stamp))
    assert dir_hashes(resolve_model("tiny")) == dir_hashes(tiny_dir)


def test_resolve_model_paths_and_errors(cache, tiny_dir, tmp_path):
    assert resolve_model(str(tiny_dir)) == tiny_dir
    with pytest.raises(UserError, match="tiny, mini-126k"):
        resolve_model("nope")
    with pytest.raises(UserError, match="no such checkpoint directory"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(UserError, match="no config.json"):
        resolve_model(str(tmp_path))
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="draws its random weights on a CUDA device"):
            resolve_model("llada-8b")
    assert not cache.exists()  # nothing was made


def test_preset_can_point_at_a_committed_checkpoint(cache, tiny_dir, monkeypatch):
    # The hook a trained model (e.g. dllm_bench/assets/tiny-math) uses: no making, no cache.
    committed = dataclasses.replace(get_preset("tiny"), name="committed", asset=str(tiny_dir))
    monkeypatch.setitem(PRESETS, "committed", committed)
    assert resolve_model("committed") == tiny_dir
    with pytest.raises(UserError):
        make_checkpoint("committed", cache / "x")
    assert not cache.exists()


def test_a_cuda_drawn_preset_is_made_in_its_own_shards_where_cuda_is(cache, monkeypatch):
    """llada-8b's path at tiny size: drawn on the device `draw_device` names (the CPU stands in
    for CUDA here), written in the preset's shard count with an index, stamped with where it was
    drawn (a CPU-drawn copy of the same shape is another checkpoint), refused without CUDA."""
    from dllm_bench.checkpoints import make
    from dllm_bench.checkpoints.layout import check_layout
    from dllm_bench.checkpoints.store import is_made, make_cached

    gpu = dataclasses.replace(get_preset("tiny"), name="tiny-gpu", draw_device="cuda", shards=3)
    monkeypatch.setitem(PRESETS, "tiny-gpu", gpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="'tiny-gpu' .* on a CUDA device, and there is none here"):
        resolve_model("tiny-gpu")
    assert not cache.exists()
    drawn_on = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_init = make.init_weight
    monkeypatch.setattr(make, "init_weight", lambda p, n, s, device: drawn_on.append(device) or real_init(p, n, s))
    d = resolve_model("tiny-gpu")
    assert d == cache / "tiny-gpu" and set(drawn_on) == {torch.device("cuda")}
    assert sorted(f.name for f in d.glob("*.safetensors")) == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    report = check_layout(d)
    assert report.ok and report.shards == 3, report.problems
    assert json.loads((d / STAMP_FILE).read_text())["preset"]["draw_device"] == "cuda"
    assert is_made(gpu, d) and not is_made(dataclasses.replace(gpu, draw_device="cpu"), d)
    assert make_cached(gpu) == d and len(drawn_on) == len(weight_shapes(gpu))  # made once
    # Presets drawn on the CPU keep the stamps their caches already have.
    assert "draw_device" not in get_preset("tiny").fingerprint()["preset"]


def test_make_checkpoint_bad_input(tiny_dir, tmp_path):
    with pytest.raises(UserError, match="not empty"):
        make_checkpoint("tiny", tiny_dir)
    with pytest.raises(UserError, match="shards"):
        make_checkpoint("tiny", tmp_path / "x", shards=0)
    (tmp_path / "keep.txt").write_text("user file")
    make_checkpoint("tiny", tmp_path, force=True)
    assert (tmp_path / "keep.txt").read_text() == "user file"  # --force only replaces our files


# ------------------------------------------------------------------ CLI
def test_models_cli_in_process(cache, tmp_path):
    import typer
    from typer.testing import CliRunner

    from dllm_bench.commands.models import register

    app = typer.Typer()
    register(app)
    runner = CliRunner()
    r = runner.invoke(app, ["models", "make", "tiny", "--out", str(tmp_path / "out"), "--shards", "2"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / INDEX_FILE).is_file()
    r = runner.invoke(app, ["models", "list"])
    assert r.exit_code == 0 and "serve-126k" in r.output and "not made" in r.output
    for bad in (["make", "nope"], ["make", "tiny", "--out", str(tmp_path / "out")],
                ["make", "tiny", "--shards", "0"]):
        assert isinstance(runner.invoke(app, ["models", *bad]).exception, UserError)


@pytest.mark.skipif(importlib.util.find_spec("dllm_bench.commands.generate") is None,
                    reason="dllm_bench.cli needs every command module (generate not written yet)")
def test_models_cli_exit_codes(cache, tmp_path, cli_in_process):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DLLM_BENCH_CACHE": str(cache.parent)}
    run = [sys.executable, "-m", "dllm_bench.cli", "models", "make"]
    ok = subprocess.run([*run, "tiny", "--out", str(tmp_path / "o")], env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = cli_in_process("models", "make", "nope")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "unknown model preset" in bad.stderr


@pytest.mark.slow
def test_mini_126k_checkpoint(tmp_path):
    d = make_checkpoint("mini-126k", tmp_path / "mini", shards=2)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["vocab_size"] == tb.LLADA_VOCAB_SIZE and cfg["d_model"] // cfg["n_heads"] == 128
    assert cfg["mask_token_id"] == tb.LLADA_SPECIAL_IDS[tb.MASK]
    index = json.loads((d / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(weight_shapes(get_preset("mini-126k")))
