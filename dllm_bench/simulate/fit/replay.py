"""A measured point replayed by the simulator exactly as it ran: the same requests and arrival
times, the system pinned to its recorded knobs and KV pool or static batch, this project's
implementation (`dllm-bench`: the code `serve` measured), its CUDA graphs captured where the run
captured them (at warm-up, or in the point) and kept by its rule. It records every forward the
system took, when it started, and the forward at which each request committed each block: what
the fit turns into linear observables of the per-step cost.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from dllm_bench import results
from dllm_bench.metrics.serving import summarize
from dllm_bench.simulate.clock import VirtualClock
from dllm_bench.simulate.cost_model import Forward, ModelShape
from dllm_bench.simulate.fit.measured import MeasuredPoint
from dllm_bench.simulate.hardware import Hardware
from dllm_bench.simulate.implementations import MEASURED_HOST
from dllm_bench.simulate.simulator import DTYPE_BYTES, SimSetup, simulate_point
from engine.models import ModelConfig, config_from_dict


@dataclass
class Replay:
    point: MeasuredPoint
    forwards: list[Forward] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    blocks: dict[str, list[int]] = field(default_factory=dict)   # request id -> forward of each block
    summary: dict = field(default_factory=dict)                   # the replay's serve metrics

    def busy_start(self) -> list[int]:
        """Per forward, the first forward of its busy period (the system idled before it)."""
        out, first = [], 0
        for i, t in enumerate(self.starts):
            if i and t > self.starts[i - 1] + self.costs[i - 1] + 1e-9 * max(1.0, t):
                first = i
            out.append(first)
        return out


@lru_cache(maxsize=16)
def _model(run_dir: str) -> tuple[ModelConfig, str, dict, float]:
    cfg = results.load_config(run_dir)["config"]
    m = cfg["model"]
    shape = ModelConfig(d_model=m["d_model"], n_heads=m["n_heads"], n_kv_heads=m["n_kv_heads"], n_layers=m["n_layers"],
                        mlp_hidden_size=m["mlp_hidden_size"], vocab_size=m["vocab_size"],
                        embedding_size=m.get("padded_vocab") or m["vocab_size"],
                        max_sequence_length=m.get("max_sequence_length") or 4096,
                        model_type=m.get("model_type") or "llada")   # runs before families were recorded: LLaDA
    model = config_from_dict(shape.family.to_hf(shape))     # through its family: biases, the prediction shift
    return model, cfg["preset"]["dtype"], dict(cfg.get("baseline_defaults") or {}), float(cfg.get("memory_budget") or 0)


def setup_for(point: MeasuredPoint, hw: Hardware) -> SimSetup:
    model, dtype, base_knobs, budget = _model(str(point.run_dir))
    return SimSetup(model, ModelShape.from_config(model, DTYPE_BYTES[dtype]), hw, dtype, {point.system: MEASURED_HOST},
                    memory_budget=budget or 80e9, baseline_defaults=base_knobs,
                    pinned={point.label: {"knobs": point.knobs, "info": point.info,
                                          "graph_capture": point.graph_capture, "graph_keep": point.graph_keep,
                                          "graphs_replayed": point.graphs_replayed}})


class _Recording(SimSetup):
    """A setup whose clock and step cost the replay sees."""

    def __init__(self, base: SimSetup, rec: Replay, cost: Callable[[Forward], float] | None):
        super().__init__(**{k: getattr(base, k) for k in base.__dataclass_fields__})
        self._rec, self._cost, self._clock = rec, cost, None

    def clock(self) -> VirtualClock:
        self._clock = VirtualClock()
        return self._clock

    def step_price(self, system: str, ranks: int = 1):
        return self._cost or super().step_price(system, ranks)

    def step_cost(self, system: str, ranks: int = 1):
        inner = self.step_price(system, ranks)

        def record(fw: Forward) -> float:
            t = inner(fw)
            self._rec.forwards.append(fw)
            self._rec.starts.append(self._clock.now())
            self._rec.costs.append(t)
            return t
        return record


def replay(point: MeasuredPoint, hw: Hardware, cost: Callable[[Forward], float] | None = None) -> Replay:
    """`point` on `hw` (or with every forward costing `cost(fw)` seconds)."""
    rec = Replay(point)
    setup = _Recording(setup_for(point, hw), rec, cost)
    out = simulate_point(point.variant, setup, point.requests, point.block_length)
    res = out["result"]
    rec.summary = summarize(res)
    ends = [s + c for s, c in zip(rec.starts, rec.costs)]
    for r in res["records"]:
        times = [r["first_token_time"]]
        for gap in r.get("itl") or []:
            times.append(times[-1] + gap)
        rec.blocks[r["request_id"]] = [_at(ends, t) for t in times]
    return rec


def _at(ends: list[float], t: float) -> int:
    """The forward that ended at `t` (block times are stamped with the end of their step)."""
    i = bisect.bisect_left(ends, t - 1e-9 * max(1.0, abs(t)))
    return min(i, len(ends) - 1)
