"""`dllm-bench doctor` on this CPU machine: every row, exit 0, --json; a failing check (a broken
checkpoint, tokens that differ from the reference sampler, a check that raises) is a clear row and
exit 1; bad input is one line and exit 2. The GPU-only paths are checked with a faked CUDA."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from dllm_bench.cli import app
from dllm_bench.doctor import checks, generation, layer_timing, report
from dllm_bench.doctor.checks import FAIL, OK, SKIP, WARN, Check
from tests.helpers import one_error_line

ROWS = ("device", "torch", "attention", "dtypes", "memory", "checkpoint", "generate", "generate bf16",
        "layer timing")


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A cache without a calibrated profile of this machine: the built-in `cpu` profile is used."""
    monkeypatch.setenv("DLLM_BENCH_CACHE", str(tmp_path / "cache"))
    return {**os.environ, "DLLM_BENCH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "2"}


def test_doctor_end_to_end_on_this_cpu(env):
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "doctor"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = " ".join(r.stdout.split())
    for row in ROWS:
        assert f"│ {row} " in r.stdout, row
    assert "no GPU" in out and "16 tokens equal to the reference sampler" in out
    assert "simulated on profile 'cpu'" in out and "measured/simulated" in out
    assert "next:" in out and "docs/GPU.md" in out


def _fast_layer(monkeypatch):
    monkeypatch.setattr(layer_timing, "layer_check",
                        lambda dev: Check("layer timing", OK, "stubbed", {"measured_ms": 1.0, "simulated_ms": 1.0}))


def _invoke(*args):
    return CliRunner().invoke(app, ["doctor", *args])


def test_doctor_json_is_one_document(env, monkeypatch):
    _fast_layer(monkeypatch)
    r = _invoke("--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and [c["name"] for c in doc["checks"]] == list(ROWS)
    assert {c["status"] for c in doc["checks"]} <= {OK, WARN, SKIP}
    gen = next(c for c in doc["checks"] if c["name"] == "generate")
    assert gen["data"]["tokens"] == gen["data"]["reference"] and len(gen["data"]["tokens"]) == generation.GEN
    assert doc["next"]


def test_a_broken_checkpoint_fails_its_row_and_the_exit_code(env, monkeypatch, tmp_path):
    _fast_layer(monkeypatch)
    src = generation._model_dir()
    bad = tmp_path / "ckpt"
    bad.mkdir()
    (bad / "config.json").write_text((src / "config.json").read_text())
    (bad / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:5000])   # a cut download
    r = _invoke("--json", "--model", str(bad))
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    row = next(c for c in doc["checks"] if c["name"] == "checkpoint")
    assert row["status"] == FAIL and "corrupt safetensors file model.safetensors" in row["detail"]
    assert doc["ok"] is False and "checkpoint" in doc["next"][0]
    # the good checkpoint passes, with its size in the row
    good = _invoke("--json", "--model", str(src))
    row = next(c for c in json.loads(good.stdout)["checks"] if c["name"] == "checkpoint")
    assert good.exit_code == 0 and row["status"] == OK and "config and index match" in row["detail"]


def test_tokens_that_differ_from_the_reference_fail(env, monkeypatch):
    _fast_layer(monkeypatch)
    real = generation.reference_generate

    def off_by_one(model, prompt, params):
        toks, nfe = real(model, prompt, params)
        return [toks[0] + 1, *toks[1:]], nfe

    monkeypatch.setattr(generation, "reference_generate", off_by_one)
    r = _invoke()
    assert r.exit_code == 1
    text = " ".join(r.stdout.split())
    assert "│ generate │ fail │" in text and "1 of 16 tokens differ, first at position 0" in text


def test_a_check_that_raises_is_a_failed_row_and_the_rest_still_run(env, monkeypatch):
    _fast_layer(monkeypatch)

    def broken(dev):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(checks, "dtype_check", broken)
    doc = json.loads(_invoke("--json").stdout)
    by = {c["name"]: c for c in doc["checks"]}
    assert by["dtypes"]["status"] == FAIL and "no kernel image" in by["dtypes"]["detail"]
    assert by["generate"]["status"] == OK and not doc["ok"]


def test_bad_input_is_one_line_and_exit_2(tmp_path, cli_in_process):
    for args in (["--model", str(tmp_path / "nope")], ["--device", "tpu"]):
        r = cli_in_process("doctor", *args)
        one_error_line(r)


# ---------------------------------------------------------------- GPU paths, CUDA faked
def test_gpu_names_pick_their_built_in_profile():
    names = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200", "NVIDIA A100-SXM4-80GB": "a100-80g",
             "NVIDIA A100 80GB PCIe": "a100-80g", "NVIDIA A100-SXM4-40GB": None, "NVIDIA L40S": "l40s",
             "NVIDIA GeForce RTX 4090": "rtx4090", "Tesla V100-SXM2-16GB": None}
    for name, prof in names.items():
        assert layer_timing.profile_for_gpu(name) == prof, name


def test_on_a_faked_gpu_the_profile_memory_and_attention_rows(monkeypatch):
    from dllm_bench.simulate import hardware

    cuda = torch.device("cuda:0")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    hw, why = layer_timing._hardware(cuda)
    assert hw.name == "h100" and hw.path.endswith("hardware/h100.json") and not why
    cfg = layer_timing.llada_8b_layer_config()
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.mlp_hidden_size) == (4096, 1, 32, 12288)
    # one LLaDA-8B layer over 4096 tokens: ~2.1 TFLOP, a few ms on an H100
    assert 2.6e-3 < layer_timing.predicted_s(hw, cfg, 2, 4096) < 20e-3
    cpu = hardware.load(str(hardware.BUILTIN_DIR / "cpu.json"))
    t = layer_timing.pick_tokens(lambda n: layer_timing.predicted_s(cpu, cfg, 4, n))
    assert layer_timing.predicted_s(cpu, cfg, 4, t) <= layer_timing.TARGET_S and t in layer_timing.TOKENS
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla V100-SXM2-16GB")
    hw, why = layer_timing._hardware(cuda)
    assert hw is None and "no built-in profile matches 'Tesla V100-SXM2-16GB'" in why

    import dllm_bench.device_defaults as dd

    monkeypatch.setattr(dd, "free_device_memory", lambda d: (16 * 2**30, 24 * 2**30))
    row = checks.memory_check(cuda)
    assert row.status == WARN and "too small for LLaDA-8B's bf16 weights" in row.detail
    monkeypatch.setattr(dd, "free_device_memory", lambda d: (79 * 2**30, 80 * 2**30))
    assert checks.memory_check(cuda).status == OK

    import torch.nn.attention.varlen as torch_varlen

    from engine import attention

    err = "OSError: flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"
    monkeypatch.delattr(torch_varlen, "varlen_attn")                   # a torch before 2.10
    monkeypatch.setattr(attention, "flash_attn_import_error", lambda: err)
    row = checks.attention_check(cuda)
    assert row.status == WARN and err in row.detail and "attention: padded SDPA" in row.detail
    assert row.data["backend"] == "sdpa" and row.data["torch_varlen"] is False

    gpu = [Check("device", OK, "h100", {"type": "cuda"}), Check("attention", WARN, err),
           Check("memory", OK, "", {"total": 80 * 2**30}), Check("layer timing", OK, "", {"profile": "h100"})]
    nxt = report.next_commands(gpu, None)
    assert nxt[0].startswith("dllm-bench doctor --model") and any("pip install" in x for x in nxt)
    assert any("profile --model llada-8b --device-memory 80GiB" in x for x in nxt)
    assert any(x.startswith("dllm-bench calibrate --device cuda") for x in nxt)


def test_cpu_bf16_is_reported_emulated_without_the_flags(monkeypatch):
    monkeypatch.setattr(checks, "cpu_flags", lambda path=checks.CPUINFO: {"avx2", "fma"})
    row = checks.dtype_check(torch.device("cpu"))
    assert row.status == OK and "emulated (slow" in row.detail and row.data["bf16"] == "emulated"
    monkeypatch.setattr(checks, "cpu_flags", lambda path=checks.CPUINFO: {"amx_bf16", "avx512_bf16"})
    assert "native (amx_bf16, avx512_bf16)" in checks.dtype_check(torch.device("cpu")).detail


def test_a_gpu_machine_with_a_cpu_torch_warns(monkeypatch):
    monkeypatch.setattr(checks, "nvidia_driver", lambda path=checks.NVIDIA_PROC: "550.54.15")
    monkeypatch.setattr(torch.version, "cuda", None)
    row = checks.device_check(torch.device("cpu"))
    assert row.status == WARN and "550.54.15" in row.detail and "CPU build" in row.detail
    # `--device cpu` on a machine whose GPU torch can use is a choice, not a problem
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    row = checks.device_check(torch.device("cpu"))
    assert row.status == OK and "2 CUDA device(s) present" in row.detail
