"""`dllm-bench generate` end to end, and every bad input of the foundation issue -> exit 2,
one line on stderr, no traceback."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def cli(*args, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "dllm_bench.cli", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)


@pytest.fixture
def rejected(monkeypatch, capsys):
    """rejected(*args) -> stderr of `dllm-bench ARGS` run in this process (the real entry point,
    its exit code and its stderr; a subprocess per case cost seconds of imports), failing
    unless it exited 2 with one line and no traceback."""
    from dllm_bench import cli as entry

    def run(*args: str) -> str:
        monkeypatch.setattr(sys, "argv", ["dllm-bench", *args])
        with pytest.raises(SystemExit) as e:
            entry.main()
        err = capsys.readouterr().err
        assert e.value.code == 2, err
        assert "Traceback" not in err and err.strip().count("\n") == 0, err
        return err
    return run


@pytest.fixture(scope="module")
def bare_dir(tmp_path_factory):
    """A checkpoint directory holding only config.json and model.safetensors."""
    from dllm_bench.checkpoints.store import resolve_model

    src = resolve_model("tiny")
    d = tmp_path_factory.mktemp("bare")
    for f in ("config.json", "model.safetensors"):
        shutil.copy(src / f, d / f)
    return d


def test_generate_json_on_bare_checkpoint_matches_reference(bare_dir):
    r = cli("generate", "--model", str(bare_dir), "--prompt-ids", "1,2,3", "--prompt-ids", "7,8,9,10,11",
            "--gen-length", "16", "--block-length", "8", "--steps", "8", "--dtype", "float64", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [len(o["tokens"]) for o in doc["outputs"]] == [16, 16]
    assert all(o["nfe"] == 8 and o["text"] is None for o in doc["outputs"])
    import torch

    from baselines.reference_llada import reference_generate
    from engine import SamplingParams
    from engine.models import load_model

    model = load_model(bare_dir, torch.float64)
    sp = SamplingParams(gen_length=16, steps=8, block_length=8)
    assert doc["outputs"][0]["tokens"] == reference_generate(model, [1, 2, 3], sp)[0]
    assert doc["outputs"][1]["tokens"] == reference_generate(model, [7, 8, 9, 10, 11], sp)[0]


def test_generate_text_and_baseline_system():
    r = cli("generate", "--model", "tiny", "--prompt", "Hello", "--gen-length", "16", "--block-length", "8")
    assert r.returncode == 0, r.stderr
    assert "output 0" in r.stdout
    r = cli("generate", "--model", "tiny", "--prompt-ids", "4,5,6", "--gen-length", "16", "--block-length", "8",
            "--system", "sparse-dllm", "--keep-ratio", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["system"] == "sparse-dllm"


def test_a_request_four_times_the_token_budget_completes_with_no_other_flag():
    """max_model_len is the checkpoint's (4096): a 256-token canvas under a 64-token budget is
    refreshed in chunks (its tokens: those of a budget that holds it)."""
    ids = ",".join(str(5 + i % 400) for i in range(200))
    args = ("generate", "--model", "tiny", "--prompt-ids", ids, "--gen-length", "56", "--block-length", "8",
            "--steps", "14", "--dtype", "float64", "--json")
    r = cli(*args, "--max-num-batched-tokens", "64")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["step_budgets"]["max_num_batched_tokens"] == 64
    assert len(doc["outputs"][0]["tokens"]) == 56 and doc["outputs"][0]["nfe"] == 14
    whole = json.loads(cli(*args, "--max-num-batched-tokens", "256").stdout)
    assert doc["outputs"][0]["tokens"] == whole["outputs"][0]["tokens"]


@pytest.mark.parametrize("args,msg", [
    (["--model", "nope", "--prompt-ids", "1"], "unknown model preset"),
    (["--model", "/nonexistent/dir", "--prompt-ids", "1"], ""),
    (["--prompt-ids", "1", "--gen-length", "10", "--block-length", "4"], "multiple of block_length"),
    (["--prompt-ids", "1", "--gen-length", "8", "--block-length", "4", "--steps", "3"], "divisible"),
    (["--prompt", "   "], "empty prompt"),
    (["--prompt-ids", ""], "empty prompt"),
    (["--prompt-ids", "1", "--gen-length", "0"], "positive"),
    (["--prompt-ids", "1", "--steps", "-4"], "positive"),
    (["--prompt-ids", "1", "--gen-length", "4096", "--block-length", "4096"],
     "prompt + gen_length = 4097 exceeds the model's length of 4096 tokens (max_model_len)"),
    (["--prompt-ids", "1,x"], "comma-separated"),
    (["--prompt-ids", "1", "--system", "vllm"], "--system"),
    (["--prompt-ids", "1", "--cache", "paged"], "cache"),
    (["--prompt-ids", "1", "--threshold", "0.9"], "does not apply"),
    (["--prompt-ids", "1", "--scheduler", "fifo"], "scheduler"),
])
def test_bad_input_exit_2(args, msg, rejected):
    err = rejected("generate", "--model", "tiny", *args) if "--model" not in args else rejected("generate", *args)
    assert msg in err


def test_bad_checkpoints_exit_2(tmp_path, bare_dir, rejected):
    corrupt = tmp_path / "corrupt"
    shutil.copytree(bare_dir, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    other = tmp_path / "other"
    shutil.copytree(bare_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    no_weights = tmp_path / "noweights"
    no_weights.mkdir()
    shutil.copy(bare_dir / "config.json", no_weights / "config.json")
    for d, msg in ((corrupt, "corrupt"), (other, "model_type"), (no_weights, "model.safetensors")):
        assert msg in rejected("generate", "--model", str(d), "--prompt-ids", "1,2")
    r = cli("generate", "--model", str(bare_dir), "--prompt", "hi")   # text needs a tokenizer
    assert r.returncode == 2 and "tokenizer" in r.stderr
