"""The docs' current-results blocks (`dllm-bench report --docs`, dllm_bench.report.current): every
block in docs/ is exactly what its committed files give (a stale table fails here), the committed
results hold only what the tables read, and the mode on fixture runs: the doc's table is the
report's own, --check fails on a changed result, --keep copies only the inputs, a pending block
waits for its files, bad blocks are one error line with nothing written. No model runs."""
from __future__ import annotations

import json
import re
from pathlib import Path

from dllm_bench import results
from dllm_bench.report import current
from dllm_bench.report import document as rp
from tests.helpers import one_error_line, run_cli
from tests.test_ablate_sweep_report import _fixture_runs

REPO = Path(__file__).resolve().parent.parent


def test_every_doc_table_is_what_its_committed_files_give():
    blocks, pending = 0, []
    for doc in sorted((REPO / "docs").glob("*.md")):
        text, n, waiting = current.rendered(doc)
        assert text == doc.read_text(encoding="utf-8"), f"{doc.name} is stale: `make docs` renders it"
        blocks, pending = blocks + n, pending + waiting
    # The generated ones at least (the pending ones wait for an idle machine's runs: make docs-results).
    assert blocks - len(pending) >= 3
    assert all(p.startswith("results/current/") for p in pending)


def test_committed_results_hold_only_what_the_tables_read():
    total = 0
    for run in sorted(p for p in (REPO / current.CURRENT).iterdir() if p.is_dir()):
        kind = current.run_kind(run)
        files = {f for f in run.rglob("*") if f.is_file()}
        wanted = {f for g in current.INPUTS[kind] for f in run.glob(g)}
        assert files == wanted, f"{run.name}: {sorted(str(f.relative_to(run)) for f in files - wanted)}"
        total += sum(f.stat().st_size for f in files)
    assert total < 2 << 20     # 0.9 MiB before docs/MODELS.md's nine runs, 1.6 MiB with them


def _doc(root: Path, *sources: str, pending: bool = False) -> Path:
    mark = current.PENDING if pending else ""
    blocks = "".join(f"Before.\n\n{current.OPEN} {s}{mark} -->\nhand-written\n{current.CLOSE}\n\nAfter.\n"
                     for s in sources)
    doc = root / "docs" / "X.md"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(f"# X\n\n## Current results\n\n{blocks}", encoding="utf-8")
    return doc


def _table(text: str) -> list[str]:
    return [re.sub(r" +", " ", line) for line in text.splitlines() if line.startswith("|")]


def test_docs_render_the_reports_tables_and_check_catches_a_changed_result(tmp_path, monkeypatch, capsys):
    _fixture_runs(tmp_path / "runs")
    kinds = ("serve-fx", "ablate-fx", "sweep-input-len-fx", "acc-fx")
    doc = _doc(tmp_path, *(f"runs/{k}" for k in kinds))
    r = run_cli(monkeypatch, capsys, "report", "--docs", str(doc.parent), "--check")
    assert r.returncode == 1 and "stale: " in r.stderr and "X.md" in r.stderr
    assert "hand-written" in doc.read_text()                      # --check writes nothing
    r = run_cli(monkeypatch, capsys, "report", "--docs", str(doc.parent))
    assert r.returncode == 0 and "4 current-results blocks in 1 docs" in r.stderr, r.stderr
    text = doc.read_text()
    assert "hand-written" not in text and text.count("Before.") == 4 and text.endswith("After.\n")
    for k in kinds:
        assert f"run `{k}`" in text
    # Each table is the report's own, row for row.
    report = tmp_path / "report.md"
    rp.render(report, tmp_path / "runs")
    shown = _table(report.read_text())
    for block in current.BLOCK.finditer(text):
        rows = _table(block["body"])
        assert rows and all(row in shown for row in rows), block["src"]
    assert "| + logit-aware budgeting |" in re.sub(r" +", " ", text) and "paper x" in text
    assert run_cli(monkeypatch, capsys, "report", "--docs", str(doc), "--check").returncode == 0
    # A result changes (the engine's throughput at one point): the doc is stale until re-rendered.
    summ = next((tmp_path / "runs" / "serve-fx" / "points").glob("livebench__engine__rps1*/summary.json"))
    s = json.loads(summ.read_text())
    s["output_throughput"] = 123.45
    summ.write_text(json.dumps(s))
    r = run_cli(monkeypatch, capsys, "report", "--docs", str(doc.parent), "--check")
    assert r.returncode == 1 and "X.md" in r.stderr
    assert run_cli(monkeypatch, capsys, "report", "--docs", str(doc.parent)).returncode == 0
    assert "123.45" in doc.read_text()


def test_keep_copies_only_what_the_table_reads_and_a_pending_block_waits_for_it(tmp_path, monkeypatch, capsys):
    _fixture_runs(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    doc = _doc(tmp_path, "results/current/ablate-fx", pending=True)
    before = doc.read_text()
    r = run_cli(monkeypatch, capsys, "report", "--docs", "docs", "--check")
    assert r.returncode == 0 and "pending" in r.stderr and "results/current/ablate-fx" in r.stderr
    assert run_cli(monkeypatch, capsys, "report", "--docs", "docs").returncode == 0
    assert doc.read_text() == before                              # hand text kept while pending
    r = run_cli(monkeypatch, capsys, "report", "--keep", "runs/ablate-fx")
    assert r.returncode == 0, r.stderr
    kept = tmp_path / "results" / "current" / "ablate-fx"
    files = sorted(str(f.relative_to(kept)) for f in kept.rglob("*") if f.is_file())
    assert "config.json" in files and all(f == "config.json" or re.fullmatch(r"points/[^/]+/summary\.json", f)
                                          for f in files)
    assert len(files) == 1 + len(results.load_points(tmp_path / "runs" / "ablate-fx"))
    for f in files:                                               # the same documents, compact
        orig, copy = tmp_path / "runs" / "ablate-fx" / f, kept / f
        assert json.loads(copy.read_text()) == json.loads(orig.read_text())
        assert copy.stat().st_size < orig.stat().st_size and len(copy.read_text().splitlines()) == 1
    assert run_cli(monkeypatch, capsys, "report", "--docs", "docs").returncode == 0
    text = doc.read_text()
    assert current.PENDING not in text and "hand-written" not in text
    assert _table(text) == _table(current.render(tmp_path / "runs" / "ablate-fx"))   # the copy renders alike
    # Kept again: replaced, not merged.
    (kept / "stray.txt").write_text("x")
    assert run_cli(monkeypatch, capsys, "report", "--keep", "runs/ablate-fx").returncode == 0
    assert not (kept / "stray.txt").exists()


def test_bad_blocks_and_options_are_one_error_line_and_write_nothing(tmp_path, monkeypatch, capsys):
    _fixture_runs(tmp_path / "runs")
    good = _doc(tmp_path, "runs/serve-fx")
    bad = tmp_path / "docs" / "Y.md"
    bad.write_text(f"{current.OPEN} runs/nothing-here -->\nx\n{current.CLOSE}\n")
    cases = [
        (("--docs", str(tmp_path / "docs")), "runs/nothing-here"),
        (("--docs", str(tmp_path / "none")), "--docs"),
        (("--check",), "--check needs --docs"),
        (("--keep", str(tmp_path / "runs" / "nothing")), "not a run directory"),
        (("--keep", str(tmp_path)), "not a run directory"),
        (("--docs", str(good), "--json"), "--json"),
    ]
    for args, msg in cases:
        r = run_cli(monkeypatch, capsys, "report", *args)
        one_error_line(r, msg)
    assert "hand-written" in good.read_text()                    # the bad Y.md stopped every write
    bad.write_text(f"{current.OPEN} runs/serve-fx -->\nno end\n")
    r = run_cli(monkeypatch, capsys, "report", "--docs", str(bad))
    assert r.returncode == 2 and current.CLOSE in r.stderr
