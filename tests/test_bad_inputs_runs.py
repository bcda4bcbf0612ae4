"""Bad run directories given to the commands that read them (`simulate --fit`, `simulate --validate`,
`serve --resume`): a damaged JSON file is one `error:` line naming it, exit 2, nothing written."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
H100_RUN = REPO / "tests" / "data" / "h100-2026-11-26"
POINT = "livebench__fast-dllm__rpsinf"
FIT = ["simulate", "--hardware", "h100", "--name", "x", "--no-leave-one-out", "--fit-evidence", "totals", "--fit"]
VALIDATE = ["simulate", "--preset", "paper", "--model", "llada-8b", "--hardware", "h100", "--rps", "inf",
            "--num-prompts", "32", "--systems", "engine", "--validate"]


@pytest.fixture
def damaged(tmp_path_factory):
    """damaged(file, content) -> a copy of the committed H100 run with `file` overwritten."""
    def make(file: str, content: bytes) -> Path:
        run = tmp_path_factory.mktemp("run") / "h100"
        shutil.copytree(H100_RUN, run)
        (run / file).write_bytes(content)
        return run
    return make


@pytest.mark.parametrize("file, content, says", [
    ("config.json", b'{"kind": "serve", ', "not a readable JSON file"),
    ("config.json", b"[1, 2]", "expected a JSON object, got list"),
    (f"points/{POINT}/summary.json", b"{broken", "not a readable JSON file"),
    (f"points/{POINT}/summary.json", b'{"a": "\xff"}', "not a readable JSON file"),   # not UTF-8
    (f"points/{POINT}/summary.json", b'{"rps": "fast"}', "not a point summary"),
])
@pytest.mark.parametrize("mode", [FIT, VALIDATE])
def test_a_damaged_json_file_of_a_run_is_one_line_naming_it(refused, damaged, tmp_path, mode, file, content, says):
    run = damaged(file, content)
    msg = refused(*mode, str(run), "--result-dir", str(tmp_path / "runs"), watch=[run])
    assert str(run / file) in msg and says in msg


def test_resume_of_a_run_whose_config_is_damaged(refused, tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"kind": "serve"')
    msg = refused("serve", "--preset", "tiny", "--result-dir", str(tmp_path / "runs"), "--run-id", "r1", "--resume")
    assert str(run / "config.json") in msg and "not a readable JSON file" in msg


def test_validate_refuses_up_front_a_run_none_of_whose_cells_it_would_simulate(refused, tmp_path):
    """The committed run measured rps inf: at rps 4 no cell matches, and nothing is simulated or written."""
    msg = refused("simulate", "--preset", "paper", "--model", "llada-8b", "--hardware", "h100", "--rps", "4",
                  "--num-prompts", "8", "--systems", "engine", "--validate", str(H100_RUN),
                  "--result-dir", str(tmp_path / "runs"))
    assert "--validate: no (dataset, system, rps) cell of the measured runs" in msg and "livebench/engine@inf" in msg


@pytest.mark.parametrize("mode", ["--fit", "--validate"])
def test_fit_and_validate_refuse_an_endpoint_run_alike(refused, tmp_path, mode):
    from dllm_bench import results

    run = results.create_run("serve", {}, run_id="ep", root=tmp_path / "runs")
    results.write_point(run, results.PointKey("endpoint", 4.0, "random"),
                        {"system_name": "endpoint", "output_throughput": 1.0, "completed": 1}, [])
    args = (["--hardware", "h100", "--name", "x"] if mode == "--fit" else
            ["--preset", "tiny", "--systems", "engine", "--rps", "4", "--num-prompts", "2"])
    msg = refused("simulate", *args, mode, "ep", "--result-dir", str(tmp_path / "runs"))
    assert f"{mode}: {run} has no point a simulation can reproduce: each is an --endpoint point" in msg
