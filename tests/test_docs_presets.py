"""The presets as documented agree with dllm_bench/serve/presets.py: docs/SERVE.md's preset table
(one column per overriding flag) field by field, the fields every preset shares as stated under
it, and every `--preset` help text (the presets it lists, the default it names, any "[preset: X]"
default it quotes)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import typer

from dllm_bench.cli import app
from dllm_bench.serve.presets import DEFAULT_PRESET, PRESETS, ServePreset
from dllm_bench.simulate.calibrate.plan import default_sizes

DOC = Path(__file__).resolve().parent.parent / "docs" / "SERVE.md"
NOT_DEFAULTS = {"name", "note"}          # the row's key, and free text


def preset_table(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """(header cells, preset -> row cells) of the first table under "## Presets"."""
    section = text.split("\n## Presets", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    split = [[c.strip().strip("`").strip() for c in line.strip().strip("|").split("|")] for line in rows]
    header, body = split[0], split[2:]
    return header, {r[0]: r for r in body}


def shared_paragraph(text: str) -> str:
    """The paragraph right after the preset table: what every preset shares."""
    section = text.split("\n## Presets", 1)[1].split("\n## ", 1)[0]
    after = section.split("\n\n")
    i = next(i for i, part in enumerate(after) if part.lstrip().startswith("| preset"))
    return " ".join(after[i + 1].split())


def field_of(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def cell_value(cell: str, value) -> bool:
    """Whether a table cell states `value` (– is None)."""
    if value is None:
        return cell in ("–", "-", "none")
    if isinstance(value, bool):
        return cell == ("on" if value else "off")
    if isinstance(value, (int, float)):
        try:
            return float(cell) == float(value)
        except ValueError:
            return False
    return cell == str(value)


def test_every_preset_field_in_the_serve_doc_matches_the_code():
    text = DOC.read_text(encoding="utf-8")
    header, rows = preset_table(text)
    assert set(rows) == set(PRESETS), "the doc's preset rows are not the presets"
    fields = {f.name for f in dataclasses.fields(ServePreset)} - NOT_DEFAULTS
    columns = {field_of(h): i for i, h in enumerate(header) if h.startswith("--")}
    assert set(columns) <= fields, f"columns that are no preset field: {set(columns) - fields}"
    bad = [f"{name}.{field}: doc {rows[name][i]!r}, code {getattr(p, field)!r}"
           for name, p in PRESETS.items() for field, i in columns.items() if not cell_value(rows[name][i], getattr(p, field))]
    assert not bad, "docs/SERVE.md's preset table disagrees with presets.py: " + "; ".join(bad)
    shared = shared_paragraph(text)
    for field in sorted(fields - set(columns)):
        values = {repr(getattr(p, field)) for p in PRESETS.values()}
        assert len(values) == 1, f"{field} differs between presets: it needs a column in docs/SERVE.md's table"
        if field == "baseline_knobs":
            for system, knobs in next(iter(PRESETS.values())).baseline_knobs.items():
                spec = f"{system}:" + ",".join(f"{k}={'none' if v is None else v}" for k, v in knobs.items())
                assert spec in shared, f"docs/SERVE.md does not state the shared baseline knobs {spec}"
        else:
            assert f"`{field}`" in shared, f"docs/SERVE.md does not state the shared field {field}"


def test_the_checker_catches_a_wrong_cell():
    text = DOC.read_text(encoding="utf-8")
    header, rows = preset_table(text)
    i = header.index("--num-prompts")
    assert cell_value(rows["cpu-default"][i], PRESETS["cpu-default"].num_prompts)
    assert not cell_value(str(PRESETS["cpu-default"].num_prompts + 1), PRESETS["cpu-default"].num_prompts)
    assert not cell_value("1300MiB", "1GiB") and cell_value("–", None) and not cell_value("2", None)


def _help_texts() -> list[tuple[str, click.Option]]:
    root = typer.main.get_command(app)
    out = []

    def walk(name: str, cmd) -> None:
        if isinstance(cmd, click.Group):
            for n, sub in cmd.commands.items():
                walk(f"{name} {n}".strip(), sub)
            return
        out.extend((name, p) for p in cmd.params if isinstance(p, click.Option) and p.help)
    walk("", root)
    return out


PRESET_NAME = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(PRESETS, key=len, reverse=True))) + r")\b")


def test_every_preset_help_lists_the_presets_and_names_the_default():
    helps = [(cmd, p) for cmd, p in _help_texts() if "--preset" in p.opts]
    assert {cmd for cmd, _ in helps} >= {"serve", "simulate", "ablate", "sweep", "server", "calibrate"}
    for cmd, p in helps:
        named = set(PRESET_NAME.findall(p.help))
        if "[" + DEFAULT_PRESET + "]" in p.help:           # a default alone: "[cpu-default]"
            continue
        assert named >= set(PRESETS), f"{cmd} --preset help omits {set(PRESETS) - named}"
        assert re.search(rf"default {re.escape(DEFAULT_PRESET)}\b", p.help), f"{cmd} --preset help: default"


def test_a_quoted_preset_default_is_the_default_presets():
    default = PRESETS[DEFAULT_PRESET]
    quoted = [(cmd, p, m[1].strip()) for cmd, p in _help_texts() if (m := re.search(r"\[preset: ([^\]]+)\]", p.help))]
    assert quoted                                              # serve's --rps quotes one
    for cmd, p, value in quoted:
        field = field_of(p.opts[0])
        assert cell_value(value, getattr(default, field)), f"{cmd} {p.opts[0]}: {p.help}"


def test_calibrates_quoted_default_sizes_are_the_code_s():
    (help_text,) = [p.help for cmd, p in _help_texts() if cmd == "calibrate" and "--sizes" in p.opts]
    quoted = re.findall(r"(\d+(?:,\d+)*) for ([\w-]+)", help_text)
    assert quoted
    for sizes, name in quoted:
        assert tuple(map(int, sizes.split(","))) == default_sizes(PRESETS[name], "cpu"), help_text
