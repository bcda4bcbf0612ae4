"""A measured serve run as the fit and the validation read it: per point, the system as it ran
(its recorded knobs and engine config, its KV pool or static batch), its requests as they
arrived (lengths and arrival times from requests.jsonl: no workload regenerated), and the
evidence of its time, finest first:

* steps: `steps.jsonl` (one object per forward, its wall time), where the run recorded it;
* blocks: every request's block-completion times (first_token_time + its ITLs), which every serve
  run records: they split the run into segments of known length;
* totals: the point's duration and mean E2EL (summary.json).

Where its engine captured CUDA graphs (config.json's `graph_capture`) and which it kept
(`graph_keep`) are replayed as recorded.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from dllm_bench import results
from dllm_bench.errors import UserError
from dllm_bench.systems.build import IN_POINT, KEEP_ALL, TIMED, WARM_UP
from dllm_bench.systems.spec import ENGINE, ENGINE_KNOBS, SystemVariant
from engine.decoding import FIXED
from workloads.serving import ServingRequest

EVIDENCE = ("steps", "blocks", "totals")
FILLER_TOKEN = 100        # prompt ids are never read by a replay: only lengths decide a schedule


@dataclass
class MeasuredPoint:
    run_dir: Path
    name: str                          # the point's directory name
    label: str                         # the system as labelled in the run (e.g. engine:cuda_graphs=False)
    system: str
    dataset: str
    rps: float
    knobs: dict                        # pinned: the recorded knobs (engine: its EngineConfig knobs)
    info: dict                         # pinned: its KV pool or static batch
    requests: list[ServingRequest]
    block_times: dict[str, list[float]]   # request id -> when each of its blocks was committed
    arrivals: dict[str, float]
    duration: float
    mean_e2el: float                   # seconds
    block_length: int
    steps: list[dict] | None = None
    graph_capture: str = IN_POINT      # where its engine captured CUDA graphs (`graph_capture`)
    graph_keep: str = KEEP_ALL         # which of them it replayed (`graph_keep`)
    device: str = ""
    date: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def variant(self) -> SystemVariant:
        return SystemVariant(self.system, (), self.label)

    @property
    def key(self) -> str:
        """The point among several runs' (two runs name their points alike)."""
        return f"{self.run_dir.name}/{self.name}"

    @property
    def graphs_replayed(self) -> frozenset[int] | None:
        """The buckets whose graphs a traced run under the timed keep replayed (steps.jsonl: `graph`,
        `padded_requests`): what its replay keeps, whatever the profile being fitted would price;
        None without a trace or under keep-all."""
        if self.graph_keep != TIMED or not self.steps:
            return None
        return frozenset(int(s.get("padded_requests") or s["requests"]) for s in self.steps if s.get("graph"))

    @property
    def evidence(self) -> str:
        return "steps" if self.steps else "blocks" if self.block_times else "totals"

    @property
    def tokens(self) -> int:
        return sum(r.gen_length for r in self.requests)


def _pins(s: dict) -> tuple[dict, dict]:
    """(knobs, capacity info) a point ran with, from its summary.json (what it recorded of them)."""
    if (s.get("system_name") or str(s.get("system", "")).split(":")[0]) == ENGINE:
        cfg = s.get("engine_config") or s.get("knobs") or {}
        # a measured engine weighs no step overhead (dllm_bench.systems.ridge), recorded or not
        knobs = {"overhead_rows": 0} | {k: cfg[k] for k in ENGINE_KNOBS if k in cfg}
        pool = (s.get("engine_config") or {}).get("kv_pool_tokens") or s.get("kv_pool_tokens")
        return knobs, ({"kv_pool_tokens": pool, "scenario": "as measured: the KV pool the run profiled"} if pool else {})
    b = s.get("max_batch_size")
    info = {"max_batch_size": b, "scenario_kind": s.get("scenario_kind") or "max-fit",
            "scenario": f"as measured: static batch B={b}"} if b else {}
    return dict(s.get("knobs") or {}), info


def graph_capture(run_dir: Path) -> str:
    """Where the run's engines captured their CUDA graphs, as its config.json records it; a run
    recorded before it said so (the committed H100 run) was made by code that captured each graph
    at its bucket's first step, inside the point."""
    where = results.load_config(run_dir).get("config", {}).get("graph_capture", IN_POINT)
    if where not in (WARM_UP, IN_POINT):
        raise UserError(f"{run_dir}: config.json's graph_capture must be {WARM_UP} or {IN_POINT}, got {where!r}")
    return where


def graph_keep(run_dir: Path) -> str:
    """Which captured graphs the run's engines replayed, as its config.json records it; a run
    recorded before it said so (the committed H100 run) was made by code that kept every one."""
    rule = results.load_config(run_dir).get("config", {}).get("graph_keep", KEEP_ALL)
    if rule not in (TIMED, KEEP_ALL):
        raise UserError(f"{run_dir}: config.json's graph_keep must be {TIMED} or {KEEP_ALL}, got {rule!r}")
    return rule


def pins(run_dirs: list[Path]) -> dict[str, dict]:
    """label -> {"knobs", "info", "graph_capture", "graph_keep", "info_by_seed"} of each system's
    first point in the runs: what `simulate --validate` pins each simulated system to, so it is
    compared with what was measured rather than with the defaults of today's code. A capacity
    measured for each workload (a baseline's max-fit batch: B=3 for one seed's lengths, 4 for
    another's) is pinned per workload seed (`info_by_seed`, `SimSetup.pin_info`)."""
    out: dict[str, dict] = {}
    for d in run_dirs:
        for s in results.load_points(d):
            if foreign(s):
                continue
            knobs, info = _pins(s)
            if s.get("system") not in out:
                out[s["system"]] = {"knobs": knobs, "info": info, "graph_capture": graph_capture(d),
                                    "graph_keep": graph_keep(d), "info_by_seed": {}}
            if s.get("workload_seed") is not None:
                out[s["system"]]["info_by_seed"].setdefault(int(s["workload_seed"]), info)
    return out


def foreign(s: dict) -> str | None:
    """Why a measured point is no system of ours to replay or simulate (an --endpoint point: its
    server's model), or None: what `--fit` and `--validate` both refuse up front."""
    if s.get("system_name") == "endpoint":
        return "an --endpoint point (its server's model is not ours to replay)"
    return None


def _jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise UserError(f"--fit: {path} is not a readable JSON-lines file ({e})") from None


def _point(run_dir: Path, cfg: dict, s: dict) -> MeasuredPoint | str:
    """The point, or why it cannot be replayed."""
    name = s["_point"]
    if foreign(s):
        return foreign(s)
    if (s.get("decoding") or FIXED) != FIXED:
        return f"decoding {s['decoding']}: its forwards per block depend on token values"
    recs = _jsonl(run_dir / "points" / name / "requests.jsonl")
    done = [r for r in recs if r.get("status", "finished") == "finished" and r.get("first_token_time") is not None]
    if not done or len(done) < len(recs) or s.get("interrupted"):
        return "not every request finished"
    knobs, info = _pins(s)
    reqs, blocks, arrivals = [], {}, {}
    for r in workload_order(done):
        rid, n, g = r["request_id"], int(r["prompt_len"]), int(r["output_len"])
        reqs.append(ServingRequest(rid, [FILLER_TOKEN] * n, n, g, float(r["arrival_time"]), g, "measured", n, g))
        t = [float(r["first_token_time"])]
        for gap in r.get("itl") or []:
            t.append(t[-1] + float(gap))
        blocks[rid], arrivals[rid] = t, float(r["arrival_time"])
    steps_path = run_dir / "points" / name / "steps.jsonl"
    env = results.load_config(run_dir).get("environment") or {}
    created = str(results.load_config(run_dir).get("created_utc") or "")
    return MeasuredPoint(run_dir, name, s["system"], s.get("system_name") or s["system"].split(":")[0], s["dataset"],
                         float(s["rps"]), knobs, info, reqs, blocks, arrivals, float(s["duration_s"]),
                         float(s["mean_e2el_ms"]) / 1e3, int(cfg.get("preset", {}).get("block_length") or 32),
                         _jsonl(steps_path) if steps_path.is_file() else None, graph_capture(run_dir),
                         graph_keep(run_dir), device=env.get("cuda_device") or "", date=created[:10])


def workload_order(recs: list[dict]) -> list[dict]:
    """requests.jsonl's records (written as requests finish) in the order serve handed them over:
    by arrival, ties in workload order (serve.loadgen sorts stably; a generated workload numbers
    its requests `<dataset>-<i>`), so requests arriving together are admitted as they were."""
    def index(rid: str) -> float:
        tail = str(rid).rpartition("-")[2]
        return int(tail) if tail.isdigit() else math.inf
    return sorted(recs, key=lambda r: (float(r["arrival_time"]), index(r["request_id"])))


def load(run_dirs: list[Path], console=None) -> list[MeasuredPoint]:
    """Every point of the runs that a replay can reproduce (the others named on `console`)."""
    out = []
    for d in run_dirs:
        cfg = results.load_config(d).get("config", {})
        if cfg.get("simulated"):
            raise UserError(f"--fit: {d} is a simulated run; give measured serve runs")
        for s in results.load_points(d):
            p = _point(d, cfg, s)
            if isinstance(p, str):
                if console is not None:
                    console.print(f"{d.name}/{s['_point']}: left out ({p})", markup=False, highlight=False)
                continue
            if not math.isfinite(p.duration) or p.duration <= 0:
                continue
            out.append(p)
    if not out:
        raise UserError("--fit: no point of the given runs can be replayed (every request finished, fixed decoding)")
    return out
