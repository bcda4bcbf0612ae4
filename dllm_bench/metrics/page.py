"""The `/metrics` page: the server's state in the Prometheus text format (prometheus_client), read
from EngineLoop.snapshot(); and the reverse, for `serve --endpoint`: the counters of a scraped
page, so a point can report the engine's steps and batch sizes over HTTP. A leaf both the server
(which renders it) and serve (which parses it) import, so neither package imports the other."""
from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "dllm_"

# (snapshot key, metric name, help); gauges are current values, counters only grow.
GAUGES = (
    ("requests_running", "requests_running", "requests admitted to the engine's running set"),
    ("requests_waiting", "requests_waiting", "requests waiting for admission"),
    ("kv_pool_used_tokens", "kv_pool_used_tokens", "KV pool token slots reserved by running requests"),
    ("kv_pool_capacity_tokens", "kv_pool_capacity_tokens", "KV pool capacity in token slots (absent: unbounded)"),
    ("max_batch_size", "batch_size_max", "largest number of requests in one step"),
)
COUNTERS = (
    ("requests_finished", "requests_finished", "requests that finished"),
    ("requests_aborted", "requests_aborted", "requests aborted (client went away)"),
    ("requests_rejected", "requests_rejected", "requests the engine could never run (HTTP 400)"),
    ("requests_failed", "requests_failed", "requests failed by an engine error"),
    ("prompt_tokens", "prompt_tokens", "prompt tokens of admitted requests"),
    ("generation_tokens", "generation_tokens", "generated tokens of finished requests"),
    ("engine_steps", "steps", "engine steps (one model forward each)"),
    ("engine_forwards", "forwards", "model forwards"),
    ("engine_query_tokens", "query_tokens", "query tokens run through the model"),
    ("engine_logits_rows", "logits_rows", "rows of logits materialized"),
    ("batched_requests", "batched_requests", "sum over steps of the requests in the step (/ steps = mean batch)"),
    ("step_seconds", "step_seconds", "wall time inside engine steps"),
)


class _SnapshotCollector:
    def __init__(self, snapshot: Mapping):
        self.snapshot = snapshot

    def collect(self):
        s = self.snapshot
        for key, name, doc in GAUGES:
            if s.get(key) is not None:
                yield GaugeMetricFamily(PREFIX + name, doc, value=s[key])
        used, cap = s.get("kv_pool_used_tokens"), s.get("kv_pool_capacity_tokens")
        if used is not None and cap:
            yield GaugeMetricFamily(PREFIX + "kv_pool_usage", "fraction of the KV pool reserved", value=used / cap)
        for key, name, doc in COUNTERS:
            if s.get(key) is not None:
                yield CounterMetricFamily(PREFIX + name, doc, value=s[key])


def render(snapshot: Mapping) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshot))
    return generate_latest(registry)


def parse(text: str) -> dict[str, float]:
    """`dllm_*` samples of a Prometheus page by name (counters without their `_total`)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(PREFIX) and not s.name.endswith("_created"):
                out[s.name.removesuffix("_total")] = s.value
    return out
