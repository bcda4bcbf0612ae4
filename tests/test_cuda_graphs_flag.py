"""`--cuda-graphs/--no-cuda-graphs` and the `engine:cuda_graphs=` knob reach the EngineConfig a
command builds, resolved for the device (on for CUDA, off on a CPU, an explicit flag wins) so
config.json says what ran. CUDA is faked (tests.test_cuda_defaults.cuda); every test stops where
the options have become a config, before a model would be put on the fake device."""
from __future__ import annotations

from dataclasses import replace

import pytest

from dllm_bench import inputs
from dllm_bench.device_defaults import cuda_graphs_on
from dllm_bench.errors import UserError
from dllm_bench.serve.presets import DEFAULT_PRESET, GPU_PRESET
from dllm_bench.systems.spec import engine_knobs, parse_system
from engine.config import EngineConfig
from tests.test_cuda_defaults import AUTO, cuda  # noqa: F401  (the fixture)
from tests.test_inputs import cli  # noqa: F401  (the fixture)
from tests.test_serve import RUN_DEFAULTS
from tests.test_step_budgets import stand_in_model


def test_the_default_is_on_for_cuda_only_and_a_flag_wins(cuda):  # noqa: F811
    assert cuda_graphs_on(None, "auto") and cuda_graphs_on(None, "cuda:0")
    assert not cuda_graphs_on(None, "cpu")
    assert cuda_graphs_on(True, "cpu") and not cuda_graphs_on(False, "cuda")


def test_cpu_default_is_off():
    assert not cuda_graphs_on(None, "auto") and not cuda_graphs_on(None, None)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
@pytest.mark.parametrize("flag", [None, True, False])
def test_the_command_and_the_engine_decide_alike(device, flag):
    """What a command records (device_defaults) is what the engine runs (engine.config.cuda_graphs_on)."""
    import torch

    from engine.config import cuda_graphs_on as engine_rule

    assert cuda_graphs_on(flag, device) == engine_rule(EngineConfig(cuda_graphs=flag).cuda_graphs, torch.device(device))


def test_engine_knob_parses_booleans_and_overrides_the_runs_value():
    off = parse_system("engine:cuda_graphs=false")
    assert off.knob_dict == {"cuda_graphs": False} and off.label == "engine:cuda_graphs=False"
    assert parse_system("engine:cuda-graphs=on").knob_dict == {"cuda_graphs": True}
    assert engine_knobs(off, {"cuda_graphs": True, "retention": 0.5}) == {"cache": "auto", "cuda_graphs": False,
                                                                            "retention": 0.5}
    assert engine_knobs(parse_system("engine"), {"cuda_graphs": True})["cuda_graphs"] is True
    with pytest.raises(UserError, match="knob cuda_graphs: expected true/false"):
        parse_system("engine:cuda_graphs=sometimes")


# ---------------------------------------------------------------- generate
def _generate_config(cli, monkeypatch, *args):  # noqa: F811
    """The EngineConfig `generate ARGS` hands to make_system (stopped there: no model is built)."""
    from dllm_bench.systems import inprocess as generate  # where generate's systems are built

    seen = {}

    def fake_make_system(name, model, *, engine_config, **kw):
        seen["config"] = engine_config
        raise UserError("stop before the engine is built")
    monkeypatch.setattr(generate, "load_model", lambda spec, dtype, device: stand_in_model(device))
    monkeypatch.setattr(generate, "make_system", fake_make_system)
    assert "stop before" in cli("generate", "--prompt-ids", "1,2,3", *args)
    return seen["config"]


def test_generate_takes_graphs_on_cuda_by_default(cuda, cli, monkeypatch):  # noqa: F811
    cfg = _generate_config(cli, monkeypatch)
    assert (cfg.device, cfg.cuda_graphs) == ("cuda", True)
    assert _generate_config(cli, monkeypatch, "--no-cuda-graphs").cuda_graphs is False
    assert _generate_config(cli, monkeypatch, "--device", "cpu").cuda_graphs is False


def test_generate_on_cpu_is_off_unless_asked(cli, monkeypatch):  # noqa: F811
    cfg = _generate_config(cli, monkeypatch)
    assert (cfg.device, cfg.cuda_graphs) == ("cpu", False)
    assert _generate_config(cli, monkeypatch, "--cuda-graphs").cuda_graphs is True


# ---------------------------------------------------------------- serve (and ablate, sweep: serve's options)
def _run(**over):
    from dllm_bench.serve.options import ServeOptions, resolve_run

    return resolve_run(ServeOptions(**{**RUN_DEFAULTS, "systems": "engine,engine:cuda_graphs=false",
                                       "num_prompts": 2, **over}))


def _engine_configs(run) -> list[EngineConfig]:
    """The EngineConfig knobs each engine variant's worker gets (worker_spec -> engine_knobs)."""
    from dllm_bench.serve.process import worker_spec
    from dllm_bench.serve.workload import workload_shape

    wl, shape = next(iter(run.workloads.values())), workload_shape(run)
    specs = [worker_spec(run, v, wl, shape) for v in run.systems]
    return [EngineConfig(**engine_knobs(v, s["engine_defaults"])) for v, s in zip(run.systems, specs, strict=True)]


def test_serve_on_cuda_resolves_graphs_on_and_a_variant_can_switch_them_off(cuda):  # noqa: F811
    run = _run(preset="paper", length_scale=0.05, gen_length=32, gen_cap=32)
    assert run.preset.device == "cuda" and run.preset.cuda_graphs is True
    cfg = run.describe()                        # what config.json records
    assert cfg["preset"]["cuda_graphs"] is True and cfg["engine_defaults"]["cuda_graphs"] is True
    assert [c.cuda_graphs for c in _engine_configs(run)] == [True, False]
    assert _run(preset="paper", length_scale=0.05, gen_length=32, gen_cap=32,
                cuda_graphs=False).describe()["engine_defaults"]["cuda_graphs"] is False
    # A CPU run on a CUDA machine: off, as on a CPU-only one.
    assert _run(device="cpu").preset.cuda_graphs is False


def test_serve_on_cpu_is_off_and_the_flag_reaches_the_built_engine(tmp_path):
    from dllm_bench.systems.build import build_system

    run = _run()
    assert run.preset.cuda_graphs is False and run.describe()["engine_defaults"]["cuda_graphs"] is False
    run = _run(cuda_graphs=True)
    assert [c.cuda_graphs for c in _engine_configs(run)] == [True, False]
    p = run.preset
    built = build_system(run.systems[0], model_dir=run.model_dir, dtype=p.dtype, device=p.device,
                         memory_budget=run.memory_budget, engine_defaults=run.engine_defaults,
                         cache_dir=tmp_path, use_cache=False)
    assert built.system.config.cuda_graphs is True and built.info["engine_config"]["cuda_graphs"] is True


@pytest.mark.parametrize("command, module, target", [("serve", "serve.run", "resolve_run"),
                                                     ("ablate", "commands.ablate", "ablate"),
                                                     ("sweep", "commands.sweep", "sweep")])
def test_serve_ablate_sweep_cli_take_the_flag(command, module, target, cli, monkeypatch):  # noqa: F811
    """The flag is one of serve's options: each command hands it on in its ServeOptions."""
    import importlib

    seen = {}

    def fake(opts, **kw):
        seen["opts"] = opts
        raise UserError("stop before the run")
    monkeypatch.setattr(importlib.import_module(f"dllm_bench.{module}"), target, fake)
    extra = ("--vary", "input-len") if command == "sweep" else ()
    for args, want in (((), None), (("--cuda-graphs",), True), (("--no-cuda-graphs",), False)):
        cli(command, "--model", "tiny", *extra, *args)
        assert seen["opts"].cuda_graphs is want


def _capture_resolve(monkeypatch, module) -> dict:
    seen = {}

    def fake_resolve(opts, **kw):
        seen["opts"] = opts
        raise UserError("stop before the run")
    monkeypatch.setattr(module, "resolve_run", fake_resolve)
    return seen


def _command(which: str):
    """(the module that resolves the run, the command called as its CLI calls it)."""
    import dllm_bench.ablate.run as ablate_run
    import dllm_bench.sweep.run as sweep_run

    if which == "ablate":
        return ablate_run, lambda o, **kw: ablate_run.ablate(o, datasets="livebench", cache_rows="none", **kw)
    return sweep_run, lambda o, **kw: sweep_run.sweep(o, vary="input-len", points=None, fixed_len=None, **kw)


def _first_options(module, cmd, monkeypatch):
    """The ServeOptions `ablate`/`sweep` resolve their run from, for a checkpoint dir (stopped there)."""
    from dllm_bench.serve.options import ServeOptions

    seen = _capture_resolve(monkeypatch, module)
    with pytest.raises(UserError, match="stop before"):
        cmd(ServeOptions(model=str(inputs.checkpoint_dir("tiny")), num_prompts=2, rps="inf"),
            result_dir=None, run_id=None, resume=False, as_json=False)
    return seen["opts"]


@pytest.mark.parametrize("which", ["ablate", "sweep"])
def test_ablate_and_sweep_with_a_checkpoint_dir_on_cuda_take_the_gpu_preset(which, cuda, monkeypatch):  # noqa: F811
    """Was: both picked cpu-default for a checkpoint dir whatever the device (float32, 1300 MiB)."""
    from dllm_bench.serve.options import resolve_run

    opts = _first_options(*_command(which), monkeypatch)
    assert opts.preset == GPU_PRESET
    run = resolve_run(replace(opts, length_scale=0.05, gen_length=32, gen_cap=32))   # the real one
    assert (run.preset.dtype, run.preset.device, run.preset.cuda_graphs) == ("bfloat16", "cuda", True)
    assert run.memory_budget == AUTO


@pytest.mark.parametrize("which", ["ablate", "sweep"])
def test_ablate_and_sweep_with_a_checkpoint_dir_on_cpu_keep_the_cpu_preset(which, monkeypatch):
    assert _first_options(*_command(which), monkeypatch).preset == DEFAULT_PRESET


# ---------------------------------------------------------------- server
def _server(**over):
    from dllm_bench.server.options import ServerOptions, resolve_server_options

    return resolve_server_options(ServerOptions(**{"model": "tiny", **over}))


def test_server_resolves_graphs_for_its_device(cuda):  # noqa: F811
    opts = _server(model=str(inputs.checkpoint_dir("tiny")))
    assert opts.device == "cuda" and opts.preset.engine_defaults()["cuda_graphs"] is True
    assert _server(model=str(inputs.checkpoint_dir("tiny")), cuda_graphs=False).preset.engine_defaults()["cuda_graphs"] is False
    assert _server(device="cpu").preset.cuda_graphs is False


def test_server_builds_its_engine_with_the_flag(monkeypatch):
    """build_state hands the resolved value to the engine it builds (stopped there, on the CPU)."""
    from dllm_bench.server import startup
    from dllm_bench.server.options import ServerOptions

    seen = {}

    def fake_build(variant, *, engine_defaults, **kw):
        seen["config"] = EngineConfig(**engine_knobs(variant, engine_defaults))
        raise UserError("stop before the engine is built")
    monkeypatch.setattr(startup, "build_system", fake_build)
    for flag, want in ((None, False), (True, True)):
        with pytest.raises(UserError, match="stop before"):
            startup.build_state(ServerOptions(model="tiny", max_waiting=8, sampling=False, no_profile_cache=True,
                                              cuda_graphs=flag))
        assert seen["config"].cuda_graphs is want


def test_server_cli_passes_the_flag(cli, monkeypatch):  # noqa: F811
    from dllm_bench.commands import server as server_cmd

    seen = {}

    def fake_start(o):
        seen["opts"] = o
        raise UserError("stop before the server starts")
    monkeypatch.setattr(server_cmd, "start", fake_start)
    for args, want in (((), None), (("--cuda-graphs",), True), (("--no-cuda-graphs",), False)):
        cli("server", "--model", "tiny", *args)
        assert seen["opts"].cuda_graphs is want


# ---------------------------------------------------------------- accuracy
def test_accuracy_points_get_the_runs_resolved_value(cuda):  # noqa: F811
    from dllm_bench.accuracy.run import device_options

    assert device_options("auto", None, "auto", 64, 32)[1]["cuda_graphs"] is True
    assert device_options("auto", None, "auto", 64, 32, cuda_graphs=False)[1]["cuda_graphs"] is False
    assert device_options("cpu", None, "auto", 64, 32)[1]["cuda_graphs"] is False


def test_accuracy_cli_records_the_flag_and_builds_the_engine_with_it(tmp_path, monkeypatch):
    """`accuracy --cuda-graphs` on the CPU: config.json says true and each engine point runs with it
    (one tiny-math point of one sample)."""
    import json

    from dllm_bench.cli import main
    from dllm_bench.systems import inprocess  # where accuracy's systems are built

    built = []
    real = inprocess.make_system

    def spy(name, model, *, engine_config=None, **kw):
        built.append(engine_config)
        return real(name, model, engine_config=engine_config, **kw)
    monkeypatch.setattr(inprocess, "make_system", spy)
    monkeypatch.setattr("sys.argv", ["dllm-bench", "accuracy", "--model", "tiny-math", "--task", "synth",
                                     "--limit", "1", "--retention", "0.5", "--selection", "head", "--no-r1",
                                     "--cuda-graphs", "--result-dir", str(tmp_path), "--run-id", "g", "--json"])
    main()
    cfg = json.loads((tmp_path / "g" / "config.json").read_text())
    assert cfg["config"]["cuda_graphs"] is True
    assert built and all(c.cuda_graphs is True for c in built)
