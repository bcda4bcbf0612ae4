"""The engine's step budgets scaled with the GPU (dllm_bench.systems.step_budgets), on a CUDA faked on
the CPU (mem_get_info and the device name patched, as in test_cuda_defaults): the budgets the
paper preset chooses at LLaDA-8B's shape on a 24, 48 and 80 GB card, a given value winning (flag,
preset number, variant knob), the preset line and config.json saying why, the simulator choosing
as a measured GPU with the same budget does, the server and generate on CUDA, nothing changed
on a CPU."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dllm_bench.checkpoints.presets import param_count
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.simulate.simulator import resolve_sim_model
from dllm_bench.systems import ridge
from dllm_bench.systems import step_budgets as sb
from dllm_bench.systems.spec import engine_knobs, parse_system
from engine.models import ModelConfig, config_from_pretrained
from tests.standins.peaks import fake_peaks
from tests.test_inputs import cli  # noqa: F401  (the fixture)

MiB, GiB = 2**20, 2**30
LLADA_8B = Path(__file__).resolve().parent / "data" / "llada-8b-instruct"
# (device name, total memory as the driver reports it); 600 MiB of it taken by the CUDA context.
CARDS = {"24GB": ("NVIDIA GeForce RTX 4090", 24564 * MiB), "48GB": ("NVIDIA L40S", 46068 * MiB),
         "80GB": ("NVIDIA H100 80GB HBM3", 81559 * MiB)}


class Card:
    def __init__(self, name: str, total: int):
        self.name, self.total, self.free = name, total, total - 600 * MiB


@pytest.fixture
def gpu(monkeypatch):
    """A fake CUDA whose card the test picks (`gpu(size)`)."""
    state = {}

    def pick(size: str) -> Card:
        state["card"] = Card(*CARDS[size])
        return state["card"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["card"].free, state["card"].total))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: state["card"].name)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(total_memory=state["card"].total))
    monkeypatch.setattr(ridge, "peak_rates", fake_peaks)   # the ridge's peaks, not timed on a fake GPU
    pick("80GB")
    return pick


def stand_in_model(device, config: ModelConfig | None = None, dtype: torch.dtype = torch.bfloat16):
    """What the budget rule reads of a loaded model, without its weights: device, dtype, config
    and parameter sizes (LLaDA-8B's by default)."""
    c = config or config_from_pretrained(LLADA_8B)
    n = param_count(c.d_model, c.n_layers, c.kv_heads * c.head_dim, c.mlp_hidden_size, c.padded_vocab)
    weights = SimpleNamespace(numel=lambda: n, element_size=lambda: dtype.itemsize)
    return SimpleNamespace(device=torch.device(device), dtype=dtype, config=c, parameters=lambda: [weights])


def _paper(**over):
    args = dict(preset="paper", model=str(resolve_sim_model("llada-8b")[0]), systems="engine,fast-dllm",
                num_prompts=4, rps="inf", **over)
    return resolve_run(ServeOptions(**args), weights=False, wall_clock=False)


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize("size, tokens", [("24GB", 4096), ("48GB", 16384), ("80GB", 32768)])
def test_paper_preset_budgets_scale_with_the_card_at_llada_8b_shape(gpu, size, tokens):
    """24 GB: 6.1 GiB left after the 14.9 GiB of bf16 weights -> 4,019 -> 4,096 (the paper's
    4090 ran 4,000); 48 GB: 25.0 GiB -> 16,405 -> 16,384 (the paper's L40S); 80 GB: 56 GiB ->
    36,848, capped at 32,768. The logit budget never limits a step: 64 sequences x block 32."""
    card = gpu(size)
    run = _paper()
    p = run.preset
    assert (p.max_num_batched_tokens, p.max_num_logits) == (tokens, 2048)
    assert p.max_num_batched_tokens % sb.MULTIPLE == 0
    assert run.engine_defaults["max_num_batched_tokens"] == tokens
    line = p.describe()
    assert f"token budget {tokens} (auto: " in line and f"free after weights on {card.name}" in line
    assert "logit budget 2048 rows (auto: max_num_seqs 64 x block 32)" in line
    assert ("capped at 32768" in line) == (size == "80GB")
    cfg = run.describe()          # what config.json records
    assert cfg["preset"]["max_num_batched_tokens"] == tokens and cfg["preset"]["tokens_rule"].startswith("auto: ")
    assert cfg["preset_line"] == line


def test_a_given_budget_wins_flag_preset_and_knob(gpu):
    gpu("48GB")
    run = _paper(max_num_batched_tokens=4000)
    assert run.preset.max_num_batched_tokens == 4000 and "token budget 4000 (given)" in run.preset.describe()
    assert run.preset.max_num_logits == 2048                               # the other still auto
    run = _paper(max_num_logits="none")
    assert run.preset.max_num_logits is None and "logit budget monolithic (given)" in run.preset.describe()
    # A variant's knob wins over the run's chosen value.
    knobs = engine_knobs(parse_system("engine:max_num_batched_tokens=1234"), _paper().engine_defaults)
    assert knobs["max_num_batched_tokens"] == 1234
    # A preset with its own numbers (here tiny, moved to the GPU) keeps them and says nothing more.
    tiny = resolve_run(ServeOptions(preset="tiny", model="tiny", systems="engine", num_prompts=2, device="cuda"))
    assert (tiny.preset.max_num_batched_tokens, tiny.preset.max_num_logits) == (256, 64)
    assert "(given)" not in tiny.preset.describe() and "auto" not in tiny.preset.describe()


def test_bounds_of_the_rule():
    kw = dict(max_num_seqs=8, block_length=32, gpu="G", weights_bytes=0, activation_per_token=1000)
    small = sb.step_budgets(tokens=None, logits=sb.AUTO, longest_canvas=3000, budget_bytes=10**6, **kw)
    assert small.max_num_batched_tokens == 3000 and "raised to the longest canvas 3000" in small.tokens_rule
    big = sb.step_budgets(tokens=None, logits=sb.AUTO, longest_canvas=10, budget_bytes=10**12, **kw)
    assert big.max_num_batched_tokens == sb.MAX_TOKENS and big.max_num_logits == 8 * 32
    mid = sb.step_budgets(tokens=sb.AUTO, logits=sb.AUTO, longest_canvas=10, budget_bytes=10**8, **kw)
    assert mid.max_num_batched_tokens == round(10**8 * sb.ACTIVATION_SHARE / 1000 / 256) * 256
    capped = sb.step_budgets(tokens=200, logits=sb.AUTO, longest_canvas=10, budget_bytes=10**8, **kw)
    assert capped.max_num_logits == 200 and "capped at the token budget" in capped.logits_rule
    assert capped.tokens_rule == "given"
    cpu = sb.step_budgets(tokens=None, logits=sb.AUTO, max_num_seqs=8, block_length=32, longest_canvas=10)
    assert (cpu.max_num_batched_tokens, cpu.max_num_logits) == (sb.FALLBACK_TOKENS, sb.FALLBACK_LOGITS)


# ---------------------------------------------------------------- where runs are built
def test_on_a_cpu_nothing_changes():
    run = resolve_run(ServeOptions(preset="tiny", model="tiny", systems="engine", num_prompts=2))
    assert (run.preset.max_num_batched_tokens, run.preset.tokens_rule) == (256, "")
    paper = _paper(device="cpu", memory_budget="20GiB")      # the paper preset on a CPU: the 4090's values
    assert (paper.preset.max_num_batched_tokens, paper.preset.max_num_logits) == (4000, 2048)
    assert "auto on a CPU" in paper.preset.describe()
    assert run.engine_defaults["ridge_rows"] == ridge.CPU_RIDGE_ROWS and "ridge 8 rows (a CPU" in run.preset.describe()


def test_the_simulator_chooses_as_a_measured_gpu_with_the_same_budget(gpu):
    from dllm_bench.simulate.hardware import load
    from dllm_bench.simulate.options import simulation

    hw = load("l40s")
    sim, _ = simulation(ServeOptions(preset="paper", systems="engine,fast-dllm", num_prompts=4, rps="inf"), hw)
    card = gpu("48GB")
    card.free = int(hw.memory_bytes)            # the same budget: 0.9 x the memory the profile models
    measured = _paper()
    assert measured.memory_budget == sim.memory_budget
    assert sim.preset.max_num_batched_tokens == measured.preset.max_num_batched_tokens
    assert sim.preset.max_num_logits == measured.preset.max_num_logits
    assert "on l40s (simulated)" in sim.preset.describe()
    # the ridge cache=auto weighs: the profile's peaks x bf16 (269 TFLOP/s / 0.734 TB/s), as a
    # measured GPU's own peaks (an H100's stand-in: 262); a CPU profile: a measured CPU's constant
    assert sim.engine_defaults["ridge_rows"] == 366 and "l40s's peaks" in sim.preset.describe()
    assert measured.engine_defaults["ridge_rows"] == 262 and "ridge 262 rows (measured on" in measured.preset.describe()
    cpu, _ = simulation(ServeOptions(preset="tiny", model="tiny", systems="engine", num_prompts=2), load("cpu"))
    assert cpu.engine_defaults["ridge_rows"] == ridge.CPU_RIDGE_ROWS


def test_server_on_cuda_scales_its_budgets(gpu):
    from dllm_bench import inputs
    from dllm_bench.server.options import ServerOptions, resolve_server_options

    gpu("48GB")
    opts = resolve_server_options(ServerOptions(model=str(inputs.checkpoint_dir("tiny")), preset="paper"))
    d = opts.preset.engine_defaults()
    assert d["max_num_batched_tokens"] == sb.MAX_TOKENS      # a tiny model: its activations are small
    assert d["max_num_logits"] == 64 * 32 and opts.preset.tokens_rule.startswith("auto: ")
    assert d["ridge_rows"] == 262


def test_generate_on_cuda_scales_unless_given(gpu, cli, monkeypatch):  # noqa: F811
    from dllm_bench.errors import UserError
    from dllm_bench.systems import inprocess as generate  # where generate's systems are built

    seen = {}

    def fake_make_system(name, model, *, engine_config, **kw):
        seen["config"] = engine_config
        raise UserError("stop before the engine is built")
    monkeypatch.setattr(generate, "load_model", lambda spec, dtype, device: stand_in_model(device))
    monkeypatch.setattr(generate, "make_system", fake_make_system)
    card = gpu("24GB")
    card.free -= 16031162368            # LLaDA-8B's bf16 weights are on the card once it is loaded
    cli("generate", "--prompt-ids", "1,2,3")
    assert (seen["config"].max_num_batched_tokens, seen["config"].max_num_logits) == (4096, 64 * 32)
    assert seen["config"].ridge_rows == 262
    cli("generate", "--prompt-ids", "1,2,3", "--max-num-batched-tokens", "1000", "--max-num-logits", "7")
    assert (seen["config"].max_num_batched_tokens, seen["config"].max_num_logits) == (1000, 7)
    cli("generate", "--prompt-ids", "1,2,3", "--device", "cpu")
    assert (seen["config"].max_num_batched_tokens, seen["config"].max_num_logits) == (8192, 1024)
    assert seen["config"].ridge_rows == ridge.CPU_RIDGE_ROWS

