"""CI regression tables: exact, machine-independent counters for small fixed configurations of
every system and engine mode, so nobody can silently change what is measured.

`python -m dllm_bench.regression check` regenerates the tables in memory and fails (exit 1)
on any difference, printing a readable diff; `update` rewrites the committed tables. The model
is the `tiny` preset in float64 (token decisions do not depend on summation order there), the
prompts and workloads are fixed, all requests arrive at once (no wall clock anywhere).
A second, small slice runs the default serving preset's model (`similar-1024`, float64) under
its serve settings (steps = gen_length, block 32, Table 3 baseline knobs), so the counters of
the configuration the headline numbers come from are pinned too.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pandas as pd
import torch

from dllm_bench.checkpoints.load import load_model
from dllm_bench.results import atomic_write_csv
from dllm_bench.systems.build import make_system
from dllm_bench.systems.spec import ENGINE
from engine import EngineConfig, SamplingParams

TABLE_DIR = Path(__file__).resolve().parent.parent / "results" / "regression"
KEYS = {"systems": ["config"], "requests": ["config", "request"]}

# (config name, system, knobs). Engine budgets are small on purpose: they force queueing,
# chunk splits and KV-pool back-pressure, so those decisions show up in the counters.
ENGINE_BASE = dict(max_num_batched_tokens=96, max_num_seqs=3, max_num_logits=5, kv_pool_tokens=150)
CONFIGS: list[tuple[str, str, dict]] = [
    ("engine-none", "engine", dict(cache="none")),
    ("engine-none-monolithic", "engine", dict(cache="none", max_num_logits=None)),
    ("engine-dual", "engine", dict(cache="dual")),
    ("engine-sparse-head", "engine", dict(cache="sparse", selection="head", retention=0.3)),
    ("engine-sparse-uniform", "engine", dict(cache="sparse", selection="uniform", retention=0.3)),
    ("engine-sparse-head-request-sched", "engine", dict(cache="sparse", selection="head", retention=0.3, scheduler="request")),
    # cache=auto (the engine system's default) at a CPU's ridge: the pool holds everyone as dual;
    # then a pool that does not at a ridge where every step is weight-bound, so the requests a
    # sparse pool holds more of go sparse and dual and sparse requests share steps.
    ("engine-auto", "engine", dict(cache="auto", retention=0.3, ridge_rows=8)),
    ("engine-auto-tight-pool", "engine", dict(cache="auto", retention=0.3, kv_pool_tokens=60, ridge_rows=10**6)),
    ("llada", "llada", dict(batch=2)),
    ("fast-dllm-dual", "fast-dllm", dict(batch=2)),
    ("fast-dllm-prefix", "fast-dllm", dict(batch=2, fast_dllm_cache="prefix")),
    ("fast-dllm-threshold", "fast-dllm", dict(batch=2, threshold=0.9)),
    ("dllm-cache", "dllm-cache", dict(batch=2, prompt_interval=5, gen_interval=2, transfer_ratio=0.25)),
    ("sparse-dllm", "sparse-dllm", dict(batch=2, keep_ratio=0.5, kernel_size=3)),
]


# The default preset's slice: its model and serve knobs (dllm_bench.serve.presets "cpu-default").
SIMILAR_MODEL = "similar-1024"
SIMILAR_ENGINE = dict(max_num_batched_tokens=2048, max_num_logits=256, kv_pool_tokens=4096)
SIMILAR_CONFIGS: list[tuple[str, str, dict]] = [
    ("similar-engine", "engine", dict(SIMILAR_ENGINE, cache="sparse", selection="head", retention=0.5)),
    ("similar-fast-dllm", "fast-dllm", dict(batch=2, fast_dllm_cache="dual", threshold=None)),
    ("similar-dllm-cache", "dllm-cache", dict(batch=2, prompt_interval=100, gen_interval=7)),
    ("similar-sparse-dllm", "sparse-dllm", dict(batch=2, keep_ratio=0.5, kernel_size=3)),
]


def _similar_workload():
    """Two requests at the preset's shape rules (gen 64 = 2 blocks of 32, steps = gen_length)."""
    g = torch.Generator().manual_seed(4321)
    prompts = [torch.randint(0, 1500, (n,), generator=g).tolist() for n in (48, 80)]
    return prompts, [SamplingParams(gen_length=64, steps=64, block_length=32, seed=i) for i in range(2)]


def _workload():
    g = torch.Generator().manual_seed(1234)
    prompts = [torch.randint(0, 480, (n,), generator=g).tolist() for n in (7, 19, 4, 12, 25)]
    params = [SamplingParams(gen_length=16, steps=8, block_length=8, seed=i) for i in range(len(prompts))]
    params[1] = SamplingParams(gen_length=16, steps=16, block_length=8, temperature=0.8, seed=7)
    params[3] = SamplingParams(gen_length=8, steps=8, block_length=8, remasking="random", temperature=0.5, seed=3)
    return prompts, params


def _digest(tokens: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:16]


def _system(name: str, kind: str, knobs: dict, model):
    if kind == ENGINE:
        return make_system(kind, model, engine_config=EngineConfig(dtype="float64", **{**ENGINE_BASE, **knobs}),
                           label=name)
    knobs = dict(knobs)
    return make_system(kind, model, batch=knobs.pop("batch"), knobs=knobs, label=name)


def run_config(name: str, kind: str, knobs: dict, model, workload=None) -> tuple[dict, list[dict]]:
    prompts, params = (workload or _workload)()
    system = _system(name, kind, knobs, model)
    outs = system.generate(prompts, params)
    st = system.stats()
    row = dict(config=name, system=kind, steps=st["steps"], forwards=st["forwards"], query_tokens=st["query_tokens"],
               logits_rows=st["logits_rows"], max_logits_rows_in_step=st["max_logits_rows_in_step"],
               refresh_steps=st["refresh_steps"], reuse_steps=st["reuse_steps"], peak_kv_tokens=st["peak_kv_tokens"],
               batch_sizes=" ".join(map(str, st["batch_sizes"])),
               step_composition=_digest([x for s in st["step_composition"] for x in s]))
    reqs = [dict(config=name, request=f"r{i}", tokens=_digest(o.token_ids), nfe=o.nfe,
                 logits_rows=o.logits_rows, kv_tokens=o.kv_tokens) for i, o in enumerate(outs)]
    return row, reqs


def generate_tables() -> dict[str, pd.DataFrame]:
    torch.set_num_threads(1)
    model = load_model("tiny", "float64", "cpu")
    systems, requests = [], []
    for name, kind, knobs in CONFIGS:
        row, reqs = run_config(name, kind, knobs, model)
        systems.append(row)
        requests.extend(reqs)
    similar = load_model(SIMILAR_MODEL, "float64", "cpu")
    for name, kind, knobs in SIMILAR_CONFIGS:
        row, reqs = run_config(name, kind, knobs, similar, _similar_workload)
        systems.append(row)
        requests.extend(reqs)
    return {"systems": pd.DataFrame(systems), "requests": pd.DataFrame(requests)}


def load_tables(directory: Path | None = None) -> dict[str, pd.DataFrame]:
    directory = directory or TABLE_DIR
    return {k: pd.read_csv(directory / f"{k}.csv", dtype=str, keep_default_na=False) for k in KEYS}


def diff_tables(old: dict[str, pd.DataFrame], new: dict[str, pd.DataFrame]) -> list[str]:
    """Readable differences: added/removed rows and changed cells (compared as text)."""
    lines = []
    for name, keys in KEYS.items():
        a = old[name].astype(str).set_index(keys)
        b = new[name].astype(str).set_index(keys)
        for k in a.index.difference(b.index):
            lines.append(f"{name}: row {k} removed")
        for k in b.index.difference(a.index):
            lines.append(f"{name}: row {k} added")
        for col in sorted(set(a.columns) | set(b.columns)):
            if col not in a.columns or col not in b.columns:
                lines.append(f"{name}: column {col!r} {'added' if col in b.columns else 'removed'}")
                continue
            common = a.index.intersection(b.index)
            for k in common:
                if a.at[k, col] != b.at[k, col]:
                    lines.append(f"{name}: {k} {col}: {a.at[k, col]} -> {b.at[k, col]}")
    return lines


def write_tables(tables: dict[str, pd.DataFrame], directory: Path | None = None) -> None:
    directory = directory or TABLE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    for k, df in tables.items():
        atomic_write_csv(directory / f"{k}.csv", df)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    mode = argv[0] if argv else "check"
    if mode not in ("check", "update"):
        print("usage: python -m dllm_bench.regression check|update", file=sys.stderr)
        return 2
    new = generate_tables()
    if mode == "update":
        write_tables(new)
        print(f"regression tables written to {TABLE_DIR}")
        return 0
    if not all((TABLE_DIR / f"{k}.csv").is_file() for k in KEYS):
        print(f"no committed regression tables in {TABLE_DIR}: run `make regress-update` and commit them", file=sys.stderr)
        return 1
    # Round-trip the fresh tables through CSV text so both sides are compared the same way.
    fresh = {k: pd.read_csv(pd.io.common.StringIO(df.to_csv(index=False)), dtype=str, keep_default_na=False)
             for k, df in new.items()}
    lines = diff_tables(load_tables(), fresh)
    if lines:
        print(f"REGRESSION: {len(lines)} counter(s) differ from the committed tables ({TABLE_DIR}):", file=sys.stderr)
        for line in lines:
            print("  " + line, file=sys.stderr)
        print("If the change is intended, run `make regress-update` and commit the tables with it.", file=sys.stderr)
        return 1
    n = sum(len(df) for df in new.values())
    print(f"regression tables match ({len(CONFIGS) + len(SIMILAR_CONFIGS)} configs, {n} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
