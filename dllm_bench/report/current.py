"""The docs' current results (`dllm-bench report --docs DIR`): a doc marks its one results table

    <!-- current-results: [TABLE ]PATH -->
    ...
    <!-- /current-results -->

and the block is rendered, by the report's own table functions, from the committed files it
names: a run directory (its kind's table) or a hardware profile that carries its validation; a
TABLE (`scheduler`, `memory`, `models`) renders every run directory PATH matches as one table
(PATH: a glob, or a comma list of names and globs in one folder, each matching something). So
a doc shows what those files give at this commit; `--check` and tests/test_docs_current.py fail
on a block that differs. A block marked `(pending)` after its path keeps its hand-written text
while the path matches nothing, and is rendered (the mark dropped) once it does. `--keep RUN`
copies into results/current/ only the files of a run that its table reads (INPUTS).
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from dllm_bench import inputs, results
from dllm_bench.ablate import tables as ab
from dllm_bench.errors import UserError
from dllm_bench.frontier.output import markdown as frontier_markdown
from dllm_bench.report import benchmarks as bench
from dllm_bench.report import models
from dllm_bench.report import sections as sec
from dllm_bench.report.memory import memory_line, memory_table
from dllm_bench.report.scheduler import scheduler_line
from dllm_bench.report.scheduler import summary_markdown as scheduler_summary
from dllm_bench.report.serving import points_frame, serve_table
from dllm_bench.report.simulated import hardware_line
from dllm_bench.simulate import hardware
from dllm_bench.simulate.fit.run import table as fit_table
from dllm_bench.sweep import lengths as sw

OPEN = "<!-- current-results:"
CLOSE = "<!-- /current-results -->"
PENDING = " (pending)"
# A marker is a line of its own (quoted or indented in a doc, it is an example).
BLOCK = re.compile(r"^<!-- current-results: (?:(?P<table>[a-z]+) )?(?P<src>[^\s(]\S*)(?P<pending> \(pending\))? -->\n"
                   r"(?P<body>.*?)^" + re.escape(CLOSE), re.S | re.M)
STARTS = re.compile("^" + re.escape(OPEN), re.M)
CURRENT = Path("results") / "current"

# What each kind's table reads of a run directory: all that `--keep` copies.
_SERVING = ("config.json", "points/*/summary.json")
_DOCUMENT = ("config.json", "summary.json")
INPUTS = {"serve": _SERVING, "simulate": _SERVING, "ablate": _SERVING, "sweep": _SERVING, "accuracy": _DOCUMENT,
          "frontier": _DOCUMENT, "memory": _DOCUMENT, **{k: _DOCUMENT for k in bench.TABLES}}


def _origin(run_dir: Path, doc: dict) -> str:
    """Which run, when, at which commit and on what machine (a simulation: on no machine)."""
    env = doc.get("environment") or {}
    sha = str(env.get("git_sha") or "?")
    commit = sha[:7] + ("-dirty" if sha.endswith("-dirty") else "")
    cores = env.get("cpu_count") or env.get("affinity_cpus")      # the machine's, not a pinned process's
    machine = env.get("cuda_device") or f"CPU ({cores} core{'' if cores == 1 else 's'})"
    where = "" if doc["kind"] == "simulate" else f", {machine}, torch {env.get('torch', '?')}"
    date = str(doc.get("created_utc", "?"))[:10]
    command = f"make {doc['kind']}" if doc["kind"] in bench.TABLES else f"dllm-bench {doc['kind']}"
    return f"`{command}` run `{run_dir.name}` ({date}, commit {commit}{where})"


def _serve(run_dir: Path, doc: dict) -> str:
    cfg = doc.get("config") or {}
    reps = int(cfg.get("repeats", 1) or 1)
    # The preset line states the preset's own request count; the run's may differ (--num-prompts).
    head = (f"{_origin(run_dir, doc)}: {cfg.get('num_prompts', '?')} requests per point; {cfg.get('preset_line', '')}"
            + (f"; {reps} repeats" if reps > 1 else ""))
    return f"{head}.\n\n{serve_table(points_frame(run_dir, simulated=False))[0]}"


def _simulate(run_dir: Path, doc: dict) -> str:
    cfg = doc.get("config") or {}
    hw = cfg.get("hardware") or {}
    label = hardware.validation_label(hw.get("kind", ""), hw.get("name", "?"), hw.get("validation"))
    p = cfg.get("preset") or {}
    what = (f"preset {p.get('name', '?')}, {cfg.get('num_prompts')} requests per dataset, gen_length "
            f"{p.get('gen_length')}, block {p.get('block_length')}, token budget {p.get('max_num_batched_tokens')}, "
            f"logit budget {p.get('max_num_logits')}, retention {p.get('retention')}, {p.get('dtype')}")
    head = f"{_origin(run_dir, doc)}, **simulated** on {hardware_line(hw)} ({label}); {what}"
    return f"{head}.\n\n{serve_table(points_frame(run_dir, simulated=True))[0]}"


def _ablate(run_dir: Path, doc: dict) -> str:
    t = ab.run_tables(run_dir)
    if t["ladder"] is None:
        raise ValueError("the run has no ladder")
    return f"{_origin(run_dir, doc)}: {sec.ablate_line(t['config'])}\n\n{sec.ablate_ladder(t['ladder'])}"


def _sweep(run_dir: Path, doc: dict) -> str:
    t = sw.run_tables(run_dir)
    return f"{_origin(run_dir, doc)}: {sec.sweep_line(t['config'])}\n\n{sec.sweep_markdown(t)}"


def _accuracy(run_dir: Path, doc: dict) -> str:
    summ = results.read_json(run_dir / "summary.json")
    return f"{_origin(run_dir, doc)}: {sec.accuracy_line(summ)}.\n\n{sec.accuracy_table(summ)}"


def _frontier(run_dir: Path, doc: dict) -> str:
    summ = results.read_json(run_dir / "summary.json")
    return f"{_origin(run_dir, doc)}: {frontier_markdown(summ)}"


def _profile(path: Path) -> str:
    """A hardware profile fitted to measured runs: each cell of its validation, fitted and with
    its system left out of the fit (what `simulate --fit` printed when it made the profile)."""
    prof = hardware.load(str(path))
    v = prof.validation or {}
    if not v.get("cells"):
        raise ValueError("the profile carries no validation cells (`simulate --fit` writes them)")
    title = f"Hardware profile `{prof.name}` ({prof.validation_label()}):"
    cells, held = ([{**c, "rps": float(c["rps"])} for c in v.get(k) or []] for k in ("cells", "held_out_cells"))
    return fit_table(cells, title, held) + "\n"


def _memory(run_dir: Path, doc: dict) -> str:
    return _memory_runs([run_dir])


def _memory_runs(run_dirs: list[Path]) -> str:
    lines = [f"* {_origin(d, results.load_config(d))}: {memory_line(d)}." for d in run_dirs]
    return "\n".join(lines) + f"\n\n{memory_table(run_dirs)}"


def _scheduler_runs(run_dirs: list[Path]) -> str:
    lines = [f"* {_origin(d, doc)}: {scheduler_line(doc)}." for d in run_dirs for doc in [results.load_config(d)]]
    return "\n".join(lines) + f"\n\n{scheduler_summary(run_dirs)}"


def _models_runs(run_dirs: list[Path]) -> str:
    lines = [f"* {_origin(d, doc)}: {models.run_line(doc)}." for d in run_dirs for doc in [results.load_config(d)]]
    return "\n".join(lines) + f"\n\n{models.table(run_dirs)}"


def _bench(run_dir: Path, doc: dict) -> str:
    return f"{_origin(run_dir, doc)}.\n\n{bench.table_of(run_dir)}"


RENDER: dict[str, Callable[[Path, dict], str]] = {
    "serve": _serve, "simulate": _simulate, "ablate": _ablate, "sweep": _sweep, "accuracy": _accuracy,
    "frontier": _frontier, "memory": _memory, **{k: _bench for k in bench.TABLES}}
# A named table renders several run directories of the kinds it reads (a block's TABLE before its path).
TABLES: dict[str, tuple[tuple[str, ...], Callable[[list[Path]], str]]] = {
    "scheduler": (("simulate",), _scheduler_runs), "memory": (("memory",), _memory_runs),
    "models": (models.KINDS, _models_runs)}


def run_kind(path: Path) -> str:
    """The kind of the run directory at `path` ("profile" for a hardware profile's file)."""
    if path.is_file() and path.suffix == ".json":
        return "profile"
    try:
        kind = results.load_config(path).get("kind")
    except UserError:
        raise UserError(f"{path}: not a run directory (no readable config.json) nor a hardware profile") from None
    if kind not in RENDER:
        raise UserError(f"{path}: a {kind!r} run has no current-results table (kinds: {', '.join(RENDER)})")
    return kind


def sources(base: Path, src: str) -> list[Path]:
    """The files a block's path names under `base`: the path itself, or every match of a glob, or
    of each name of a comma list in the path's last part (none when one of those matches nothing)."""
    if not src or src.startswith("/"):
        return []
    folder, _, names = src.rpartition("/")
    found: set[Path] = set()
    for name in names.split(","):
        match = set(base.glob(f"{folder}/{name}" if folder else name)) if name else set()
        if not match:
            return []
        found |= match
    return sorted(found)


def render(path: Path, table: str | None = None) -> str:
    """The block's body for the files at `path` (under a named table, every run its last part
    matches as a glob)."""
    if table is not None:
        if table not in TABLES:
            raise UserError(f"{path}: no table named {table!r} (tables: {', '.join(TABLES)})")
        paths = sources(path.parent, path.name)
        kinds, wanted = {run_kind(p) for p in paths}, TABLES[table][0]
        if not kinds or not kinds <= set(wanted):
            raise UserError(f"{path}: the {table} table reads {' or '.join(wanted)} runs, found {sorted(kinds) or 'none'}")
    else:
        kind = run_kind(path)
    try:
        if table is not None:
            text = TABLES[table][1](paths)
        else:
            text = _profile(path) if kind == "profile" else RENDER[kind](path, results.load_config(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: cannot render its table ({type(e).__name__}: {e})") from None
    return "\n" + text.strip("\n") + "\n\n"


def rendered(doc: Path) -> tuple[str, int, list[str]]:
    """The doc's text with every block rendered from the files it names (paths relative to the
    folder above the doc's: the repository root for docs/*.md), how many blocks it has, and the
    paths of the pending blocks still waiting for their files."""
    text = doc.read_text(encoding="utf-8")
    base = doc.resolve().parent.parent
    found = list(BLOCK.finditer(text))
    if len(STARTS.findall(text)) != len(found):
        raise UserError(f"{doc}: a `{OPEN} PATH -->` line without its `{CLOSE}`")
    waiting = [m["src"] for m in found if m["pending"] and not sources(base, m["src"])]

    def body(m: re.Match) -> str:
        if m["src"] in waiting:
            return m[0]
        try:
            head = f"{m['table']} {m['src']}" if m["table"] else m["src"]
            return f"{OPEN} {head} -->\n" + render(base / m["src"], m["table"]) + CLOSE
        except UserError as e:
            raise UserError(f"{doc}: {e}") from None
    return BLOCK.sub(body, text), len(found), waiting


def docs(target: Path) -> list[Path]:
    if target.is_file() and target.suffix == ".md":
        return [target]
    if target.is_dir():
        return sorted(target.glob("*.md"))
    raise UserError(f"--docs: no such Markdown file or directory: {target}")


def refresh(target: Path, write: bool) -> dict:
    """Render every block of the docs at `target`; rewrite the docs that differ when `write`.
    Everything is rendered before anything is written, so a bad block writes nothing."""
    out = {"docs": [], "blocks": 0, "stale": [], "pending": []}
    new = {}
    for doc in docs(target):
        text, n, waiting = rendered(doc)
        out["pending"] += [f"{doc} ({src})" for src in waiting]
        if n:
            out["docs"].append(str(doc))
            out["blocks"] += n
            if text != doc.read_text(encoding="utf-8"):
                out["stale"].append(str(doc))
                new[doc] = text
    if write:
        for doc, text in new.items():
            results.atomic_write_bytes(doc, text.encode("utf-8"))
    return out


def keep(run_dir: Path, root: Path = CURRENT) -> Path:
    """Copy into root/<run name>/ the files of `run_dir` its table reads (INPUTS), replacing any
    earlier copy; returns the copy. JSON is copied compact (the same document in about half the
    bytes: a serving run's points are most of what results/current holds)."""
    kind = run_kind(run_dir)
    if kind == "profile":
        raise UserError(f"--keep: {run_dir} is a hardware profile, not a run directory")
    files = sorted({f for g in INPUTS[kind] for f in run_dir.glob(g) if f.is_file()})
    if len(files) < 2:
        raise UserError(f"--keep: {run_dir} has no finished results to keep")
    dest, tmp = root / run_dir.name, root / f".{run_dir.name}.tmp"
    if dest.resolve() == run_dir.resolve():
        raise UserError(f"--keep: {run_dir} is already under {root}")
    docs = {}
    for f in files:  # every file read before anything is made
        try:
            docs[f] = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise UserError(f"--keep: {f} is not readable JSON") from None
    inputs.writable_dir(root, "--keep's destination")
    shutil.rmtree(tmp, ignore_errors=True)
    for f, doc in docs.items():
        out = tmp / f.relative_to(run_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n", encoding="utf-8")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def command(target: Path | None, check: bool, keep_run: Path | None, as_json: bool) -> int:
    """`report --keep` then `--docs`: the exit code, 1 when `--check` finds a block that differs
    from its files; a line each on stderr."""
    if as_json:
        raise UserError("--json is the report's; --docs and --keep print one line each")
    if check and target is None:
        raise UserError("--check needs --docs DIR")
    if keep_run is not None:
        try:
            print(f"kept: {keep(keep_run)}", file=sys.stderr)
        except OSError as e:
            raise UserError(f"--keep {keep_run}: cannot copy ({e.strerror or e})") from None
    if target is None:
        return 0
    try:
        r = refresh(target, write=not check)
    except OSError as e:
        raise UserError(f"--docs {target}: cannot rewrite ({e.strerror or e})") from None
    if check and r["stale"]:
        print(f"stale: {', '.join(r['stale'])} (`dllm-bench report --docs {target}` renders them)", file=sys.stderr)
        return 1
    done = r["blocks"] - len(r["pending"])
    verb = "match their files" if check else f"rendered ({len(r['stale'])} docs rewritten)"
    print(f"docs: {done} current-results blocks in {len(r['docs'])} docs {verb}"
          + (f"; {len(r['pending'])} pending, their files not made yet: {', '.join(r['pending'])}"
             if r["pending"] else ""), file=sys.stderr)
    return 0
