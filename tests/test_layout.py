"""The repository's import graph: no cycle between our modules (imports inside functions and
under TYPE_CHECKING count: they hide a cycle, they do not remove it), and `engine` imports
nothing else of ours. The checker is tested on planted packages so it can fail."""
from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("dllm_bench", "engine", "baselines", "workloads")


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


def foreign_imports(graph: dict[str, set[str]], package: str) -> list[tuple[str, str]]:
    """Edges from `package` to any other of our packages."""
    return sorted((m, t) for m, ts in graph.items() if m.split(".")[0] == package
                  for t in ts if t.split(".")[0] != package)


# ---------------------------------------------------------------- the repository
@pytest.mark.parametrize("package", ["dllm_bench", "engine", "workloads", "baselines"])
def test_no_import_cycles(package):
    found = [c for c in cycles(import_graph(REPO, PACKAGES)) if any(m.split(".")[0] == package for m in c)]
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_engine_imports_nothing_else_of_ours():
    assert foreign_imports(import_graph(REPO, PACKAGES), "engine") == []


def test_only_the_cli_imports_the_commands():
    graph = import_graph(REPO, PACKAGES)
    users = sorted(m for m, ts in graph.items() for t in ts
                   if t.startswith("dllm_bench.commands") and not m.startswith("dllm_bench.commands"))
    assert users == ["dllm_bench.cli"] or users == [], users


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


def test_checker_accepts_a_dag_and_flags_engine_reaching_out(tmp_path):
    _plant(tmp_path, {"engine/__init__.py": "", "engine/core.py": "import math\n",
                      "engine/runner.py": "from engine.core import x\n",
                      "tool/__init__.py": "", "tool/use.py": "from engine.runner import y\n"})
    graph = import_graph(tmp_path, ["engine", "tool"])
    assert cycles(graph) == [] and foreign_imports(graph, "engine") == []
    _plant(tmp_path, {"engine/core.py": "def f():\n    import tool.use\n"})
    assert foreign_imports(import_graph(tmp_path, ["engine", "tool"]), "engine") == [("engine.core", "tool.use")]
