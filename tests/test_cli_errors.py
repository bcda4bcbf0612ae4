"""Loose ends a user hits, each one `error:` line: an error raised by a library, a report that cannot
be written, a count no machine run could hold (memory) or finish (a day of arrivals), and
`accuracy --result-dir` checked like every run-writing command's."""
from __future__ import annotations

import errno
import shutil
import sys
from pathlib import Path

import pytest

from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.serve.options import ServeOptions, resolve_run


@pytest.fixture
def cli(monkeypatch, capsys):
    """cli(code, *args) -> the one stderr line of `dllm-bench ARGS`, which must exit with `code`."""
    from dllm_bench import cli as entry

    def run(code: int, *args: str) -> str:
        monkeypatch.setattr(sys, "argv", ["dllm-bench", *args])
        with pytest.raises(SystemExit) as e:
            entry.main()
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert e.value.code == code, err
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
        return lines[0]
    return run


def test_a_library_error_is_one_line_with_the_traceback_kept(cli, monkeypatch):
    from dllm_bench.checkpoints import catalog

    def broken(*a, **k):
        raise OSError("the safetensors header is unreadable\n  at byte 8\n  (a second line of detail)")
    monkeypatch.setattr(catalog, "is_made", broken)
    monkeypatch.delenv("DLLM_BENCH_TRACEBACK", raising=False)
    line = cli(1, "models", "list")
    assert "OSError at test_cli_errors.py:" in line and "the safetensors header is unreadable at byte 8" in line
    kept = Path(line.split("(traceback: ")[1].split(";")[0])
    assert "Traceback" in kept.read_text() and "a second line of detail" in kept.read_text()
    kept.unlink()
    monkeypatch.setenv("DLLM_BENCH_TRACEBACK", "1")   # a developer asks for the traceback itself
    monkeypatch.setattr(sys, "argv", ["dllm-bench", "models", "list"])
    from dllm_bench import cli as entry

    with pytest.raises(OSError, match="unreadable"):
        entry.main()


def test_a_tokenizer_that_cannot_load_is_one_line(cli, tmp_path):
    from dllm_bench.checkpoints.load import model_dir

    ckpt = tmp_path / "ckpt"
    shutil.copytree(model_dir("tiny"), ckpt)
    (ckpt / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": 5}}')
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "hello there", "output_len": 8}\n')
    line = cli(2, "serve", "--model", str(ckpt), "--preset", "tiny", "--dataset-path", str(data), "--systems",
               "engine", "--result-dir", str(tmp_path / "runs"))
    assert f"cannot load the tokenizer in {ckpt}" in line
    assert not (tmp_path / "runs").exists()


def test_report_into_a_place_it_cannot_write_is_one_line(cli, tmp_path, monkeypatch):
    (tmp_path / "r_files").write_text("not a directory")   # where the report's figures would go
    assert "figures directory" in cli(2, "report", "--out", str(tmp_path / "r.md"), "--result-dir", str(tmp_path))
    from dllm_bench.report import document

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(document.results, "atomic_write_bytes", full)
    line = cli(2, "report", "--out", str(tmp_path / "ok.md"), "--result-dir", str(tmp_path))
    assert f"--out {tmp_path / 'ok.md'}: cannot write the report (No space left on device)" in line


def test_accuracy_result_dir_is_checked_like_every_runs(cli, tmp_path):
    (tmp_path / "a_file").write_text("x")
    assert "exists and is not a directory" in cli(2, "accuracy", "--limit", "2", "--result-dir",
                                                   str(tmp_path / "a_file"))


TINY = dict(systems="engine", model="tiny", num_warmups=0)


def test_a_count_the_memory_cannot_hold_is_refused_up_front(cli, monkeypatch, tmp_path):
    monkeypatch.setattr(inputs, "available_memory", lambda: 2**30)
    # A tiny request may take up to its model's 4,096 tokens; parent + one worker: 2 copies.
    most = int(2**30 * inputs.MEMORY_SHARE) // (4096 * inputs.TOKEN_ID_BYTES * 2)
    line = cli(2, "serve", "--preset", "tiny", "--num-prompts", str(most + 1), "--rps", "inf",
               "--result-dir", str(tmp_path / "runs"))
    assert f"--num-prompts {most + 1:,} is more than this machine can hold" in line and f"holds {most:,}" in line
    assert "1.00 GiB of memory available" in line and not (tmp_path / "runs").exists()
    inputs.fits_memory(most, 2, 4096, "--num-prompts", "request")           # the bound itself fits


def test_a_day_of_arrivals_is_refused_unless_points_are_bounded(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "available_memory", lambda: 2**40)
    line = cli(2, "serve", "--preset", "tiny", "--num-prompts", "1000", "--rps", "0.01",
               "--result-dir", str(tmp_path / "runs"))
    assert "--num-prompts 1,000 at 0.01 req/s is 27.8 h of arrivals per point" in line and "--max-duration" in line
    opts = ServeOptions(**TINY, num_prompts=1000, rps="0.01")
    with pytest.raises(UserError, match="27.8 h"):
        resolve_run(opts)
    assert len(next(iter(resolve_run(ServeOptions(**TINY, num_prompts=1000, rps="0.01", max_duration=60))
                         .workloads.values()))) == 1000
    # A simulation's arrivals are on a virtual clock: they cost no wall time.
    assert resolve_run(opts, wall_clock=False).num_prompts == 1000
