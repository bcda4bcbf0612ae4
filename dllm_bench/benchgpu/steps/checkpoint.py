"""Step `checkpoint`: the model every later step runs. A preset is made into the cache by
`dllm-bench models make` (llada-8b: weights drawn on the GPU, the real 6-shard layout) unless it
is there already; a directory given as --model is checked (config, index, headers) and used."""
from __future__ import annotations

from pathlib import Path

from dllm_bench.benchgpu.record import OK, Bench, StepRecord
from dllm_bench.benchgpu.subcommand import run_cli
from dllm_bench.checkpoints.layout import check_layout
from dllm_bench.checkpoints.presets import PRESETS
from dllm_bench.checkpoints.store import asset_dir, is_made, preset_path


def existing_dir(model: str) -> Path | None:
    """The checkpoint directory of --model if it exists now (nothing is made)."""
    if model not in PRESETS:
        return Path(model).expanduser()
    preset = PRESETS[model]
    if preset.asset:
        return asset_dir(preset)
    path = preset_path(preset)
    return path if path is not None and is_made(preset, path) else None


def estimate(bench: Bench) -> float:
    made = existing_dir(bench.model) is not None
    return bench.costs.process_s if made else bench.costs.make_s  # made: its headers are checked


def _describe(path: Path) -> tuple[bool, str, dict]:
    report = check_layout(path)
    if not report.ok:
        return False, f"{path}: {report.problems[0]}", {}
    info = {"params": report.n_params, "tensors": report.n_tensors, "shards": report.shards,
            "bytes": report.total_bytes, "dtypes": report.dtypes}
    return True, (f"{report.n_params / 1e9:.2f}B parameters in {report.n_tensors} tensors, {report.shards} "
                  f"shard(s), {'/'.join(report.dtypes)}, {report.total_bytes / 2**30:.2f} GiB"), info


def run(bench: Bench, rec: StepRecord) -> None:
    made_now = False
    path = existing_dir(bench.model)
    if path is None:
        outcome = run_cli(["models", "make", bench.model], bench.log("checkpoint"))
        rec.outputs.append(bench.rel(outcome.log))
        path = existing_dir(bench.model)
        if not outcome.ok or path is None:
            rec.fail(f"models make {bench.model}: {outcome.reason()}")
            return
        made_now = True
    ok, line, info = _describe(path)
    if not ok:
        rec.fail(line)
        return
    bench.model_dir = path
    how = "made now" if made_now else ("given" if bench.model not in PRESETS else "already made")
    rec.status, rec.detail = OK, f"{bench.model} ({how}): {line}; {path}"
    rec.data = {"path": str(path), "made_now": made_now, **info}
