"""A tiny checkpoint in LLaDA-8B-Instruct's exact file layout (tests.hf_layout):
the real files' keys and tokenizer shape, loaded shard by shard, and used end to end: `generate`,
the server's chat route (the real chat template), `accuracy`."""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
import torch

REAL = Path(__file__).resolve().parent / "data" / "llada-8b-instruct"


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from tests.hf_layout import make_hf_checkpoint

    return make_hf_checkpoint(tmp_path_factory.mktemp("hf") / "LLaDA-tiny-Instruct")


@pytest.fixture(scope="module")
def tok(ckpt):
    from dllm_bench.checkpoints.load import load_tokenizer

    return load_tokenizer(ckpt)


def _runner(module: str):
    import importlib

    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    importlib.import_module(f"dllm_bench.commands.{module}").register(app)
    return lambda *args: CliRunner().invoke(app, [*args, "--threads", "1"])


def test_files_have_the_real_keys_and_tokenizer_shape(ckpt):
    from dllm_bench.checkpoints.layout import check_layout
    from tests import hf_tokenizer

    cfg, real_cfg = _json(ckpt / "config.json"), _json(REAL / "config.json")
    assert cfg.keys() == real_cfg.keys() and cfg["auto_map"] == real_cfg["auto_map"]
    assert cfg["d_model"] < 128 and cfg["vocab_size"] == cfg["embedding_size"]
    gen = _json(ckpt / "generation_config.json")
    assert gen.keys() == _json(REAL / "generation_config.json").keys()
    assert _json(ckpt / "special_tokens_map.json") == _json(REAL / "special_tokens_map.json")

    tc, real_tc = _json(ckpt / "tokenizer_config.json"), _json(REAL / "tokenizer_config.json")
    assert tc.keys() == real_tc.keys()
    assert {k: v for k, v in tc.items() if k != "added_tokens_decoder"} == \
        {k: v for k, v in real_tc.items() if k != "added_tokens_decoder"}
    shift = min(map(int, real_tc["added_tokens_decoder"])) - min(map(int, tc["added_tokens_decoder"]))
    assert {int(i) + shift: t for i, t in tc["added_tokens_decoder"].items()} == \
        {int(i): t for i, t in real_tc["added_tokens_decoder"].items()}
    ids = {t["content"]: int(i) for i, t in tc["added_tokens_decoder"].items()}
    assert (cfg["mask_token_id"], cfg["eos_token_id"], cfg["pad_token_id"], gen["bos_token_id"]) == \
        (ids["<|mdm_mask|>"], ids["<|endoftext|>"], ids["<|endoftext|>"], ids["<|startoftext|>"])
    top = max(ids.values())
    assert cfg["vocab_size"] == hf_tokenizer.embedding_rows(top + 1) > top + 1  # unused rows, as in the real one

    index = _json(ckpt / "model.safetensors.index.json")
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 2 and all(re.fullmatch(rf"model-0000\d-of-0000{len(files)}\.safetensors", f) for f in files)
    assert list(index["weight_map"]) == sorted(index["weight_map"])
    assert sorted(p.name for p in ckpt.glob("*.safetensors")) == files
    report = check_layout(ckpt)
    assert report.ok, report.problems
    assert report.shards == len(files) and report.dtypes == ["BF16"]
    assert report.total_bytes == index["metadata"]["total_size"] == 2 * report.n_params


def test_loader_reads_every_shard_through_the_index(ckpt):
    from safetensors import safe_open

    from engine.models import load_model

    model = load_model(ckpt, torch.float32)
    state = model.state_dict()
    seen = set()
    for f in sorted(set(_json(ckpt / "model.safetensors.index.json")["weight_map"].values())):
        with safe_open(str(ckpt / f), framework="pt") as st:
            for k in st.keys():
                assert torch.equal(state[k], st.get_tensor(k).float()), k
                seen.add(k)
    assert seen == set(state)


def test_tokenizer_never_runs_or_offers_the_checkpoints_code(ckpt, tmp_path, monkeypatch):
    """A real checkpoint dir holds the modeling code its auto_map names: loading the tokenizer
    must neither ask on the terminal whether to run it nor run it."""
    import shutil

    from dllm_bench.checkpoints.load import load_tokenizer

    d = tmp_path / "ckpt"
    shutil.copytree(ckpt, d)
    marker = tmp_path / "ran"
    for f in ("configuration_llada.py", "modeling_llada.py"):
        (d / f).write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("asked whether to run remote code"))
    assert load_tokenizer(d) is not None and not marker.exists()


def test_chat_prompt_is_the_real_template(tok):
    from dllm_bench.checkpoints.load import encode_prompt

    ids = encode_prompt(tok, "  What is 2 + 3?  ", chat=True)
    assert tok.decode(ids) == ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?<|eot_id|>"
                               "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert ids[0] == tok.bos_token_id and tok.decode(ids, skip_special_tokens=True) == "user\n\nWhat is 2 + 3?assistant\n\n"


def test_generate_cli_matches_the_reference_sampler(ckpt, tok):
    from baselines.reference_llada import reference_generate
    from dllm_bench.checkpoints.load import encode_prompt
    from engine.models import load_model
    from engine.sampling import SamplingParams

    r = _runner("generate")("--model", str(ckpt), "--prompt", "What is 2 + 3?", "--gen-length", "16",
                            "--block-length", "8", "--dtype", "float64", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["outputs"][0]
    prompt = encode_prompt(tok, "What is 2 + 3?", chat=True)
    assert out["prompt_tokens"] == len(prompt) and len(out["tokens"]) == 16
    sp = SamplingParams(gen_length=16, steps=16, block_length=8)
    # float64 on both sides: the engine's kernels (fused projections, packed rows) and the
    # reference's round differently, in float32 enough to flip a near-tie on some CPU kernels.
    assert out["tokens"] == reference_generate(load_model(ckpt, torch.float64), prompt, sp)[0]
    assert out["text"] == tok.decode(out["tokens"], skip_special_tokens=True)


def test_server_chat_route_applies_the_chat_template(ckpt, tok):
    from dllm_bench.server.app import create_app
    from dllm_bench.server.options import ServerOptions
    from dllm_bench.server.startup import build_state

    state, _ = build_state(ServerOptions(model=str(ckpt), served_model_name="llada-tiny", memory_budget="256MiB",
                                         max_num_batched_tokens=512, dtype="float32", device="cpu", threads=1,
                                         block_length=8, max_waiting=8))
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is 2 + 3?"}]

    async def go():
        state.loop.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)),
                                         base_url="http://test", timeout=120) as c:
                return await c.post("/v1/chat/completions", json={"model": "llada-tiny", "messages": messages,
                                                                  "max_tokens": 8})
        finally:
            state.loop.stop()

    r = asyncio.run(asyncio.wait_for(go(), 300))
    assert r.status_code == 200, r.text
    body = r.json()
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nYou are")
    assert body["usage"]["prompt_tokens"] == len(tok(rendered, add_special_tokens=False)["input_ids"])
    assert body["usage"]["completion_tokens"] == 8
    assert isinstance(body["choices"][0]["message"]["content"], str)


def test_accuracy_cli_end_to_end(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    r = _runner("accuracy")("--model", str(ckpt), "--limit", "2", "--retention", "0.5", "--selection", "head",
                            "--no-r1", "--chat", "--json", "--run-id", "hf")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [p["point"] for p in doc["points"]] == ["dense", "head-r0.5"]
    assert doc["n"] == 2 and all(p["n"] == 2 for p in doc["points"])
