"""The repository's import graph: no cycle between our modules, none between our packages (a
subpackage such as dllm_bench.serve, or a module directly in a top-level package such as
dllm_bench.errors, is one node: docs/ARCHITECTURE.md's layering), and `engine` imports nothing
else of ours. Imports inside functions and under TYPE_CHECKING count: they hide a cycle, they do
not remove it. The checker is tested on planted packages so it can fail."""
from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("dllm_bench", "engine", "baselines", "workloads")
# docs/ARCHITECTURE.md's layers, top first: a package imports only from its own layer (without a
# cycle) or the ones below. A top-level name ("engine") stands for all of that package. A new
# package or top-level module gets its line here and in docs/ARCHITECTURE.md.
D = "dllm_bench."
LAYERS: tuple[tuple[str, ...], ...] = (
    (D + "commands", D + "cli"),
    (D + "report",),
    tuple(D + p for p in ("ablate", "accuracy", "benchgpu", "doctor", "frontier", "generate", "memory_bench",
                          "profiling", "regression", "scaling", "server", "simulate", "stepprofile", "sweep", "train")),
    (D + "serve",),
    (D + "systems", D + "checkpoints", D + "inputs"),
    ("dllm_bench", *(D + m for m in ("console", "device_defaults", "errors", "metrics", "plots", "repeats",
                                     "results", "timing", "units"))),
    ("baselines", "workloads"),
    ("engine",),
)


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of `packages` under `root`."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterable[str]:
    """The modules one import statement names: `from a import b` is a.b when that is a module,
    else a (a name defined in a's __init__); relative imports resolved against `module`."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
        return
    base = node.module or ""
    if node.level:
        pkg = module.split(".") if is_package else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    for a in node.names:
        yield f"{base}.{a.name}"
        yield base  # kept only when base.name is not a module (see import_graph)


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports, from every import statement in the file
    (top level, in functions, under TYPE_CHECKING)."""
    files = module_files(root, packages)
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, f in files.items():
        tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = list(_targets(node, mod, f.name == "__init__.py"))
            if isinstance(node, ast.ImportFrom):  # pairs (base.name, base)
                names = [sub if sub in files else base for sub, base in zip(names[::2], names[1::2], strict=True)]
            graph[mod] |= {n for n in names if n in files and n != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_of(module: str) -> str:
    """The package a module belongs to: its top-level package's subpackage (dllm_bench.serve for
    dllm_bench.serve.run), or itself for a module directly in a top-level package."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with every module replaced by its package (package_of), self-edges dropped."""
    out: dict[str, set[str]] = {}
    for m, ts in graph.items():
        out.setdefault(package_of(m), set()).update(package_of(t) for t in ts if package_of(t) != package_of(m))
    return out


def layer_of(unit: str, layers: tuple[tuple[str, ...], ...]) -> int | None:
    """The index of the layer naming `unit` (or, failing that, its top-level package)."""
    for name in (unit, unit.split(".")[0]):
        for i, layer in enumerate(layers):
            if name in layer:
                return i
    return None


def layer_violations(graph: dict[str, set[str]], layers) -> list[tuple[str, str]]:
    """Package edges that go up a layer (or touch a package no layer names)."""
    pg = package_graph(graph)
    return sorted((a, b) for a, bs in pg.items() for b in bs
                  if layer_of(a, layers) is None or layer_of(b, layers) is None
                  or layer_of(b, layers) < layer_of(a, layers))


def foreign_imports(graph: dict[str, set[str]], package: str) -> list[tuple[str, str]]:
    """Edges from `package` to any other of our packages."""
    return sorted((m, t) for m, ts in graph.items() if m.split(".")[0] == package
                  for t in ts if t.split(".")[0] != package)


# ---------------------------------------------------------------- the repository
@pytest.mark.parametrize("package", ["dllm_bench", "engine", "workloads", "baselines"])
def test_no_import_cycles(package):
    found = [c for c in cycles(import_graph(REPO, PACKAGES)) if any(m.split(".")[0] == package for m in c)]
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("package", ["dllm_bench", "engine", "workloads", "baselines"])
def test_no_package_cycles(package):
    found = [c for c in cycles(package_graph(import_graph(REPO, PACKAGES))) if c[0].split(".")[0] == package]
    assert not found, "package import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_package_has_a_layer():
    units = package_graph(import_graph(REPO, PACKAGES))
    missing = sorted(u for u in units if layer_of(u, LAYERS) is None)
    assert not missing, f"no layer for {missing}: add them to LAYERS here and to docs/ARCHITECTURE.md"


def test_imports_go_down_the_layers():
    up = layer_violations(import_graph(REPO, PACKAGES), LAYERS)
    assert not up, "imports from a layer above: " + "; ".join(f"{a} -> {b}" for a, b in up)


def test_engine_imports_nothing_else_of_ours():
    assert foreign_imports(import_graph(REPO, PACKAGES), "engine") == []


TOP_LEVEL_MODULES = 12


def test_dllm_bench_keeps_a_few_top_level_modules():
    """Modules directly in dllm_bench/ (besides __init__) stay few: the rest live in the package
    of the concept they serve."""
    top = sorted(f.stem for f in (REPO / "dllm_bench").glob("*.py") if f.stem != "__init__")
    assert len(top) <= TOP_LEVEL_MODULES, f"{len(top)} top-level modules in dllm_bench/: {top}"


def test_only_the_cli_imports_the_commands():
    graph = import_graph(REPO, PACKAGES)
    users = sorted(m for m, ts in graph.items() for t in ts
                   if t.startswith("dllm_bench.commands") and not m.startswith("dllm_bench.commands"))
    assert users == ["dllm_bench.cli"] or users == [], users


# ---------------------------------------------------------------- the commands
COMMANDS = REPO / "dllm_bench" / "commands"
# A command module parses its options, calls one function of its package and prints; these
# modules only declare Typer options for several commands (each flag once) and may run longer.
DECLARATIONS = {"serve_flags.py": 150, "simulate_flags.py": 150}
COMMAND_LINES = 80


def test_command_modules_stay_thin():
    lines = {f.name: len(f.read_text(encoding="utf-8").splitlines()) for f in sorted(COMMANDS.glob("*.py"))}
    assert set(DECLARATIONS) <= set(lines), "a declaration module named here is gone: drop it from DECLARATIONS"
    long = {name: n for name, n in lines.items() if n > DECLARATIONS.get(name, COMMAND_LINES)}
    assert not long, (f"command modules over {COMMAND_LINES} lines (declaration modules: their own limit): {long}; "
                      "move the body (checks, orchestration, output) into the command's package")


def test_server_and_calibrate_build_their_systems_from_run_options():
    """Their entry points take one RunOptions (the options every command that runs a system
    shares, resolved by dllm_bench.systems.options), not loose device/dtype/budget keywords."""
    import dataclasses
    import inspect
    import typing

    from dllm_bench.server import options as server_options
    from dllm_bench.server import startup
    from dllm_bench.simulate.calibrate import plan, run
    from dllm_bench.systems.options import RunOptions

    loose = {f.name for f in dataclasses.fields(RunOptions)} | {"memory_budget", "graphs", "knobs"}
    for fn in (startup.start, startup.build_state, server_options.resolve_server_options, run.calibrate, plan.plan):
        params = inspect.signature(fn).parameters
        first = next(iter(params), None)
        hint = typing.get_type_hints(fn).get(first) if first else None
        assert isinstance(hint, type) and issubclass(hint, RunOptions), f"{fn.__qualname__}'s first parameter: {hint}"
        assert not loose & set(params), f"{fn.__qualname__} takes loose run options {sorted(loose & set(params))}"
    graph = import_graph(REPO, PACKAGES)
    for module in ("dllm_bench.server.options", "dllm_bench.simulate.calibrate.plan"):
        assert "dllm_bench.systems.options" in graph[module], f"{module} resolves its run options itself"


# ---------------------------------------------------------------- the checker itself
def _plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("a_text", [
    "from pkg import b\n",                                  # top level
    "def f():\n    from pkg.b import g\n    return g\n",    # hidden in a function
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import g\n",
    "from . import b\n",                                    # relative
])
def test_checker_finds_a_planted_cycle(tmp_path, a_text):
    _plant(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": a_text, "pkg/b.py": "import pkg.a\n",
                      "pkg/c.py": "from pkg import a\n"})
    assert cycles(import_graph(tmp_path, ["pkg"])) == [["pkg.a", "pkg.b"]]


def test_checker_sees_a_cycle_through_a_package_init(tmp_path):
    _plant(tmp_path, {"pkg/__init__.py": "from pkg.a import f\n", "pkg/a.py": "from pkg import helper\n",
                      "pkg/helper.py": "", "pkg/other.py": "from pkg import VALUE\n"})
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.helper"}                 # a submodule, not the package
    assert graph["pkg.other"] == {"pkg"}
    _plant(tmp_path, {"pkg/a.py": "from pkg import VALUE\n"})
    assert cycles(import_graph(tmp_path, ["pkg"])) == [["pkg", "pkg.a"]]


def test_checker_finds_a_package_cycle_that_no_module_cycle_shows(tmp_path):
    _plant(tmp_path, {"pkg/__init__.py": "", "pkg/errors.py": "", "pkg/tool.py": "from pkg.a.x import f\n",
                      "pkg/a/__init__.py": "", "pkg/a/x.py": "from pkg.b.y import g\nfrom pkg import errors\n",
                      "pkg/a/w.py": "", "pkg/b/__init__.py": "", "pkg/b/y.py": "",
                      "pkg/b/z.py": "def h():\n    from pkg.a import w\n"})
    graph = import_graph(tmp_path, ["pkg"])
    assert cycles(graph) == []                              # every module edge goes one way
    assert cycles(package_graph(graph)) == [["pkg.a", "pkg.b"]]
    _plant(tmp_path, {"pkg/b/z.py": "from pkg import errors\n"})   # a leaf module both use is no cycle
    assert cycles(package_graph(import_graph(tmp_path, ["pkg"]))) == []


def test_checker_flags_an_import_from_a_layer_above(tmp_path):
    _plant(tmp_path, {"pkg/__init__.py": "", "pkg/top/__init__.py": "", "pkg/top/a.py": "from pkg.low import b\n",
                      "pkg/low/__init__.py": "", "pkg/low/b.py": "", "pkg/leaf.py": ""})
    layers = (("pkg.top",), ("pkg.low",), ("pkg", "pkg.leaf"))
    assert layer_violations(import_graph(tmp_path, ["pkg"]), layers) == []
    _plant(tmp_path, {"pkg/leaf.py": "def f():\n    from pkg.low.b import g\n"})
    assert layer_violations(import_graph(tmp_path, ["pkg"]), layers) == [("pkg.leaf", "pkg.low")]


def test_checker_accepts_a_dag_and_flags_engine_reaching_out(tmp_path):
    _plant(tmp_path, {"engine/__init__.py": "", "engine/core.py": "import math\n",
                      "engine/runner.py": "from engine.core import x\n",
                      "tool/__init__.py": "", "tool/use.py": "from engine.runner import y\n"})
    graph = import_graph(tmp_path, ["engine", "tool"])
    assert cycles(graph) == [] and foreign_imports(graph, "engine") == []
    _plant(tmp_path, {"engine/core.py": "def f():\n    import tool.use\n"})
    assert foreign_imports(import_graph(tmp_path, ["engine", "tool"]), "engine") == [("engine.core", "tool.use")]


def test_module_docstrings_stay_a_few_lines():
    """A module docstring says what and why; over 15 lines it is a doc page in the wrong place
    (docs/ holds the references)."""
    long = []
    for pkg in (*PACKAGES, "benchmarks"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
            if doc and doc.count("\n") + 1 > 15:
                long.append(f"{path.relative_to(REPO)} ({doc.count(chr(10)) + 1} lines)")
    assert not long, "module docstrings over 15 lines: " + ", ".join(long)


# ---------------------------------------------------------------- the model seam
SEAM = ("engine.models", "engine.models.family", "engine.models.dense")
# names a family's code has had or would have; a module outside engine/models/ naming one bypasses the seam
FAMILY_CLASS_NAMES = {"LLaDAModelLM", "LLaDAConfig", "LLaDABlock", "load_llada", "DreamConfig", "DreamModel",
                      "DreamForCausalLM", "LLADA", "DREAM"}


def family_modules(root: Path) -> dict[str, Path]:
    """engine/models/<family>.py files: everything in engine.models but the seam itself."""
    return {m: f for m, f in module_files(root, ["engine"]).items() if m.startswith("engine.models.") and m not in SEAM}


def seam_leaks(root: Path, packages: Iterable[str]) -> list[tuple[str, str]]:
    """(module, what) for every module outside engine.models that imports a family module or names
    one of a family's top-level definitions (or FAMILY_CLASS_NAMES)."""
    fams = family_modules(root)
    names = set(FAMILY_CLASS_NAMES)
    for f in fams.values():
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_"):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name) and not t.id.startswith("_")}
    out = []
    for mod, f in module_files(root, packages).items():
        if mod == "engine.models" or mod.startswith("engine.models."):
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                hit = [node.module] if node.module in fams else []
                hit += [a.name for a in node.names if f"{node.module}.{a.name}" in fams or a.name in names]
            elif isinstance(node, ast.Import):
                hit = [a.name for a in node.names if a.name in fams]
            elif isinstance(node, ast.Name):
                hit = [node.id] if node.id in names else []
            elif isinstance(node, ast.Attribute):
                hit = [node.attr] if node.attr in names else []
            else:
                continue
            out += [(mod, h) for h in hit]
    return sorted(set(out))


def test_no_module_outside_the_models_names_a_family():
    leaks = seam_leaks(REPO, PACKAGES)
    assert not leaks, "family code named outside engine/models/ (use engine.models' seam): " + "; ".join(
        f"{m}: {w}" for m, w in leaks)


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


@pytest.mark.parametrize("leak", ["from engine.models.llada import LLADA\n", "import engine.models.llada\n",
                                  "from engine.models import llada\n", "x = LLaDAModelLM\n",
                                  "from engine.models.llada import helper\n"])
def test_the_seam_check_fails_on_a_planted_leak(tmp_path, leak):
    root = _plant(tmp_path, {"engine/__init__.py": "", "engine/models/__init__.py": "",
                             "engine/models/family.py": "class ModelConfig: pass\n",
                             "engine/models/llada.py": "LLADA = 1\ndef helper(): pass\n",
                             "app/__init__.py": "", "app/ok.py": "from engine.models import ModelConfig\n",
                             "app/bad.py": leak})
    leaks = seam_leaks(root, ["engine", "app"])
    assert leaks and all(m == "app.bad" for m, _ in leaks), leaks
