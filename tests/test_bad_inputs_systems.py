"""A `--systems` variant the command or machine cannot run is refused before the run header and
before any directory: an attention backend this device or dtype cannot run (serve, sweep, frontier), a
tensor-parallel engine in a command that runs its systems in process on one device."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("args", [
    ["serve", "--preset", "tiny", "--num-prompts", "2"],
    ["sweep", "--vary", "input-len", "--preset", "tiny", "--num-prompts", "2"],
    ["frontier", "--limit", "2", "--device", "cpu", "--dtype", "float32"],
])
@pytest.mark.parametrize("backend", ["varlen", "flash_attn"])
def test_an_attention_backend_the_device_cannot_run(refused, tmp_path, args, backend):
    # tiny runs float32 on a CPU: neither varlen kernel runs it
    msg = refused(*args, "--systems", f"engine:attention_backend={backend}", "--result-dir", str(tmp_path / "runs"))
    assert msg.startswith(f"error: system 'engine:attention_backend={backend}': attention backend {backend}")


@pytest.mark.parametrize("args, command", [
    (["frontier", "--limit", "2"], "frontier"),
    (["calibrate", "--preset", "tiny"], "calibrate"),
    (["memory", "--model", "tiny", "--memory-budget", "64MiB"], "memory"),
])
def test_a_parallel_engine_in_a_command_that_measures_one_device(refused, tmp_path, args, command):
    msg = refused(*args, "--systems", "engine:tensor_parallel_size=2",
                  *(["--out", str(tmp_path / "p.json")] if command == "calibrate" else
                    ["--result-dir", str(tmp_path / "runs")]))
    assert f"{command} measures one device (tensor_parallel_size=1)" in msg


@pytest.mark.parametrize("value, says", [
    ("engine,engine", "error: --system lists 'engine' twice"),
    (",", "error: --system is empty"),
    ("retention=0.5", "error: --system: 'retention=0.5' is a knob with no system before it"),
    ("engine:tensor_parallel_size=3", "error: system 'engine' at tensor_parallel_size 3"),
])
def test_profile_step_errors_name_its_own_flag(refused, value, says):
    """profile-step takes --system (one), not --systems or --tensor-parallel-size: its errors say so."""
    msg = refused("profile-step", "--system", value)
    assert msg.startswith(says) and "--systems" not in msg and "--tensor-parallel-size" not in msg
