"""The README's library example, extracted from README.md and run as written (on the `tiny`
preset), so the snippet a new user copies cannot rot."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def library_snippet() -> str:
    """The one ```python block of README.md."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, f"expected one python block in README.md, found {len(blocks)}"
    return blocks[0]


@pytest.mark.slow
def test_the_readme_snippet_runs_as_written(capsys):
    snippet = library_snippet()
    assert {"LLMEngine", "SamplingParams"} <= {a.name for n in ast.parse(snippet).body
                                              if isinstance(n, ast.ImportFrom) for a in n.names}
    scope: dict = {}
    exec(compile(snippet, str(README), "exec"), scope)    # noqa: S102 - our own README
    outputs, params = scope["outputs"], scope["params"]
    assert len(outputs) == 2
    assert all(len(o.token_ids) == params.gen_length and o.nfe > 0 for o in outputs)
    printed = ast.literal_eval(capsys.readouterr().out.strip())
    assert printed == [scope["tok"].decode(o.token_ids) for o in outputs]
