"""check_layout (what `doctor` reports about a checkpoint directory): every problem a sharded
checkpoint can have, found from the headers, all of them listed, none echoed twice."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    from tests.hf_layout import make_hf_checkpoint

    return make_hf_checkpoint(tmp_path_factory.mktemp("good") / "ckpt", shards=3)


def _index(d: Path) -> dict:
    return json.loads((d / INDEX).read_text())


def _set_index(d: Path, index: dict) -> None:
    (d / INDEX).write_text(json.dumps(index))


def _first(d: Path) -> tuple[str, str]:
    """(a tensor, its shard) in the first shard."""
    wm = _index(d)["weight_map"]
    name = sorted(k for k, f in wm.items() if f.startswith("model-00001"))[0]
    return name, wm[name]


def _rewrite(d: Path, shard: str, change) -> None:
    tensors = load_file(str(d / shard))
    change(tensors)
    save_file(tensors, str(d / shard), metadata={"format": "pt"})


def wrong_shard(d):
    idx = _index(d)
    name, _ = _first(d)
    idx["weight_map"][name] = "model-00002-of-00003.safetensors"
    _set_index(d, idx)


def total_size(d):
    idx = _index(d)
    idx["metadata"]["total_size"] += 2
    _set_index(d, idx)


def truncated(d):
    f = d / _first(d)[1]
    f.write_bytes(f.read_bytes()[:-10])


def missing_shard(d):
    (d / _first(d)[1]).unlink()


def escaping_path(d):
    idx = _index(d)
    for k, f in idx["weight_map"].items():
        if f.startswith("model-00001"):
            idx["weight_map"][k] = "../" + f
    _set_index(d, idx)


def quantized(d):
    name, shard = _first(d)
    _rewrite(d, shard, lambda t: t.update({name: t[name].to(torch.int8)}))


def unlisted(d):
    name, shard = _first(d)
    _rewrite(d, shard, lambda t: t.update({"model.extra.weight": t[name].clone()}))


def dropped_and_reshaped(d):
    name, shard = _first(d)
    other = sorted(load_file(str(d / shard)))[1]
    idx = _index(d)
    del idx["weight_map"][name]
    _set_index(d, idx)
    _rewrite(d, shard, lambda t: (t.pop(name), t.update({other: t[other][..., :-1].clone()})))


def bad_config(d):
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "n_heads": 0}))


def empty_index(d):
    _set_index(d, {"metadata": {}, "weight_map": {}})


CASES = {  # mutation -> the problem lines it must produce, in order
    wrong_shard: ["puts 1 tensor(s) in the wrong shard"],
    total_size: ["metadata.total_size is"],
    truncated: ["corrupt safetensors file model-00001-of-00003.safetensors (truncated"],
    missing_shard: ["shard model-00001-of-00003.safetensors listed in model.safetensors.index.json is missing"],
    escaping_path: ["names '../model-00001-of-00003.safetensors', which is not a file name"],
    quantized: ["metadata.total_size is", "not stored as floating point (quantized?)"],
    unlisted: ["are not in model.safetensors.index.json: model.extra.weight", "metadata.total_size is",
               "config.json does not describe, e.g. model.extra.weight"],
    dropped_and_reshaped: ["metadata.total_size is", "1 tensor(s) missing", "config.json implies"],
    bad_config: ["'n_heads' must be a positive integer"],
    empty_index: ["is not a safetensors index (its weight_map is empty)"],
}


@pytest.mark.parametrize("mutate", list(CASES), ids=lambda f: f.__name__)
def test_every_problem_is_reported_once(good, tmp_path, mutate):
    from dllm_bench.checkpoints.layout import check_layout

    d = tmp_path / "ckpt"
    shutil.copytree(good, d)
    mutate(d)
    report = check_layout(d)
    assert not report.ok
    assert len(report.problems) == len(CASES[mutate]), report.problems
    for line, want in zip(report.problems, CASES[mutate]):
        assert want in line, report.problems


def test_report_of_a_good_checkpoint_and_of_no_checkpoint(good, tmp_path):
    from dllm_bench.checkpoints.layout import check_layout

    report = check_layout(good)
    assert report.ok and report.problems == [] and report.shards == 3 and report.n_tensors == 21
    assert report.n_params == sum(t.numel() for f in good.glob("*.safetensors") for t in load_file(str(f)).values())
    none = check_layout(tmp_path / "nowhere")
    assert not none.ok and none.n_tensors == 0 and "no config.json" in none.problems[0]
    (tmp_path / "empty").mkdir()
    shutil.copy(good / "config.json", tmp_path / "empty")
    assert check_layout(tmp_path / "empty").problems == ["no model.safetensors or model.safetensors.index.json"]
