"""`dllm-bench memory` on the CPU (tiny preset; issue "long contexts").

* the longest canvas it reports is the largest that runs: measured again, it fits and the next
  length of the grid does not (the engine beyond its token budget, and a baseline);
* the run's files and its one JSON document; each system's steps, their split and ratios; the
  docs' memory table rendered from the run;
* bad input: a budget that does not hold the weights is one error line (exit 2); a length
  beyond the model's trained length warns once; malformed options are one error line;
* the derivation's scaling rules (widths, dtypes) and its longest-length solve; cache=auto's
  in the mode that reaches furthest, its none branch measured with an empty pool.
"""
from __future__ import annotations

import json

import pytest

from dllm_bench.checkpoints.load import load_model, load_shape
from dllm_bench.memory_bench import derive as dv
from dllm_bench.memory_bench.modes import derive_auto, none_traces
from dllm_bench.memory_bench.options import MemoryOptions, parse_target, resolve
from dllm_bench.memory_bench.trace import StepMemory, Trace, measure
from dllm_bench.report import current

ARGS = dict(model="tiny", memory_budget="1100KiB", systems="engine:cache=dual,max_num_batched_tokens=64,llada",
            max_length=1024, resolution=64, length=128, device="cpu")


@pytest.fixture
def cli(cli_in_process):
    """cli(code, *args) -> (stdout, stderr) of `dllm-bench ARGS` in this process, which must exit `code`."""
    def run(code: int, *args: str) -> tuple[str, str]:
        r = cli_in_process(*args)
        assert r.returncode == code, r.stderr
        return r.stdout, r.stderr
    return run


def _flags(d: dict) -> list[str]:
    return [a for k, v in d.items() if k != "device" for a in (f"--{k.replace('_', '-')}", str(v))] + ["--device", "cpu"]


@pytest.mark.slow
def test_longest_canvas_is_the_largest_that_runs(cli, tmp_path):
    out, err = cli(0, "memory", *_flags(ARGS), "--result-dir", str(tmp_path), "--json")
    doc = json.loads(out)
    run_dir = tmp_path / doc["run_id"]
    for f in ("config.json", "summary.json", "memory.csv", "steps.csv", "probes.csv", "plots/memory_steps.png"):
        assert (run_dir / f).is_file(), f
    run = resolve(MemoryOptions(**ARGS))
    model = load_model(run.model_dir, run.dtype, "cpu")
    by = {s["system"]: s for s in doc["systems"]}
    assert set(by) == {v.label for v in run.variants}
    for v in run.variants:
        s = by[v.label]["search"]
        n = s["max_length"]
        assert n is not None and s["first_failing"] == n + run.resolution, s
        assert measure(v, model, run, n).fits                      # measured again: it runs
        assert not measure(v, model, run, n + run.resolution).fits   # the next size up does not
        prof = by[v.label]["profile"]
        assert prof["complete"] and len(prof["steps"]) == run.steps
        st = prof["stats"]
        assert st["peak_to_average"] >= 1 and st["peak_bytes"] <= run.budget.bytes
        assert all(x["total"] == x["weights"] + x["kv"] + x["logits"] + x["ffn"] + x["attention"]
                   for x in prof["steps"])
    engine = by[run.variants[0].label]
    assert engine["search"]["max_length"] > 64                  # beyond the engine's token budget
    assert engine["profile"]["stats"]["at_peak"]["kv"] > 0      # its pool is allocated memory
    assert engine["cache"] == "dual" and engine["max_num_batched_tokens"] == 64
    assert "longest canvas" in err and "peak-to-average" in err
    # The docs' memory table from this run: a row per system with its longest canvas and ratios.
    table = current.render(run_dir)
    for v, name in zip(run.variants, ("engine:cache=dual", "llada"), strict=True):
        row = next(r for r in table.splitlines() if r.startswith(f"| {name} "))
        st = by[v.label]["profile"]["stats"]
        assert f"| {by[v.label]['search']['max_length']:,} " in row and f"{st['peak_to_average']:.2f} · " in row


def test_budget_below_the_weights_is_one_error_line(cli):
    _, err = cli(2, "memory", "--model", "tiny", "--memory-budget", "100KiB", "--device", "cpu")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "does not hold the weights" in lines[0]


@pytest.mark.parametrize("args,msg", [
    (["--gen-length", "12", "--block-length", "8"], "multiple of --block-length"),
    (["--length", "8"], "must exceed the generated tokens"),
    (["--systems", "llada:batch=2"], "one request at a time"),
    (["--resolution", "0"], "--resolution must be positive"),
    (["--derive", "llada-8b:1GiB"], "does not hold llada-8b"),
])
def test_bad_options_are_one_error_line(cli, args, msg):
    _, err = cli(2, "memory", "--model", "tiny", "--memory-budget", "64MiB", "--device", "cpu", *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], err


def test_a_length_beyond_the_trained_length_warns_once(cli, tmp_path):
    trained = load_shape("tiny").max_sequence_length
    _, err = cli(0, "memory", "--model", "tiny", "--memory-budget", "64MiB", "--device", "cpu", "--systems", "llada",
                 "--no-search", "--length", str(trained + 8), "--max-length", str(4 * trained), "--steps-per-block", "1",
                 "--result-dir", str(tmp_path))
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "trained length" in warnings[0] and "--length" in warnings[0]


def _trace(length: int, parts: dict, kv_used: int = 0) -> Trace:
    step = StepMemory(0, "refresh", 0, 0, 0, kv_used, 0, 0, 0, parts)
    return Trace("x", length, True, steps=[step], complete=True)


def test_derivation_scales_by_width_and_dtype():
    src, target = load_shape("tiny"), parse_target("llada-8b:24GiB")
    scale = dv.scaler(src, "float32", target)
    # logits rows scale with the vocabulary; the model dtype becomes bf16, float64 stays float64
    assert scale("logits/torch.float32", 4.0) == pytest.approx(4.0 * 126464 / src.padded_vocab / 2)
    assert scale("logits/torch.float64", 8.0) == pytest.approx(8.0 * 126464 / src.padded_vocab)
    assert scale("ffn/torch.float32", 4.0) == pytest.approx(4.0 * 12288 / src.mlp_hidden_size / 2)
    kv_src = src.n_layers * src.kv_heads * src.head_dim
    assert scale("kv/torch.float32", 4.0) == pytest.approx(4.0 * 32 * 32 * 128 / kv_src / 2)


def test_derived_longest_length_solves_the_budget():
    """Per-token bytes b and a constant a, both measured at two lengths: the longest L with
    weights + a + b L <= budget, at the target's scale."""
    run = resolve(MemoryOptions(model="tiny", memory_budget="64MiB", device="cpu", systems="llada",
                                derive="llada-8b:24GiB"))
    model = load_model(run.model_dir, run.dtype, "cpu")
    traces = [_trace(n, {"logits/torch.float64": 1000 + 10 * n}) for n in (100, 200)]
    d = dv.derive("llada", traces, model, run, run.target)
    k = 126464 / model.config.padded_vocab
    weights = dv.weights_of(run.target.config, "bfloat16")
    want = int((run.target.budget - weights - 1000 * k) // (10 * k))
    assert d.bytes_per_token == pytest.approx(10 * k) and abs(d.max_length - want) <= 1
    assert dv.derive("llada", traces[:1], model, run, run.target).max_length is None     # one length: no fit


def test_auto_is_derived_in_the_mode_that_reaches_furthest():
    """cache=auto runs a canvas dual while it fits, else sparse, else none: its derived longest
    canvas is the longest of its modes' (none, holding no KV, here), the dynamic ratio its own
    request's at --length. The none branch is measured with an empty pool where the search did
    not run it so: that request ran none, holding no KV."""
    run = resolve(MemoryOptions(model="tiny", memory_budget="64MiB", device="cpu", systems="engine",
                                derive="llada-8b:24GiB", length=320, gen_length=32))
    model = load_model(run.model_dir, run.dtype, "cpu")
    variant = run.variants[0]
    dual = [_trace(n, {"kv/torch.float32": 512 * n, "attention/torch.float32": 1000 + 40 * n}, 512 * n)
            for n in (160, 320)]
    none = [_trace(n, {"attention/torch.float32": 1000 + 60 * n}) for n in (160, 320)]
    for t, mode in [(t, "dual") for t in dual] + [(t, "none") for t in none]:
        t.cache = mode
    d = derive_auto(variant, dual + none, model, run, reservation=0.0, guard=0.0)
    want = dv.derive("engine", none, model, run, run.target, 0.0, 0.0)
    assert d.mode == "none" and d.max_length == want.max_length
    assert d.max_length > dv.derive("engine", dual, model, run, run.target, 0.0, 0.0).max_length
    measured = none_traces(variant, dual[1:], model, run)
    assert [(t.length, t.cache, t.complete) for t in measured] == [(320, "none", True)]
    assert all(s.kv_used == 0 and s.parts for s in measured[0].steps)
