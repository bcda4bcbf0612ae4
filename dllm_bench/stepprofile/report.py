"""The human side of profile-step (stderr): where a step's time went, what it computed against
the device's measured peaks, and the longest ops or kernels."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dllm_bench.stepprofile.categories import CATEGORIES


def _f(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def show(doc: dict, con: Console) -> None:
    st, comp, work, pk = doc["step"], doc["composition"], doc["work"], doc["peaks"]
    say = lambda text: con.print(text, markup=False, highlight=False)  # noqa: E731
    say(f"profile-step {doc['system']} ({doc.get('scenario') or doc['kind']}) on {doc['device_name']}, {doc['dtype']}, "
        f"{doc['threads']} threads: batch {doc['batch']}, phase {doc['phase']}, prompt {doc['prompt_len']} + gen "
        f"{doc['gen_length']} (block {doc['block_length']}); {doc['steps']} profiled steps after {doc['warmup']} "
        f"warm-up, {doc['unprofiled_steps']} timed unprofiled")
    say(f"per step: {comp['requests']:.1f} requests ({comp['padded_requests']:.1f} run), {comp['refresh']:.1f} "
        f"refresh / {comp['reuse']:.1f} reuse, {comp['query_rows']:.0f} query rows, {comp['key_tokens']:.0f} key "
        f"tokens, {comp['logit_rows']:.0f} logit rows; CUDA-graph replays {doc['graph_replays']['profiled']}/"
        f"{doc['steps']} profiled, {doc['graph_replays']['unprofiled']}/{doc['unprofiled_steps']} unprofiled")
    if doc.get("attention"):
        say(doc["attention"])
    for b in doc.get("graph_buckets") or []:
        times = "" if b["graph_ms"] is None else f": graph {b['graph_ms']:.3f} ms, eager {b['eager_ms']:.3f} ms"
        say(f"CUDA-graph bucket {b['batch']} (block {b['block_length']}, keys {b['keys'] or 'in place'}): "
            f"{b['decision']}{times}, {b['steps']} steps")
    t = Table(title="time per step", title_justify="left")
    for c, j in (("category", "left"), ("ms", "right"), ("share", "right")):
        t.add_column(c, justify=j)
    wall = st["wall_ms"]
    for key, label in CATEGORIES.items():
        ms = st["categories_ms"][key]
        t.add_row(label, f"{ms:.3f}", f"{ms / wall:.1%}" if wall else "-")
    t.add_row("[bold]step (profiled)", f"[bold]{wall:.3f}", "100%")
    t.add_row("step (unprofiled)", _f(st["unprofiled_wall_ms"], "{:.3f}"), "")
    con.print(t)
    if work:
        say(f"work: {work['flops'] / 1e9:.3f} GFLOP (GEMM {work['gemm_flops'] / 1e9:.3f}, attention "
            f"{work['attention_flops'] / 1e9:.3f}, LM head {work['lm_head_flops'] / 1e9:.3f}), "
            f"{work['bytes'] / 1e6:.2f} MB essential traffic")
        say(f"rate: {work['tflops_per_s']:.3f} TFLOP/s = {_f(work['fraction_of_gemm_peak'], '{:.1%}')} of the "
            f"measured GEMM peak ({pk['gemm_flops_per_s'] / 1e12:.3f} TFLOP/s, {pk['gemm']}); matmuls alone "
            f"{_f(work['gemm_fraction_of_peak'], '{:.1%}')}; {work['bytes_per_s'] / 1e9:.2f} GB/s = "
            f"{_f(work['fraction_of_copy_bandwidth'], '{:.1%}')} of the measured copy bandwidth "
            f"({pk['copy_bytes_per_s'] / 1e9:.1f} GB/s, {pk['timer']})")
    top = Table(title="longest ops" if doc["device"] == "cpu" else "longest kernels", title_justify="left")
    for c, j in (("name", "left"), ("category", "left"), ("ms/step", "right"), ("calls/step", "right"),
                 ("share", "right")):
        top.add_column(c, justify=j)
    for r in doc["top"]:
        top.add_row(escape(r["name"][:90]), CATEGORIES[r["category"]], f"{r['ms_per_step']:.3f}",
                    f"{r['calls_per_step']:.1f}", _f(r["share_of_step"], "{:.1%}"))
    con.print(top)
    if doc["discarded_steps"]:
        say(f"{doc['discarded_steps']} steps chosen by their predicted phase mix did not have it (not counted)")
