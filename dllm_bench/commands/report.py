"""`dllm-bench report`: one Markdown report (tables, figures, the paper's numbers and a computed
mark and verdict per claim) from the latest serve, accuracy, ablate and sweep runs, and the latest
simulated run per hardware profile in sections of their own (dllm_bench.report.document); with
`--docs` the docs' current-results tables from the committed files they name, `--keep` those
files of a run (dllm_bench.report.current)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from dllm_bench import inputs, results
from dllm_bench.errors import UserError
from dllm_bench.report import claims as paper_claims
from dllm_bench.report import current
from dllm_bench.report import document as report


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        out: Path = typer.Option(Path("report.md"), "--out", "-o", help="Markdown file to write (figures go to <stem>_files/ next to it)"),
        result_dir: Path | None = typer.Option(None, "--result-dir", help="runs root (default results/runs, or $DLLM_BENCH_RESULTS_DIR)"),
        as_json: bool = typer.Option(False, "--json", help="print the runs used, missing kinds and the claims' marks and verdicts as JSON"),
        docs: Path | None = typer.Option(None, "--docs", help="instead: rewrite the current-results blocks of DIR/*.md (or one .md) from the files they name"),
        check: bool = typer.Option(False, "--check", help="with --docs: write nothing; exit 1 when a block differs from its files"),
        keep: Path | None = typer.Option(None, "--keep", help=f"instead: copy what the docs' tables read of run directory RUN into {current.CURRENT}/<its name>"),
    ) -> None:
        """Markdown report from the latest serve / accuracy / ablate / sweep runs, next to the paper's figures;
        --docs: the docs' current-results tables from the committed files they name."""
        if docs is not None or keep is not None or check:
            code = current.command(docs, check, keep, as_json)
            if code:
                sys.exit(code)  # not typer.Exit: with standalone_mode=False click returns its code unused
            return
        if out.suffix.lower() != ".md":
            raise UserError(f"--out must be a .md file, got {out}")
        inputs.out_file(out, "--out")
        inputs.writable_dir(out.parent / f"{out.stem}_files", "--out's figures directory")
        root = results.results_root(result_dir)
        if result_dir is not None and not root.is_dir():
            raise UserError(f"--result-dir: no such directory: {root}")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            doc = report.render(out, root)
        except OSError as e:  # the checks above cannot foresee a full disk or a path that changes under us
            raise UserError(f"--out {out}: cannot write the report ({e.strerror or e})") from None
        m, c = paper_claims.mark_counts(doc["claims"]), paper_claims.counts(doc["claims"])
        msg = (f"report: {doc['report']} ({len(doc['claims'])} claims: " +
               ", ".join(f"{v} {k}" for k, v in m.items()) + "; magnitude: " +
               ", ".join(f"{v} {k}" for k, v in c.items()) + ")" +
               (f"; missing runs: {', '.join(doc['missing'])}" if doc["missing"] else "") +
               (f"; sections that failed: {', '.join(doc['errors'])}" if doc["errors"] else ""))
        print(msg, file=sys.stderr)
        if as_json:
            sys.stdout.write(json.dumps(doc) + "\n")

