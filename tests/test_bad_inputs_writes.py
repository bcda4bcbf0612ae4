"""Inputs refused only after something was made: each refusal must come before the first directory
(`models make --shards`, `report --keep` of a damaged run, `train --window`)."""
from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
H100_RUN = REPO / "tests" / "data" / "h100-2026-11-26"


def test_models_make_with_more_shards_than_tensors_makes_no_out_dir(refused, tmp_path):
    out = tmp_path / "elsewhere" / "ckpt"
    msg = refused("models", "make", "tiny", "--out", str(out), "--shards", "22", watch=[out.parent])
    assert "--shards 22 is more than the 21 tensors" in msg and not out.parent.exists()


def test_report_keep_of_a_damaged_run_makes_nothing_in_the_working_directory(refused, tmp_path):
    run = tmp_path / "src" / "h100"
    shutil.copytree(H100_RUN, run)
    (run / "points" / "livebench__fast-dllm__rpsinf" / "summary.json").write_text("{not json")
    msg = refused("report", "--keep", str(run))
    assert "is not readable JSON" in msg and not (tmp_path / "cwd" / "results").exists()


def test_train_with_a_window_the_answers_do_not_fit_makes_no_out_dir(refused, tmp_path):
    out = tmp_path / "elsewhere" / "ckpt"
    msg = refused("train", "--out", str(out), "--steps", "1", "--window", "1", watch=[out.parent])
    assert "--window 1: answer of" in msg and not out.parent.exists()
