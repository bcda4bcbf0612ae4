"""The resolved options of a serving run (ServeRun): preset with overrides, model, systems,
rates and the workloads built once per (dataset, rps) point.

`serve`, `simulate`, `ablate` and `sweep` resolve their ServeOptions into one
(dllm_bench.serve.options.resolve_run), so every kind of point is measured by the same loop from
the same kind of run.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllm_bench.metrics.options import MetricOptions
from dllm_bench.serve.presets import ServePreset
from dllm_bench.systems.build import GRAPH_KEEP, graph_capture
from dllm_bench.systems.decoding import SystemDecoding
from dllm_bench.systems.decoding import resolve as resolve_decoding
from dllm_bench.systems.spec import SystemVariant, retention_knobs
from engine.decoding import Decoding


@dataclass
class ServeRun:
    preset: ServePreset              # with CLI overrides applied
    model_dir: Path
    model_info: dict
    systems: list[SystemVariant]
    datasets: list[str]
    rps: list[float]                 # for trace arrivals: the single offered rate per dataset
    arrivals: str
    burstiness: float
    seed: int
    num_prompts: int | None
    duration: float | None
    dataset_path: str | None
    time_scale: float
    burstgpt_model: str | None
    memory_budget: int | None
    max_duration: float | None
    num_warmups: int
    use_cache: bool
    repeats: int = 1                 # each point run with workload seeds seed, seed + 1, ...
    # How memory_budget came about (device_defaults.MemoryBudget.to_dict(): spec, detail); an
    # `auto` budget was measured once when the options were resolved.
    memory_budget_source: dict | None = None
    workloads: dict = field(default_factory=dict)   # (dataset, rps) -> [ServingRequest]
    # The ServeOptions the run was resolved from (what the user typed; e.g. the GPU projection
    # re-resolves them on another preset).
    options: Any = None
    max_concurrency: int | None = None   # vLLM's --max-concurrency: requests in flight at most
    # What each point's summary reports besides its fixed metrics: percentiles, goodput SLOs.
    metric_options: MetricOptions = field(default_factory=MetricOptions)
    # --decoding: the policy every system that has it upstream runs (decoding_for)
    decoding: Decoding = Decoding()
    # --trace-steps: every point writes steps.jsonl, one row per forward (dllm_bench.serve.trace)
    trace_steps: bool = False
    # The key `serve --endpoint` sends (--api-key, $OPENAI_API_KEY): never written to the run.
    api_key: str | None = field(default=None, repr=False)

    def decoding_for(self, variant: SystemVariant) -> SystemDecoding:
        """What `variant` decodes with under --decoding (an endpoint is asked for the policy as given)."""
        if variant.is_endpoint:
            return SystemDecoding(self.decoding)
        return resolve_decoding(variant.name, self.decoding, variant.knob_dict)

    @property
    def engine_defaults(self) -> dict:
        return self.preset.engine_defaults()

    @property
    def baseline_defaults(self) -> dict:
        knobs = {k: dict(v) for k, v in self.preset.baseline_knobs.items()}
        for name, own in retention_knobs(self.preset.retention).items():   # one retention for every sparse system
            knobs.setdefault(name, {}).update(own)
        return knobs

    @property
    def graph_capture(self) -> str:
        """Where its engines capture their CUDA graphs (config.json's `graph_capture`, what
        `simulate --fit` replays): at warm-up, or inside the points of a run without one."""
        return graph_capture(self.num_warmups)

    @property
    def graph_keep(self) -> str:
        """Which captured graphs its engines replay (config.json's `graph_keep`): today's rule."""
        return GRAPH_KEEP

    def describe(self) -> dict:
        """What every run directory's config.json records about the run (each command adds its own)."""
        p = self.preset
        return {"preset": p.to_dict(), "preset_line": p.describe(), "model_dir": str(self.model_dir),
                "model": self.model_info, "seed": self.seed, "memory_budget": self.memory_budget,
                "memory_budget_source": self.memory_budget_source,
                "num_warmups": self.num_warmups, "graph_capture": self.graph_capture, "graph_keep": self.graph_keep,
                "max_duration": self.max_duration,
                "max_concurrency": self.max_concurrency, "metric_options": self.metric_options.to_dict(),
                "decoding": str(self.decoding), "engine_defaults": self.engine_defaults,
                "baseline_defaults": self.baseline_defaults, "trace_steps": self.trace_steps}

    def measurement(self, rate: float) -> str:
        """How throughput is measured at one arrival rate (ablate and sweep)."""
        if rate == float("inf"):
            return "saturation: every request at t=0 (rps inf); throughput = output tokens / makespan"
        return f"open loop at {rate:g} req/s ({self.arrivals}); throughput = output tokens / makespan"

    def fingerprint(self) -> dict:
        """What a resumed run must share with the original for its points to be comparable."""
        p = self.preset
        # Budgets scaled with a measured GPU follow its free memory, its ridge its measured peaks:
        # what must match is "auto".
        auto = {k: "auto" for k, rule in (("max_num_batched_tokens", p.tokens_rule), ("max_num_logits", p.logits_rule),
                                          ("ridge_rows", p.ridge_rule.replace("measured", "auto", 1)))
                if rule.startswith("auto")}
        auto |= {"ridge_rule": ""} if "ridge_rows" in auto else {}
        return {"model": str(self.model_dir), "preset": p.to_dict() | {"rps": None, **auto}, "seed": self.seed,
                "arrivals": self.arrivals, "burstiness": self.burstiness, "num_prompts": self.num_prompts,
                "duration": self.duration, "dataset_path": self.dataset_path, "time_scale": self.time_scale,
                "burstgpt_model": self.burstgpt_model, "memory_budget": self._budget_key(),
                "max_duration": self.max_duration, "max_concurrency": self.max_concurrency,
                # finished points keep the summaries they were written with: same SLOs and percentiles
                "metric_options": None if self.metric_options.is_default else self.metric_options.to_dict(),
                # runs made before --decoding existed decoded fixed: they resume as such
                "decoding": None if self.decoding.fixed else str(self.decoding)}

    @property
    def budget_is_auto(self) -> bool:
        return (self.memory_budget_source or {}).get("spec") == "auto"

    def _budget_key(self) -> int | str | None:
        # An auto budget is re-measured by a resumed invocation, then replaced by the run's
        # recorded one (dllm_bench.serve.points.keep_run_budget): what must match is "auto".
        return "auto" if self.budget_is_auto else self.memory_budget
