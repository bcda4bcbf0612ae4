"""Tests run on CPU with one or two torch threads and small presets."""
import os
from pathlib import Path

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


@pytest.fixture
def refused(tmp_path, monkeypatch, capsys):
    """refused(*args, watch=()) -> the one stderr line of a rejected `dllm-bench ARGS`, run in this
    process in an empty working directory with HOME, the cache and the temp dir under tmp_path; fails
    unless it exited 2 with one `error:` line, no traceback, and created nothing under tmp_path or
    at the `watch` paths (an unexpected error's traceback file would land in the temp dir too)."""
    import sys
    import tempfile

    import matplotlib.font_manager  # noqa: F401 - its font cache is written once, in the real HOME

    from dllm_bench import cli as entry
    from dllm_bench.results import RESULTS_ENV

    for d in ("cwd", "home/.cache/dllm-bench", "tmp"):
        (tmp_path / d).mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DLLM_BENCH_CACHE", raising=False)
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))

    # Caches a run fills on first use whatever its options: a model preset built from its recipe, a
    # shape-only model's config, torch's compile cache. Not results: left out of the comparison.
    cache = tmp_path / "home" / ".cache" / "dllm-bench"
    caches = (cache / "models", cache / "shapes", tmp_path / "tmp" / "torchinductor_")

    def files(watch) -> set:
        found = {p for root in (tmp_path, *map(Path, watch)) for p in ([root] if root.exists() else [])
                 + (list(root.rglob("*")) if root.is_dir() else [])}
        return {p for p in found if not any(str(p).startswith(str(c)) for c in caches)}

    def run(*args: str, watch=()) -> str:
        before = files(watch)
        monkeypatch.setattr(sys, "argv", ["dllm-bench", *args])
        with pytest.raises(SystemExit) as e:
            entry.main()
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert e.value.code == 2, err[-3000:]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-3000:]
        assert files(watch) == before, sorted(map(str, files(watch) - before))
        return lines[0]
    return run
