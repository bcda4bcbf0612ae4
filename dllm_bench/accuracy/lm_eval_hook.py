"""Makes a bare `lm_eval --model dllm_bench --tasks dllm_synth ...` work.

lm-eval 0.4.13 discovers no third-party models or tasks (no entry points, no environment hook):
a model must be registered by imported code and a task directory passed with --include_path. This
module is imported at interpreter start by `dllm_bench_lm_eval.pth`, which `make install` writes
into the venv's site-packages. It only installs an import hook; when lm-eval itself is imported,
the hook (1) registers `dllm_bench` in lm-eval's model registry as a lazy "module:Class" target
(nothing of ours is imported until that model is asked for) and (2) adds our offline task
directory to every TaskManager. Without lm-eval in the process it costs one dict lookup per import.
Any failure here is swallowed: a hook must never break the interpreter.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

MODEL_TARGET = "dllm_bench.accuracy.lm_eval_model:DllmBenchLM"
TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"


def _after_registry(module) -> None:
    import lm_eval.models  # noqa: F401  # lm-eval's own lazy entries first: its get_model skips them once the registry is non-empty

    if "dllm_bench" not in module.model_registry:
        module.model_registry.register("dllm_bench", target=MODEL_TARGET)


def _after_tasks(module) -> None:
    cls = module.TaskManager
    original = cls.__init__

    def __init__(self, verbosity=None, include_path=None, *args, **kwargs):
        paths = [] if include_path is None else list(include_path) if isinstance(include_path, (list, tuple)) else [include_path]
        if not any(Path(p).resolve() == TASKS_DIR for p in paths):
            paths.append(str(TASKS_DIR))
        original(self, verbosity, paths, *args, **kwargs)

    cls.__init__ = __init__


_PATCHES = {"lm_eval.api.registry": _after_registry, "lm_eval.tasks": _after_tasks}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.pop(name, None)               # each name once; never leaves sys.meta_path
        if patch is None:                              # (removing a finder mid-import would skip one)
            return None
        spec = importlib.util.find_spec(name)          # the normal finders (we answer each name once)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            try:
                patch(module)
            except Exception:                          # never break lm-eval's own import
                pass

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


# The .pth line tolerates a missing module, so a venv whose checkout moved or removed this file
# still starts cleanly instead of printing an import error at every interpreter start.
PTH_NAME = "dllm_bench_lm_eval.pth"
PTH_LINE = ("import importlib.util as _u; _u.find_spec('dllm_bench') and "
            "_u.find_spec('dllm_bench.accuracy.lm_eval_hook') and __import__('dllm_bench.accuracy.lm_eval_hook')\n")


def write_pth() -> Path:
    """Write the .pth that imports this hook at interpreter start (called by `make install`)."""
    import sysconfig

    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    pth.write_text(PTH_LINE)
    return pth


try:
    install()
except Exception:
    pass
