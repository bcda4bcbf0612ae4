"""`--gen-length N` on serve/ablate/sweep: one output length for every request (the paper's
setting), a positive multiple of the block length, else one line and exit 2."""
import pytest

from dllm_bench.errors import UserError
from dllm_bench.serve.options import ServeOptions, resolve_run
from tests.test_ablate_sweep_report import _cli
from tests.test_serve import RUN_DEFAULTS


def test_gen_length_gives_every_request_the_same_output_length():
    over = {"gen_cap": 64, "num_prompts": 8, "dataset": "livebench,osc"}
    free = resolve_run(ServeOptions(**{**RUN_DEFAULTS, **over}))
    assert len({r.gen_length for r in free.workloads[("livebench", 0.5)]}) > 1   # else the test proves nothing
    run = resolve_run(ServeOptions(**{**RUN_DEFAULTS, **over, "gen_length": 24}))
    assert run.preset.gen_length == 24
    assert {r.gen_length for wl in run.workloads.values() for r in wl} == {24}
    bench = resolve_run(ServeOptions(systems="sparse-dllm", dataset="osc", rps="inf", model="tiny", num_prompts=3,
                                  gen_length=16))
    assert {r.gen_length for wl in bench.workloads.values() for r in wl} == {16}


@pytest.mark.parametrize("n", [0, -8, 12, 5])
def test_gen_length_must_be_whole_blocks(n):
    with pytest.raises(UserError, match="--gen-length must be a positive multiple of the block length"):
        resolve_run(ServeOptions(**{**RUN_DEFAULTS, "gen_length": n}))


@pytest.mark.parametrize("args, msg", [
    (["serve", "--model", "tiny", "--gen-length", "12"], "--gen-length must be a positive multiple"),
    (["ablate", "--model", "tiny", "--gen-length", "0"], "--gen-length must be a positive multiple"),
    (["sweep", "--vary", "input-len", "--model", "tiny", "--gen-length", "3"], "--gen-length must be a positive"),
    (["sweep", "--vary", "output-len", "--model", "tiny", "--gen-length", "8"], "--vary output-len sweeps"),
    (["sweep", "--vary", "input-len", "--model", "tiny", "--gen-length", "8", "--fixed-len", "16"],
     "both set the output length"),
])
def test_bad_gen_length_is_one_line_exit_2(tmp_path, monkeypatch, capsys, args, msg):
    code, out, err = _cli(monkeypatch, capsys, *args, "--result-dir", str(tmp_path / "runs"))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], err
    assert out == "" and not (tmp_path / "runs").exists()
