"""`dllm-bench systems`: every system dllm-bench can run, its knobs with defaults, and the
upstream code it re-implements."""
from __future__ import annotations

import json

import typer
from rich.table import Table

from baselines import SYSTEMS
from dllm_bench.console import console
from dllm_bench.systems.spec import ENGINE_KNOB_TABLE, PAPER_ENGINE


def system_rows() -> list[dict]:
    rows = [dict(name="engine", kind="continuous batching (dLLM-Serve design)",
                 knobs={k: knob.default for k, knob in ENGINE_KNOB_TABLE.items()},
                 source="this repository: engine/ (paper: dLLM-Serve, arXiv 2512.17077; authors' code chosen-ox/dLLM-Serve aefbf0a)",
                 notes="cache=auto (default): each request dual (Fast-dLLM's cache, one Refresh per block) while the "
                       f"KV pool holds it, head-centric sparse KV when memory binds and its fuller batches pay (weight-bound steps, a step overhead to amortise); {PAPER_ENGINE} = the paper's "
                       "dLLM-Serve (every request sparse: head-centric or uniform retention); dual = Fast-dLLM dual "
                       "cache; none = exact LLaDA; cuda_graphs None = on for CUDA; on CUDA the token and logit "
                       "budgets scale with the GPU unless given")]
    for name, spec in SYSTEMS.items():
        up = spec.upstream
        rows.append(dict(name=name, kind="request-level static batching", knobs=dict(spec.knobs) | {"batch": "profiled"},
                         families={f: spec.knobs_for(f) for f in spec.families},
                         source=f"{up['repo']}@{up['commit'][:10]} ({', '.join(up['files'])})",
                         notes=spec.notes, upstream_sampling=dict(spec.sampling)))
    return rows


def register(app: typer.Typer) -> None:
    @app.command()
    def systems(json_out: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """List the systems (engine and baselines) with their knobs, defaults and sources."""
        rows = system_rows()
        if json_out:
            typer.echo(json.dumps(rows, default=str))
            return
        t = Table(title="dllm-bench systems (use as --systems NAME[:knob=value,...])", show_lines=True)
        for c in ("system", "scheduling", "knobs (defaults)", "re-implements"):
            t.add_column(c, overflow="fold")
        for r in rows:
            knobs = ", ".join(f"{k}={v}" for k, v in r["knobs"].items())
            fams = "; ".join(f"{f}: {', '.join(f'{k}={v}' for k, v in kv.items()) or '-'}"
                             for f, kv in r.get("families", {}).items())
            t.add_row(r["name"], r["kind"] + (f"\nfamilies (knobs): {fams}" if fams else ""), knobs, r["source"] + ("\n" + r["notes"] if r.get("notes") else ""))
        console(stderr=False).print(t)


__all__ = ["register", "system_rows"]
