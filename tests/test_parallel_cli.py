"""`--tensor-parallel-size` on the CLI: CLI-spawned gloo workers give the exact LLaDA tokens,
bad sizes are one-line errors before anything is spawned, and a worker killed mid-run ends the
command at once with one `error:` line (exit 1), no traceback, no hang."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from baselines.reference_llada import reference_generate
from engine import SamplingParams
from engine.models import load_model
from tests.helpers import tiny_model
from tests.test_parallel import write_checkpoint

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dllm_bench.cli", *args], capture_output=True, text=True, env=ENV,
                          cwd=REPO, timeout=300)


def test_generate_tp2_gives_the_reference_tokens(tmp_path):
    path = write_checkpoint(tiny_model(torch.float64, seed=3), tmp_path / "tiny")
    r = cli("generate", "--model", str(path), "--tensor-parallel-size", "2", "--dtype", "float64", "--json",
            "--prompt-ids", "1,2,3", "--prompt-ids", "7,8,9,10,11,12,13", "--gen-length", "16", "--block-length", "8",
            "--steps", "8", "--max-num-logits", "5")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tensor_parallel_size"] == 2
    model = load_model(path, torch.float64)
    sp = SamplingParams(gen_length=16, steps=8, block_length=8)
    assert doc["outputs"][0]["tokens"] == reference_generate(model, [1, 2, 3], sp)[0]
    assert doc["outputs"][1]["tokens"] == reference_generate(model, [7, 8, 9, 10, 11, 12, 13], sp)[0]


def test_sizes_that_do_not_apply_are_user_errors_before_any_spawn():
    """UserError (cli.main prints it as one `error:` line, exit 2), raised in process: nothing
    was spawned (a spawn would have initialized this process's default group)."""
    import torch.distributed as dist
    import typer
    from typer.testing import CliRunner

    from dllm_bench.commands.generate import register
    from dllm_bench.errors import UserError

    app = typer.Typer()
    register(app)
    for args, says in ((["--tensor-parallel-size", "3"], "tensor-parallel size 3 does not divide n_heads = 4"),
                       (["--tp", "2", "--system", "llada"], "applies to the engine only"),
                       (["--tp", "0"], "must be >= 1")):
        r = CliRunner().invoke(app, ["--model", "tiny", "--prompt-ids", "1,2", "--gen-length", "8", "--block-length", "8",
                                     *args])
        assert isinstance(r.exception, UserError) and says in str(r.exception), (args, r.exception)
    assert not dist.is_initialized()


def _workers(pid: int) -> list[int]:
    """The processes `pid` spawned with multiprocessing (its tensor-parallel workers)."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat, cmd = Path(f"/proc/{d}/stat").read_text(), Path(f"/proc/{d}/cmdline").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and "spawn_main" in cmd:
            out.append(int(d))
    return out


def _sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def test_a_killed_worker_ends_the_cli_with_one_error():
    """The worker is killed once it has joined the process groups (store + gloo connections)
    and the generation (16 requests x 512 steps) is under way."""
    cmd = [sys.executable, "-m", "dllm_bench.cli", "generate", "--model", "tiny", "--tensor-parallel-size", "2",
           "--gen-length", "512", "--steps", "512", "--block-length", "32", "--json",
           *[a for _ in range(16) for a in ("--prompt-ids", "1,2,3")]]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not (workers := _workers(p.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers, "no worker was spawned"
        while _sockets(workers[0]) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert p.poll() is None, "the run ended before the worker was killed"
        os.kill(workers[0], 9)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1
    assert err == "error: tensor-parallel rank 1 exited mid-run (exit code -9)\n"


def test_serve_runs_the_engine_on_two_ranks(tmp_path):
    """`serve --tensor-parallel-size 2`: the point's worker process drives a 2-rank engine (its
    threads shared out among the ranks) and every request finishes."""
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "serve", "--model", "tiny", "--systems", "engine",
                        "--tensor-parallel-size", "2", "--num-prompts", "3", "--result-dir", str(tmp_path),
                        "--run-id", "tp", "--json"], capture_output=True, text=True,
                       env={**ENV, "DLLM_BENCH_NO_PROJECTION": "1"}, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    (point,) = json.loads(r.stdout)["points"]
    assert point["engine_config"]["tensor_parallel_size"] == 2 and point["completed"] == 3
    assert point["kv_pool_tokens"] > 0 and "2 tensor-parallel ranks" in point["scenario"]


def test_serving_commands_check_the_size_before_any_worker(tmp_path, monkeypatch, capsys):
    """serve, ablate and sweep take --tensor-parallel-size for their engine systems: a size the
    model cannot split is one `error:` line (exit 2) before a run directory or a worker exists."""
    import torch.distributed as dist

    from tests.test_ablate_sweep_report import _cli

    for cmd in (["serve"], ["ablate"], ["sweep", "--vary", "input-len"]):
        code, out, err = _cli(monkeypatch, capsys, *cmd, "--model", "tiny", "--tensor-parallel-size", "3",
                              "--result-dir", str(tmp_path / "runs"))
        assert (code, out) == (2, ""), (cmd, err)
        assert err == "error: system 'engine' at tensor_parallel_size 3: tensor-parallel size 3 does not divide " \
                      "n_heads = 4\n", (cmd, err)
    assert not (tmp_path / "runs").exists() and _workers(os.getpid()) == [] and not dist.is_initialized()
