"""The input boundary (`dllm_bench.inputs`, `dllm_bench.checkpoints.load.model_dir`, `workloads.jsonl`,
`dllm_bench.cli.main`): every bad path, run id, checkpoint or input file of every command is exit 2
with one `error:` line on stderr, no traceback, and no file written anywhere.

Most cases run `cli.main` in this process (the same entry point as the `dllm-bench` script, fast);
`test_real_process_*` run `python -m dllm_bench.cli` to show the real process behaves the same."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from dllm_bench.results import RESULTS_ENV

REPO = Path(__file__).resolve().parent.parent

# Each command with the options it needs to reach its input checks quickly.
RUN_COMMANDS = {
    "serve": ["serve", "--preset", "tiny"],
    "ablate": ["ablate", "--preset", "tiny"],
    "sweep": ["sweep", "--vary", "input-len", "--preset", "tiny"],
    "accuracy": ["accuracy", "--limit", "2"],
}
MODEL_COMMANDS = {
    "generate": ["generate", "--prompt-ids", "1,2"],
    "profile": ["profile"],
    **{k: v for k, v in RUN_COMMANDS.items()},
}


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """cli(*args) -> stderr of a rejected `dllm-bench ARGS`, run in an empty working directory
    under tmp_path; fails unless it exited 2 with one `error:` line and wrote no file."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    from dllm_bench import cli as entry

    def run(*args: str) -> str:
        before = _files(tmp_path)
        monkeypatch.setattr(sys, "argv", ["dllm-bench", *args])
        with pytest.raises(SystemExit) as e:
            entry.main()
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert e.value.code == 2, err
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
        assert _files(tmp_path) == before, sorted(map(str, _files(tmp_path) - before))
        return lines[0]
    return run


# ---------------------------------------------------------------- result directories
@pytest.fixture
def a_file(tmp_path) -> Path:
    f = tmp_path / "a_file"
    f.write_text("x")
    return f


def _out_options(cmd: str, path: Path) -> list[str]:
    if cmd in ("serve", "ablate", "sweep"):
        return RUN_COMMANDS[cmd] + ["--result-dir", str(path)]
    if cmd == "report":
        return ["report", "--out", str(path / "r.md")]
    if cmd == "train":
        return ["train", "--out", str(path), "--steps", "1"]
    return ["models", "make", "tiny", "--out", str(path)]


@pytest.mark.parametrize("cmd", ["serve", "ablate", "sweep", "report", "train", "models"])
def test_result_dir_that_is_a_file_or_under_one(cli, a_file, cmd):
    if cmd != "report":  # report writes a file *into* the given dir's parent: only "under" applies
        assert "is not a directory" in cli(*_out_options(cmd, a_file))
    assert "is a file, not a directory" in cli(*_out_options(cmd, a_file / "sub"))


@pytest.mark.parametrize("cmd", ["serve", "ablate", "sweep", "report", "train", "models"])
def test_result_dir_unwritable(cli, tmp_path, monkeypatch, cmd):
    # Tests run as root (every dir is writable), so deny the access check itself: this proves
    # the check runs before anything is written.
    from dllm_bench import inputs

    monkeypatch.setattr(inputs.os, "access", lambda *a, **k: False)
    assert "is not writable" in cli(*_out_options(cmd, tmp_path / "ro" / "runs"))


def test_report_out_is_a_directory(cli, tmp_path):
    (tmp_path / "d.md").mkdir()
    assert "is a directory" in cli("report", "--out", str(tmp_path / "d.md"))


# ---------------------------------------------------------------- run ids
BAD_RUN_IDS = ["../x", "{abs}", "a/b", "", " ", ".", "..", "x\0y", "x\ny", "x" * 300]


@pytest.mark.parametrize("cmd", list(RUN_COMMANDS))
@pytest.mark.parametrize("bad", BAD_RUN_IDS)
def test_run_id_not_a_plain_name(cli, tmp_path, cmd, bad):
    bad = bad.replace("{abs}", str(tmp_path / "abs"))
    msg = cli(*RUN_COMMANDS[cmd], "--run-id", bad)
    assert "--run-id" in msg and ("plain directory name" in msg or "longer than" in msg)


def test_resume_run_id_not_a_plain_name(cli):
    assert "plain directory name" in cli("serve", "--preset", "tiny", "--resume", "--run-id", "../x")


def test_create_run_keeps_run_dirs_inside_the_root(tmp_path):
    from dllm_bench.errors import UserError
    from dllm_bench.results import create_run

    for bad in ("../x", str(tmp_path / "abs"), "a/b", "."):
        with pytest.raises(UserError):
            create_run("serve", {}, run_id=bad, root=tmp_path / "runs")
    assert sorted(os.listdir(tmp_path)) == []
    assert create_run("serve", {}, run_id="ok", root=tmp_path / "runs") == tmp_path / "runs" / "ok"


# ---------------------------------------------------------------- checkpoints
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The `tiny` preset, and copies of it broken in every way a checkpoint dir can be."""
    from dllm_bench.checkpoints.store import resolve_model

    src = resolve_model("tiny")
    root = tmp_path_factory.mktemp("ckpt")
    state = load_file(src / "model.safetensors")
    first = sorted(state)[0]
    out = {}

    def copy(name: str) -> Path:
        d = root / name
        shutil.copytree(src, d)
        out[name] = d
        return d

    (copy("no_config") / "config.json").unlink()
    cfg = json.loads((src / "config.json").read_text())
    (copy("config_mistyped") / "config.json").write_text(json.dumps({**cfg, "d_model": "64"}))
    save_file({**state, first: state[first][:-1].clone()}, copy("shape_mismatch") / "model.safetensors")
    save_file({k: v for k, v in state.items() if k != first}, copy("missing_tensor") / "model.safetensors")
    save_file({**state, "model.extra.weight": state[first].clone()}, copy("extra_tensor") / "model.safetensors")
    blob = (src / "model.safetensors").read_bytes()
    (copy("corrupt_header") / "model.safetensors").write_bytes(blob[:8] + b"{not json" + blob[17:])
    d = copy("missing_shard")
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {first: "model-00001.safetensors"}}))
    d = copy("no_tokenizer")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()
    return out


BAD_CHECKPOINTS = {
    "no_config": "no config.json",
    "config_mistyped": "'d_model' must be a positive integer",
    "shape_mismatch": "has shape (63,), config.json implies (64,)",
    "missing_tensor": "1 tensor(s) missing",
    "extra_tensor": "config.json does not describe, e.g. model.extra.weight",
    "corrupt_header": "corrupt safetensors file model.safetensors",
    "missing_shard": "shard model-00001.safetensors listed in model.safetensors.index.json is missing",
}


@pytest.mark.parametrize("cmd", list(MODEL_COMMANDS))
@pytest.mark.parametrize("kind", list(BAD_CHECKPOINTS))
def test_bad_checkpoint(cli, checkpoints, cmd, kind):
    msg = cli(*MODEL_COMMANDS[cmd], "--model", str(checkpoints[kind]))
    assert str(checkpoints[kind]) in msg and BAD_CHECKPOINTS[kind] in msg


@pytest.mark.parametrize("args", [["accuracy", "--limit", "2"], ["generate", "--prompt", "hi"]])
def test_checkpoint_without_the_tokenizer_it_needs(cli, checkpoints, args):
    assert "has no tokenizer files" in cli(*args, "--model", str(checkpoints["no_tokenizer"]))


def test_checkpoint_without_tokenizer_is_fine_where_none_is_needed(checkpoints):
    from dllm_bench.inputs import checkpoint_dir

    assert checkpoint_dir(str(checkpoints["no_tokenizer"])) == checkpoints["no_tokenizer"]


# ---------------------------------------------------------------- JSONL / CSV inputs
SERVE_JSONL = {  # content -> (line, what the message names)
    '{"prompt_len": 4, "output_len": 8}\nnot json\n': (2, "invalid JSON"),
    '{"prompt_len": 4, "output_len": 8}\n\n[1, 2]\n': (3, "expected a JSON object, got list"),
    '{"prompt_len": 4}\n': (1, "missing 'output_len'"),
    '{"prompt_len": "4", "output_len": 8}\n': (1, "'prompt_len' must be an integer"),
    '{"prompt_len": 4, "output_len": 8, "timestamp": "t"}\n': (1, "'timestamp' must be a finite number"),
}
DATA_JSONL = {
    '{"question": "q", "answer": "#### 1"}\n{"question": "q"\n': (2, "invalid JSON"),
    '"just a string"\n': (1, "expected a JSON object, got str"),
    '{"question": "q", "answer": 5}\n': (1, "'answer' must be a string"),
    '{"question": "q"}\n': (1, "neither GSM8K-shaped"),
}


@pytest.mark.parametrize("content", list(SERVE_JSONL))
def test_serve_dataset_path_bad_line(cli, tmp_path, content):
    f = tmp_path / "w.jsonl"
    f.write_text(content)
    line, what = SERVE_JSONL[content]
    msg = cli("serve", "--preset", "tiny", "--dataset", "custom", "--dataset-path", str(f))
    assert f"{f}:{line}: " in msg and what in msg


@pytest.mark.parametrize("content", list(DATA_JSONL))
def test_accuracy_data_bad_line(cli, tmp_path, content):
    f = tmp_path / "d.jsonl"
    f.write_text(content)
    line, what = DATA_JSONL[content]
    msg = cli("accuracy", "--limit", "2", "--data", str(f))
    assert f"{f}:{line}: " in msg and what in msg


def test_burstgpt_csv_bad_cell(cli, tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("Timestamp,Model,Request tokens,Response tokens\n1,ChatGPT,12,3\n2,ChatGPT,x,3\n")
    msg = cli("serve", "--preset", "tiny", "--dataset", "custom", "--dataset-path", str(f))
    assert str(f) in msg and "'Request tokens'" in msg and "line 3" in msg


def test_non_utf8_jsonl_names_the_line(cli, tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_bytes(b'{"prompt_len": 4, "output_len": 8}\n\xff\xfe\n')
    assert f"{f}:2: not UTF-8" in cli("serve", "--preset", "tiny", "--dataset", "custom", "--dataset-path", str(f))


def test_input_file_that_is_a_directory_or_missing(cli, tmp_path):
    args = ["serve", "--preset", "tiny", "--dataset-path"]
    assert "is not a regular file" in cli(*args, str(tmp_path))
    assert "no such file" in cli(*args, str(tmp_path / "nope.jsonl"))


def test_accuracy_data_that_is_missing_or_not_a_dataset(cli, tmp_path):
    """--data takes a JSONL file or a `datasets` directory: a plain directory is neither."""
    args = ["accuracy", "--limit", "2", "--data"]
    assert "data file not found" in cli(*args, str(tmp_path / "nope.jsonl"))
    assert "not a datasets directory" in cli(*args, str(tmp_path))


# ---------------------------------------------------------------- other options that tracebacked
@pytest.mark.parametrize("args, msg", [
    (["generate", "--prompt-ids", "1", "--device", "foo"], "--device must be auto, cpu or cuda"),
    (["accuracy", "--limit", "2", "--device", "foo"], "--device must be auto, cpu or cuda"),
    (["profile", "--model", "tiny", "--threads", "-1"], "--threads must be >= 1"),
    (["generate", "--prompt-ids", "1", "--temperature", "nan"], "'nan' is not a number"),
    (["serve", "--preset", "tiny", "--max-prompt-len", str(10**23)], "out of range"),
    (["generate", "--gen-length", "abc"], "'abc' is not a valid integer"),
    (["sweep"], "Missing option '--vary'"),
])
def test_fuzzed_options(cli, args, msg):
    assert msg in cli(*args)


@pytest.mark.parametrize("flag, value, msg", [
    ("--n-heads", "0", "must be positive"),
    ("--vocab-size", "100", "leaves no room for the 256 byte tokens"),
    ("--lr", "-1", "lr and rope_theta must be positive"),
    ("--rope-theta", "0", "lr and rope_theta must be positive"),
])
def test_train_rejects_bad_shapes_before_writing(cli, tmp_path, flag, value, msg):
    assert msg in cli("train", "--out", str(tmp_path / "ckpt"), flag, value)


# ---------------------------------------------------------------- the real process
def _real(tmp_path, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop(RESULTS_ENV, None)
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", *args], capture_output=True, text=True,
                       env=env, cwd=cwd, timeout=300)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert [p.name for p in tmp_path.rglob("*")] == ["cwd"]  # nothing written, anywhere
    return lines[0]


def test_real_process_run_id_and_usage_error(tmp_path):
    assert "plain directory name" in _real(tmp_path, "serve", "--preset", "tiny", "--run-id", "../escape")
    assert "'abc' is not a valid integer" in _real(tmp_path, "generate", "--gen-length", "abc")


def test_real_process_bad_checkpoint(tmp_path, checkpoints):
    assert "does not describe" in _real(tmp_path, "generate", "--prompt-ids", "1", "--model",
                                        str(checkpoints["extra_tensor"]))


# ---------------------------------------------------------------- #11 leftovers
@pytest.mark.parametrize("args", [
    ["report", "--out", "/proc/x.md"],                       # root may "write" /proc: no regular files there
    ["report", "--out", "/proc/sub/x.md"],
    ["serve", "--preset", "tiny", "--result-dir", "/proc/runs"],
    ["models", "make", "tiny", "--out", "/proc/m"],
])
def test_out_paths_in_a_pseudo_filesystem(cli, args):
    msg = cli(*args)
    assert "/proc" in msg and ("cannot create files" in msg or "not writable" in msg)


def test_a_probe_that_cannot_create_a_file_is_one_line(cli, tmp_path, monkeypatch):
    # Also where the access check passes but the filesystem refuses files (a read-only mount).
    from dllm_bench import inputs

    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr(inputs.tempfile, "mkstemp", refuse)
    assert "cannot create files" in cli("report", "--out", str(tmp_path / "r.md"))
    assert "Read-only file system" in cli("serve", "--preset", "tiny", "--result-dir", str(tmp_path / "runs"))


def test_report_out_that_is_not_a_regular_file(cli, tmp_path):
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    assert "not a regular file" in cli("report", "--out", str(fifo))


@pytest.mark.parametrize("args", [
    ["serve", "--preset", "tiny", "--num-prompts", str(10**12)],
    ["simulate", "--num-prompts", "100001"],
    ["ablate", "--preset", "tiny", "--num-prompts", str(10**9)],
    ["sweep", "--vary", "input-len", "--preset", "tiny", "--num-prompts", str(10**9)],
    ["accuracy", "--limit", str(10**12)],
])
def test_huge_counts_are_refused_before_any_work(cli, args):
    msg = cli(*args)
    assert "over the limit of 100,000" in msg and args[-2] in msg


def test_a_duration_that_means_a_huge_count(cli):
    msg = cli("serve", "--preset", "tiny", "--duration", "1e9", "--rps", "1,10")
    assert "--duration" in msg and "10,000,000,000 requests" in msg


@pytest.mark.parametrize("args", [
    ["generate", "--prompt-ids", "1,2", "--system", "dllm-cache", "--transfer-ratio", "5"],
    ["generate", "--prompt-ids", "1,2", "--system", "dllm-cache", "--transfer-ratio", "-0.5"],
    ["serve", "--preset", "tiny", "--systems", "dllm-cache:transfer_ratio=1.01"],
    ["simulate", "--systems", "dllm-cache:transfer_ratio=5"],
])
def test_transfer_ratio_outside_0_1(cli, args):
    assert "transfer_ratio must be in [0, 1]" in cli(*args)


def test_counts_at_the_bound_and_transfer_ratio_at_its_ends_are_accepted():
    from baselines.dllm_cache import DLLMCache
    from dllm_bench import inputs

    assert inputs.count(inputs.MAX_COUNT, "--num-prompts") == inputs.MAX_COUNT
    for r in (0.0, 0.25, 1.0):
        assert DLLMCache(None, transfer_ratio=r).ratio == r
