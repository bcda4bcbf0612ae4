"""Names given on the command line that become a file or directory name (inputs.plain_name): a
profile's `--name` (calibrate, simulate --fit), `simulate --hardware NAME`, every `--run-id`: one
`error:` line, exit 2, and nothing written inside or outside the directory meant for it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dllm_bench.simulate import hardware

REPO = Path(__file__).resolve().parent.parent
H100_RUN = REPO / "tests" / "data" / "h100-2026-11-26"
BAD_NAMES = ["../evil", "a/b", "..", ".", "", "x\ny", "a\\b", "x" * 260]


@pytest.mark.parametrize("bad", BAD_NAMES)
@pytest.mark.parametrize("args", [
    ["calibrate", "--preset", "tiny", "--name"],
    ["simulate", "--fit", str(H100_RUN), "--hardware", "h100", "--no-leave-one-out", "--fit-evidence", "totals",
     "--name"],
])
def test_a_profile_name_is_one_plain_file_name(refused, args, bad):
    msg = refused(*args, bad)
    assert "--name" in msg and ("plain profile name" in msg or "longer than" in msg
                                or bad == "" and "--fit needs" in msg)


def test_a_hardware_name_does_not_reach_outside_the_profiles_cache(refused, tmp_path):
    # A valid profile one level above the cache's hardware/ directory: `--hardware ../x` must not read it.
    outside = tmp_path / "home" / ".cache" / "dllm-bench" / "x.json"
    (outside.parent / "hardware").mkdir()
    shutil.copy(hardware.BUILTIN_DIR / "cpu.json", outside)
    msg = refused("simulate", "--preset", "tiny", "--systems", "engine", "--rps", "4", "--num-prompts", "2",
                  "--hardware", "../x", "--result-dir", str(tmp_path / "runs"))
    assert "--hardware: '../x' is neither a file nor a profile" in msg


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", " "])
def test_simulate_checks_its_run_id_before_simulating(refused, tmp_path, bad):
    msg = refused("simulate", "--preset", "tiny", "--systems", "engine", "--rps", "4", "--num-prompts", "2",
                  "--run-id", bad, "--result-dir", str(tmp_path / "runs"))
    assert "--run-id must be a plain directory name" in msg


def test_simulate_checks_its_result_dir_before_simulating(refused, tmp_path):
    (tmp_path / "a_file").write_text("x")
    msg = refused("simulate", "--preset", "tiny", "--systems", "engine", "--rps", "4", "--num-prompts", "2",
                  "--result-dir", str(tmp_path / "a_file" / "runs"))
    assert "--result-dir" in msg and "is a file, not a directory" in msg
