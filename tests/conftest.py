"""Tests run on CPU with one or two torch threads and small presets."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Every CPU `serve` ends with a GPU projection (seconds of simulation); tests of other things
# skip it, tests/test_serve_projection.py runs it.
os.environ.setdefault("DLLM_BENCH_NO_PROJECTION", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def cli_in_process(monkeypatch, capsys):
    """cli_in_process(*args) -> CompletedProcess of `dllm-bench ARGS` through the real entry point
    in this process: its exit code, stdout and stderr, without a subprocess's seconds of imports
    (for bad-input cases; end-to-end runs keep their subprocess)."""
    from dllm_bench import cli as entry

    def run(*args: str) -> subprocess.CompletedProcess:
        monkeypatch.setattr(sys, "argv", ["dllm-bench", *args])
        code = 0
        try:
            entry.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)
    return run
