"""The tables of `dllm-bench profile` (dllm_bench.profiling.run's document): the plan of a GPU
from shapes, or the two measured profiles, column by column."""
from __future__ import annotations

from rich.table import Table

from dllm_bench.console import console
from dllm_bench.systems.options import parallel_only

MiB = 2**20


def _table(title: str, columns) -> Table:
    """A table of one row label column and one right-aligned column per plan or profile."""
    t = Table(title=title)
    t.add_column("")
    for k in columns:
        t.add_column(k, justify="right")
    return t


def print_doc(doc: dict) -> None:
    (print_plan if doc["kind"] == "plan" else print_profiles)(doc)


def print_plan(doc: dict) -> None:
    plans, base, n = doc["plans"], doc["base"], doc["tensor_parallel_size"]
    shape = doc["shape"]
    t = _table(title=f"memory plan · {doc['model']} ({doc['n_params'] / 1e9:.2f}B params, {base.dtype}) · device "
                    f"{doc['device_memory_bytes'] / 2**30:.0f} GiB × {base.gpu_memory_utilization:g} = budget "
                    f"{base.memory_budget / MiB:,.0f} MiB · {base.max_num_batched_tokens} query tokens/step"
                    + parallel_only(n, f" · per GPU of {n} (tensor parallel)"), columns=plans)
    rows = [("weights (MiB)", "weights_bytes", MiB), ("context + allocator slack (MiB)", "context_bytes", MiB),
            (f"activations at {base.max_num_batched_tokens} tokens (MiB)", "activation_bytes", MiB),
            ("logit rows", "logit_rows", 1), ("logit rows × vocab × 8 B (MiB)", "logit_bytes", MiB),
            ("KV pool (MiB)", "kv_pool_bytes", MiB), ("KV pool (token slots)", "kv_tokens", 1),
            ("KV bytes per token", "kv_bytes_per_token", 1),
            (f"requests that fit ({shape['prompt_len']}+{shape['gen_length']})", "requests_that_fit", 1),
            (f"concurrency (max_num_seqs {base.max_num_seqs})", "concurrency", 1)]
    for label, key, div in rows:
        t.add_row(label, *[f"{p[key] / div:,.0f}" for p in plans.values()])
    out = console(stderr=False)
    out.print(t)
    for k in (k for k, p in plans.items() if p["kv_pool_bytes"] <= 0):
        out.print(f"{k}: no KV pool, {-plans[k]['kv_pool_bytes'] / MiB:,.0f} MiB short")


def print_profiles(doc: dict) -> None:
    profiles, base, n, shape = doc["profiles"], doc["base"], doc["tensor_parallel_size"], doc["shape"]
    t = _table(title=f"KV pool sizing · {doc['model']} · budget {base.memory_budget / MiB:.0f} MiB · "
                    f"{base.max_num_batched_tokens} query tokens/step"
                    + parallel_only(n, f" · per rank of {n} (rank 0 measured; KV pool: the smallest rank's)"),
               columns=profiles)
    rows = [("weights (MiB)", "weights_bytes", MiB), ("activation peak (MiB)", "activation_peak_bytes", MiB),
            ("  refresh step (MiB)", "refresh_peak_bytes", MiB), ("  reuse step (MiB)", "reuse_peak_bytes", MiB),
            ("  chunked Refresh at max-model-len (MiB)", "long_refresh_peak_bytes", MiB),
            ("  its chunk (tokens)", "refresh_chunk_tokens", 1),
            ("guard (MiB)", "guard_bytes", MiB), ("KV pool (MiB)", "kv_pool_bytes", MiB),
            ("KV pool (token slots)", "kv_pool_tokens", 1)]
    long = any(d.get("refresh_chunk_tokens") for d in profiles.values())    # max-model-len beyond the token budget
    for label, key, div in rows:
        if key in ("long_refresh_peak_bytes", "refresh_chunk_tokens") and not long:
            continue
        t.add_row(label, *[f"{(d[key] or 0) / div:,.0f}" if key in d else d.get("error", "")[:40]
                           for d in profiles.values()])
    t.add_row(f"requests that fit ({shape['prompt_len']}+{shape['gen_length']})",
              *[f"{d.get('requests_that_fit', 0):,}" for d in profiles.values()])
    out = console(stderr=False)
    out.print(t)
    ok = [d for d in profiles.values() if "kv_pool_tokens" in d]
    if len(ok) == 2 and ok[1]["activation_peak_bytes"]:
        a, b = ok
        out.print(f"activation peak ratio (monolithic / budgeted): "
                  f"{b['activation_peak_bytes'] / a['activation_peak_bytes']:.1f}x; "
                  f"KV capacity ratio: {a['kv_pool_tokens'] / max(1, b['kv_pool_tokens']):.2f}x")
