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



import pytest  # noqa: E402


@pytest.fixture
def cli_in_process(monkeypatch, capsys):
    """cli_in_process(*args) -> CompletedProcess of `dllm-bench ARGS` in this process
    (tests.helpers.run_cli): for bad-input cases; end-to-end runs keep their subprocess."""
    from tests.helpers import run_cli

    return lambda *args: run_cli(monkeypatch, capsys, *args)
