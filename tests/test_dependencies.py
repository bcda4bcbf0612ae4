"""pyproject.toml declares what the code imports: every third-party module imported anywhere in the
product (functions included) belongs to a distribution pyproject names, and pyproject declares no
entry point that nothing reads (lm-eval 0.4.13 reads none: dllm_bench.accuracy.lm_eval_hook)."""
from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("dllm_bench", "engine", "baselines", "workloads")
# Modules whose distribution is not found by import name (not installed here) -> distribution.
NOT_INSTALLED = {"flash_attn": "flash-attn", "pynvml": "nvidia-ml-py"}
# Imported directly as part of FastAPI's own API (request models, responses): their versions come
# with the fastapi pin, which requires them.
VIA = {"pydantic": "fastapi", "starlette": "fastapi"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(root: Path = REPO) -> set[str]:
    mods: set[str] = set()
    for pkg in PACKAGES:
        for f in (root / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    mods |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    mods.add(node.module.split(".")[0])
    return mods - set(PACKAGES) - set(sys.stdlib_module_names)


def declared() -> set[str]:
    """Distribution names in [project] dependencies and [project.optional-dependencies] (parsed by
    hand: python 3.10 has no tomllib)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^\[([^\]]+)\]\n(.*?)(?=^\[|\Z)", text, flags=re.M | re.S))
    lists = re.findall(r"^dependencies = \[(.*?)\]", sections["project"], flags=re.M | re.S)
    lists += re.findall(r"^\w+ = \[(.*?)\]", sections.get("project.optional-dependencies", ""), flags=re.M | re.S)
    return {_norm(re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]) for body in lists
            for req in re.findall(r'"([^"]+)"', body)}


def test_every_imported_distribution_is_declared():
    names = md.packages_distributions()
    have = declared()
    missing = []
    for mod in sorted(imported_modules()):
        if mod in VIA:
            assert _norm(VIA[mod]) in have, mod
            continue
        dists = names.get(mod) or [NOT_INSTALLED.get(mod, mod)]
        if not any(_norm(d) in have for d in dists):
            missing.append(f"{mod} ({', '.join(dists)})")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)


def test_scipy_is_pinned_and_no_entry_point_is_declared_for_lm_eval():
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'"scipy==[\d.]+"', text)
    assert "entry-points" not in text           # the .pth hook registers the lm-eval model instead
