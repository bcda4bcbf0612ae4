"""`dllm-bench ablate`, `sweep` and `report`: the ladder's effective configurations, the sweep's
preset-scaled points, the report rendered from fixture runs, and bad options -> exit 2."""
import json
import re
import sys
from pathlib import Path

import pytest

from dllm_bench import results
from dllm_bench.ablate import ladder as ab
from dllm_bench.errors import UserError
from dllm_bench.report import claims as pc
from dllm_bench.report import document as rp
from dllm_bench.serve.presets import PRESETS
from dllm_bench.sweep import lengths as sw
from dllm_bench.systems.spec import parse_system, parse_systems


# ---------------------------------------------------------------- the ladder's configurations
def _engine_defaults(preset: str) -> dict:
    """What `ablate` hands the workers as run-wide engine defaults for a preset (ServeRun's
    engine_defaults after ablation_settings' overrides)."""
    sp = PRESETS[preset]
    st = ab.ablation_settings(sp.name, sp.num_prompts)
    ml, own = st["max_num_logits"], sp.engine_defaults()      # a preset's "auto" as on a CPU
    return {"max_num_batched_tokens": st["max_num_batched_tokens"] or own["max_num_batched_tokens"],
            "max_num_logits": int(ml) if ml else own["max_num_logits"], "max_num_seqs": sp.max_num_seqs,
            "retention": sp.retention}


@pytest.mark.parametrize("preset", ["cpu-default", "tiny", "paper"])
def test_consecutive_rungs_differ_only_in_the_switched_component(preset):
    d = _engine_defaults(preset)
    rungs = ab.ladder(d["max_num_logits"])
    assert [r.key for r in rungs] == ["baseline", "engine", "scheduler", "logits"]
    eff = ab.effective_configs(rungs, d, {"sparse-dllm": {"keep_ratio": d["retention"], "kernel_size": 3}},
                               memory_budget=2**30)
    assert eff[0]["system"] == "sparse-dllm" and [e["system"] for e in eff[1:]] == ["engine"] * 3
    # The baseline keeps the same retention as the engine (the paper's "Algorithmic Consistency").
    assert eff[0]["config"]["keep_ratio"] == eff[1]["config"]["retention"] == d["retention"]
    e1, e2, e3 = (e["config"] for e in eff[1:])
    assert (e1["scheduler"], e1["max_num_logits"], e1["cache"], e1["selection"]) == ("request", None, "sparse", "head")
    assert ab.config_diff(e1, e2) == {"scheduler"} and e2["scheduler"] == "phase"
    assert ab.config_diff(e2, e3) == {"max_num_logits"} and e3["max_num_logits"] == d["max_num_logits"]
    # Same token budget, memory budget, retention... everywhere: only the switch differs.
    for e in (e1, e2, e3):
        assert e["max_num_batched_tokens"] == d["max_num_batched_tokens"] and e["memory_budget"] == 2**30
        assert e["sampling"] is False and e["kv_pool_tokens"] is None
    assert ab.check_ladder_configs([None, e1, e2, e3], rungs) == []


def test_cache_rows_differ_from_the_full_engine_only_in_cache_or_selection():
    d = _engine_defaults("cpu-default")
    rungs, rows = ab.ladder(d["max_num_logits"]), ab.cache_rows(d["max_num_logits"])
    full = ab.effective_configs(rungs[-1:], d)[0]["config"]
    eff = {r.key: ab.effective_configs([r], d)[0]["config"] for r in rows}
    assert ab.config_diff(full, eff["cache-none"]) == {"cache"} and eff["cache-none"]["cache"] == "none"
    assert ab.config_diff(full, eff["cache-dual"]) == {"cache"} and eff["cache-dual"]["cache"] == "dual"
    assert ab.config_diff(full, eff["cache-auto"]) == {"cache"} and eff["cache-auto"]["cache"] == "auto"
    # Every ladder rung is the paper's sparse engine, never the engine system's default (auto).
    assert [e["config"]["cache"] for e in ab.effective_configs(rungs[1:], d)] == ["sparse"] * (len(rungs) - 1)
    assert ab.config_diff(full, eff["cache-sparse-head"]) == set()
    assert ab.config_diff(full, eff["cache-sparse-uniform"]) == {"selection"}
    # The sparse-head row IS the last rung: same label, so it is measured once.
    assert parse_system(rows[3].spec).label == parse_system(rungs[-1].spec).label
    assert len({parse_system(r.spec).label for r in rungs + rows}) == len(rungs) + len(rows) - 1
    assert ab.check_ladder_configs([eff[r.key] for r in rows], rows, reference=full) == []


def test_lookahead_rung_differs_from_the_full_engine_only_in_the_scheduler():
    d = _engine_defaults("cpu-default")
    rungs, beyond = ab.ladder(d["max_num_logits"]), ab.beyond_rungs(d["max_num_logits"])
    assert [r.key for r in beyond] == ["lookahead"] and beyond[0].group == "beyond"
    full = ab.effective_configs(rungs[-1:], d)[0]["config"]
    la = ab.effective_configs(beyond, d)[0]["config"]
    assert ab.config_diff(full, la) == {"scheduler"} and la["scheduler"] == "lookahead"
    cfgs = [None] + [e["config"] for e in ab.effective_configs(rungs[1:] + beyond, d)]
    assert ab.check_ladder_configs(cfgs, rungs + beyond, reference=full) == []
    # Compared with the full engine, not with the rung listed before it.
    (problem,) = ab.check_ladder_configs(cfgs, rungs + beyond, reference=cfgs[2])
    assert "look-ahead" in problem and "max_num_logits" in problem
    assert len({parse_system(r.spec).label for r in rungs + beyond}) == len(rungs) + 1


def test_config_check_flags_any_other_difference_but_not_the_pool_size():
    d = _engine_defaults("cpu-default")
    rungs = ab.ladder(d["max_num_logits"])
    cfgs = [None] + [e["config"] for e in ab.effective_configs(rungs[1:], d)]
    # The profiler sizes the pool after the switch: a bigger pool under the logit budget is expected.
    cfgs[2] = {**cfgs[2], "kv_pool_tokens": 1000}
    cfgs[3] = {**cfgs[3], "kv_pool_tokens": 5000}
    assert ab.check_ladder_configs(cfgs, rungs) == []
    cfgs[3] = {**cfgs[3], "max_num_batched_tokens": 4096}
    (problem,) = ab.check_ladder_configs(cfgs, rungs)
    assert "max_num_batched_tokens" in problem and "logit" in problem


def test_ladder_needs_a_logit_budget_and_options_are_checked():
    with pytest.raises(UserError, match="logit budget"):
        ab.ladder(None)
    with pytest.raises(UserError, match="unknown dataset"):
        ab.parse_dataset_list("livebench,sharegpt")
    with pytest.raises(UserError, match="--cache-rows"):
        ab.parse_cache_rows("some")
    assert ab.parse_dataset_list(None) == ["livebench", "osc", "burstgpt"]
    st = ab.ablation_settings("serve-126k", 16)
    assert st == {"max_num_batched_tokens": 384, "max_num_logits": "96", "num_prompts": 8}
    assert ab.ablation_settings("tiny", 8, None, "none", 3) == {"max_num_batched_tokens": None,
                                                                "max_num_logits": "none", "num_prompts": 3}


# ---------------------------------------------------------------- sweep points
def _plan(preset: str, vary: str, **kw):
    p = PRESETS[preset]
    return sw.plan_sweep(vary, length_scale=p.length_scale, block_length=p.block_length, device=p.device, **kw)


def test_sweep_points_scale_with_the_preset():
    # The paper's GPU preset: its grids as they are.
    gi, go = _plan("paper", "input-len"), _plan("paper", "output-len")
    assert gi.points == [(n, 256) for n in (100, 200, 300, 400, 500, 600)]
    assert go.points == [(300, n) for n in (128, 256, 384, 512)]
    # serve-126k: inputs x0.125; outputs whole 32-token blocks at x max(0.125, 32/128) = 0.25.
    ci, co = _plan("serve-126k", "input-len"), _plan("serve-126k", "output-len")
    assert ci.points == [(13, 64), (38, 64), (75, 64)] and ci.paper_points == [100, 300, 600]
    assert co.points == [(38, 32), (38, 64), (38, 128)] and co.paper_points == [128, 256, 512]
    assert co.output_scale == 0.25 and ci.input_scale == 0.125
    # tiny: block 8 -> outputs x 8/128.
    ti, to = _plan("tiny", "input-len"), _plan("tiny", "output-len")
    assert ti.values == [5, 15, 30] and to.values == [8, 16, 32]
    # Every output length is a whole number of blocks; the ratio longest/shortest is the paper's.
    for preset in PRESETS:
        plan = _plan(preset, "output-len")
        b = PRESETS[preset].block_length
        assert all(g % b == 0 for g in plan.values) and plan.values[-1] == 4 * plan.values[0]
        plan = _plan(preset, "input-len")
        assert plan.values == sorted(plan.values) and plan.fixed % b == 0
    assert _plan("cpu-default", "input-len", points="20,40", fixed=96).points == [(20, 96), (40, 96)]


@pytest.mark.parametrize("kw, msg", [
    ({"vary": "prompt"}, "--vary"),
    ({"vary": "output-len", "points": "32,40"}, "multiples of the block"),
    ({"vary": "input-len", "points": "10,x"}, "--points"),
    ({"vary": "input-len", "points": "10,10"}, "twice"),
    ({"vary": "input-len", "fixed": 50}, "multiple of the block"),
])
def test_sweep_bad_points(kw, msg):
    with pytest.raises(UserError, match=msg):
        _plan("cpu-default", kw.pop("vary"), **kw)


# ---------------------------------------------------------------- report from fixture runs
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


def _point(run_dir, system, dataset, tp, rps=float("inf"), **kw):
    s = {"output_throughput": tp, "request_throughput": tp / 100, "completed": 8, "total_output_tokens": 800,
         "duration_s": 800 / tp, "mean_e2el_ms": 1e5 / tp, "p99_e2el_ms": 2e5 / tp, "std_e2el_ms": 1e4 / tp,
         "latency_std_ms": 1e4 / tp, "latency_span_ms": 3e4 / tp, "interrupted": False,
         "system_name": system.split(":")[0], "is_baseline": not system.startswith("engine"), **kw}
    results.write_point(run_dir, results.PointKey(system, rps, dataset), s, [{"request_id": "r0"}])


def _fixture_runs(root: Path) -> None:
    # serve: L40S-like numbers at 1.0 req/s (engine 1.61x the best baseline, 2.81x Sparse-dLLM).
    d = results.create_run("serve", {"preset_line": "preset fixture"}, run_id="serve-fx", root=root)
    for sysname, tp in (("engine", 90.0), ("fast-dllm", 56.0), ("sparse-dllm", 32.0)):
        _point(d, sysname, "livebench", tp, rps=1.0, p99_e2el_ms=(1e5 if sysname == "engine" else 4e5),
               latency_std_ms=(50.0 if sysname == "engine" else 120.0))
        _point(d, sysname, "livebench", tp / 2, rps=0.25)
    (d / "plots").mkdir()
    (d / "plots" / "throughput_vs_rps.png").write_bytes(PNG)
    # accuracy: gsm8k, head 0.6 vs uniform 0.3 at r = 0.1 (2.0x; the paper's 75.1/40.0 = 1.88x).
    d = results.create_run("accuracy", {"task": "gsm8k"}, run_id="acc-fx", root=root)
    pts = [{"point": "dense", "system": "engine", "role": "dense", "selection": None, "retention": 1.0, "n": 20,
            "accuracy": 0.8, "ci_low": 0.6, "ci_high": 0.9}]
    for sel, accs in (("head", (0.6, 0.7)), ("uniform", (0.3, 0.55))):
        for r, a in zip((0.1, 0.2), accs, strict=True):
            pts.append({"point": f"{sel}-r{r}", "system": "engine", "role": "sparse", "selection": sel,
                        "retention": r, "n": 20, "accuracy": a, "ci_low": a - 0.1, "ci_high": a + 0.1})
    results.atomic_write_json(d / "summary.json", {"task": "gsm8k", "model": "fx", "metric": "strict-match",
                                                   "points": pts})
    (d / "fig6_accuracy_vs_retention.png").write_bytes(PNG)
    # ablate: livebench follows the paper (1.48 -> 1.60 -> 1.75), osc does not (0.90 -> 1.20 -> 1.10).
    rungs, crows = ab.ladder(96), ab.cache_rows(96)
    lab = {r.key: parse_system(r.spec).label for r in rungs + crows}
    cfg = {"preset_line": "preset fixture", "measurement": "saturation", "num_prompts": 8,
           "datasets": ["livebench", "osc"],
           "ladder": [{**r.to_dict(), "label": lab[r.key]} for r in rungs],
           "cache_rows": [{**r.to_dict(), "label": lab[r.key]} for r in crows]}
    d = results.create_run("ablate", cfg, run_id="ablate-fx", root=root)
    for ds, tps in (("livebench", (10.0, 14.8, 16.0, 17.5)), ("osc", (10.0, 9.0, 12.0, 11.0))):
        for r, tp in zip(rungs, tps, strict=True):
            _point(d, lab[r.key], ds, tp, stats={"refresh_request_steps": 100, "reuse_request_steps": 700},
                   query_tokens=16000)
    for key, tp, q in (("cache-none", 6.0, 50000), ("cache-dual", 18.0, 12000), ("cache-sparse-uniform", 15.0, 16000)):
        _point(d, lab[key], "livebench", tp, query_tokens=q, stats={})
    (d / "plots").mkdir()
    (d / "plots" / "fig8_ablation.png").write_bytes(PNG)
    # sweeps: input-len falls 3.0x -> 2.5x like the paper; output-len rises 1.2x -> 1.5x (it does not).
    for vary, ratios in (("input-len", (3.0, 2.7, 2.5)), ("output-len", (1.2, 1.3, 1.5))):
        plan = _plan("cpu-default", vary)
        cfg = {"vary": vary, "plan": plan.to_dict(), "systems_labels": ["engine", "sparse-dllm"],
               "reference": "sparse-dllm", "preset_line": "preset fixture", "num_prompts": 8, "measurement": "saturation"}
        d = results.create_run("sweep", cfg, run_id=f"sweep-{vary}-fx", root=root)
        for pt, x in zip(plan.points, ratios, strict=True):
            _point(d, "sparse-dllm", plan.label(pt), 10.0, max_batch_size=4)
            _point(d, "engine", plan.label(pt), 10.0 * x)


def test_report_renders_tables_figures_and_computed_verdicts(tmp_path):
    root = tmp_path / "runs"
    _fixture_runs(root)
    runs = rp.find_runs(root)
    assert {k: v.name for k, v in runs.items()} == {
        "serve": "serve-fx", "accuracy": "acc-fx", "ablate": "ablate-fx",
        "sweep:input-len": "sweep-input-len-fx", "sweep:output-len": "sweep-output-len-fx"}
    doc = rp.render(tmp_path / "out" / "report.md", root)
    assert doc["missing"] == [] and doc["errors"] == {}
    text = re.sub(r" +", " ", (tmp_path / "out" / "report.md").read_text())  # tabulate pads columns
    # The tables, side by side with the paper's numbers (quoted as the paper's).
    for needle in ("| dataset | rung | system | throughput_tok_s | x_vs_baseline |", "| paper x |",
                   "| input_len | output_len | paper_len | engine tok/s | sparse-dllm tok/s | x engine |",
                   "| cache policy |", "| point | system | selection | retention |", "1.48x", "1.75x",
                   "paper: Table 4", "paper: Fig. 6b", "## Summary of claims"):
        assert needle in text, needle
    # Figures copied next to the report and linked relatively.
    for png in ("serve-throughput_vs_rps.png", "accuracy-gsm8k-fig6_accuracy_vs_retention.png",
                "ablate-fig8_ablation.png"):
        assert (tmp_path / "out" / "report_files" / png).is_file()
        assert f"](report_files/{png})" in text
    v = {c["claim"]: c["verdict"] for c in doc["claims"]}
    assert v["Throughput vs the strongest baseline"] == "matches"            # 90 / 56 = 1.61x
    assert v["Up to 3.12× vs Sparse-dLLM (Table 4, L40S, 1.0 req/s)"] == "matches"   # 2.81x
    assert v["~4× lower tail latency under heavy contention"] == "matches"  # p99 4.0x
    assert v["Lower latency jitter (Fig. 5)"] == "matches"                  # sigma gain 2.4x
    tag = "(mean-query rule, the paper's code)"
    assert v[f"gsm8k: head-centric beats uniform at low retention {tag}"] == "matches"
    assert v[f"gsm8k: head-centric at the lowest r ≈ uniform at the next r {tag}"] == "matches"
    assert v["+ inference engine on livebench"] == "matches"
    assert v["+ logit-aware budgeting on livebench"] == "matches"
    assert v["+ inference engine on osc"] == "does not match"                # 0.90x: slower than the baseline
    assert v["+ phase-multiplexed scheduler on osc"].startswith("same direction, smaller")
    assert v["Every component adds throughput on livebench"] == "matches"
    assert v["Every component adds throughput on osc"].startswith("does not match")
    assert v["The inference engine is the largest single gain on osc"] == "does not match"
    assert v["Speedup falls as the input length grows"] == "matches (same trend)"
    assert v["Speedup falls as the output length grows"] == "does not match (opposite trend)"
    assert v["Speedup vs sparse-dllm at the shortest output length"].startswith("same direction, smaller")
    assert "+ phase-multiplexed scheduler on livebench" not in v             # not stated in the paper's text
    # One verdict line per claim in the body, and the summary table lists them all.
    assert text.count("**Verdict:") == len(doc["claims"])
    assert "- livebench: sparse (head) 17.50 vs dual 18.00 tok/s (0.97×, dual faster); query tokens per " \
           "output token 20.0 vs 15.0." in text


def test_report_with_missing_runs_says_so(tmp_path):
    doc = rp.render(tmp_path / "r.md", tmp_path / "empty")
    assert set(doc["missing"]) == {"serve", "accuracy", "ablate", "sweep:input-len", "sweep:output-len"}
    text = (tmp_path / "r.md").read_text()
    assert "- ablate: **missing**" in text and "no claims could be checked" in text


def test_verdict_rule():
    assert pc.verdict(1.7, 1.61, 1.81) == "matches"
    assert pc.verdict(1.2, 1.61, 1.81).startswith("same direction, smaller")
    assert pc.verdict(0.8, 1.61, 1.81) == "does not match"
    assert pc.verdict(None, 1.5) == "no data"
    assert pc.trend_verdict(3.0, 2.0, 3.12, 2.45) == "matches (same trend)"


def test_sweep_scheduler_setting_runs_each_engine_under_each_scheduler():
    from dllm_bench.sweep.schedulers import with_schedulers

    assert with_schedulers("engine,sparse-dllm", None) == "engine,sparse-dllm"
    got = with_schedulers("engine,engine:cache=dual,engine:scheduler=request,sparse-dllm", "phase,lookahead")
    assert [v.label for v in parse_systems(got)] == [
        "engine:scheduler=phase", "engine:scheduler=lookahead", "engine:cache=dual,scheduler=phase",
        "engine:cache=dual,scheduler=lookahead", "engine:scheduler=request", "sparse-dllm"]
    with pytest.raises(UserError, match="--scheduler: expected one of"):
        with_schedulers("engine", "phase,look-ahead")
    with pytest.raises(UserError, match="lists phase twice"):
        with_schedulers("engine", "phase,phase")


# ---------------------------------------------------------------- the CLI
def _cli(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """`dllm-bench ARGS` in this process (cli.main: UserError -> one line + exit 2)."""
    from dllm_bench import cli

    monkeypatch.setattr(sys, "argv", ["dllm-bench", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("args, msg", [
    (("sweep", "--vary", "batch-size"), "--vary must be one of"),
    (("sweep", "--vary", "input-len", "--preset", "tiny", "--scheduler", "greedy"), "--scheduler: expected one of"),
    (("ablate", "--datasets", "livebench,sharegpt"), "unknown dataset 'sharegpt'"),
    (("ablate", "--cache-rows", "most"), "--cache-rows"),
    (("report", "--out", "report.txt"), "--out must be a .md file"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, monkeypatch, capsys, args, msg):
    code, out, err = _cli(monkeypatch, capsys, *args, "--result-dir", str(tmp_path / "runs"))
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], err
    assert out == "" and not (tmp_path / "runs").exists()


def test_unknown_option_exits_2(monkeypatch, capsys):
    code, _, err = _cli(monkeypatch, capsys, "ablate", "--no-such-flag")
    assert code == 2 and "No such option" in err


def test_report_cli_renders_the_fixture(tmp_path, monkeypatch, capsys):
    _fixture_runs(tmp_path / "runs")
    out = tmp_path / "rep" / "r.md"
    code, stdout, err = _cli(monkeypatch, capsys, "report", "--out", str(out), "--result-dir",
                             str(tmp_path / "runs"), "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["report"] == str(out) and out.is_file() and not doc["missing"]
    assert "21 claims" in err and "matches" in err

