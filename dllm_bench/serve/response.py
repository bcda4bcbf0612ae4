"""One request to an OpenAI-compatible server, read as its response arrives, and what the
server reports about a point: the pieces `serve --endpoint` (dllm_bench.serve.endpoint) replays
a workload with.

A streamed response is timed chunk by chunk: the first chunk with a choice is the first token
(for a diffusion server, the first committed block) and the later ones give ITL, one gap per
block. Output lengths come from the response's token ids or usage (the server's count, so a
dLLM's whole blocks count as generated), else from the chunks. Our own server adds per-request
NFE, logit rows and KV (its `dllm` extension) and, on /metrics, the step counts.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx

from dllm_bench.metrics.page import parse
from dllm_bench.serve.loadgen import inter_token_latencies

# /metrics counters whose increase over a point is reported as the point's system stats.
SCRAPED_COUNTERS = {"steps": "dllm_steps", "forwards": "dllm_forwards", "query_tokens": "dllm_query_tokens",
                    "logits_rows": "dllm_logits_rows"}


class Outcome:
    """What one request produced, filled while its response arrives."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.chunks: list[float] = []   # arrival of every chunk with a choice (one per block)
        self.finished: float | None = None
        self.tokens = 0                # from streamed token ids or chunks
        self.usage: dict | None = None
        self.dllm: dict | None = None
        self.error: str | None = None

    def choice(self, c: Mapping, now: float) -> None:
        if self.first is None:
            self.first = now
        ids = c.get("token_ids")
        self.tokens += len(ids) if ids is not None else 1

    def document(self, doc: Mapping) -> None:
        if doc.get("usage"):
            self.usage = doc["usage"]
        if doc.get("dllm"):
            self.dllm = doc["dllm"]


async def send(client: httpx.AsyncClient, url: str, body: dict, out: Outcome, clock: Callable[[], float]) -> None:
    """POST `body` to `url` and fill `out` as the response arrives (each SSE chunk timed on
    `clock` when `body["stream"]`)."""
    if not body.get("stream"):
        r = await client.post(url, json=body)
        if r.status_code != 200:
            out.error = error_text(r.status_code, r.text)
            return
        doc = r.json()
        out.finished = clock()
        for c in doc.get("choices", []):
            out.tokens += len(c.get("token_ids") or ())
        out.document(doc)
        return
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            out.error = error_text(r.status_code, (await r.aread()).decode(errors="replace"))
            return
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            doc = json.loads(data)
            if "error" in doc:
                out.error = str(doc["error"].get("message", doc["error"]))
                return
            now = clock()
            if doc.get("choices"):
                out.chunks.append(now)
            for c in doc.get("choices") or ():
                out.choice(c, now)
            out.document(doc)
    out.finished = clock()


def error_text(status: int, text: str) -> str:
    try:
        msg = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = text[:200]
    return f"HTTP {status}: {msg}"


def record(rid: str, prompt_len: int, out: Outcome, arrival: float, start: float, t0: float) -> dict:
    usage = out.usage or {}
    d = out.dllm or {}
    return {
        "request_id": rid,
        "prompt_len": int(usage.get("prompt_tokens") or prompt_len),
        "output_len": int(usage.get("completion_tokens") or out.tokens),
        "arrival_time": arrival - t0, "start_time": start - t0, "admitted_time": None,
        "first_token_time": None if out.first is None else out.first - t0,
        "finished_time": out.finished - t0, "itl": inter_token_latencies(out.chunks),
        "nfe": d.get("nfe"), "logits_rows": d.get("logits_rows"), "kv_tokens": d.get("kv_tokens"),
        "kv_bytes": d.get("kv_bytes"), "server_e2el_ms": d.get("server_e2el_ms"),
        "steps_per_block": d.get("steps_per_block"), "tpf": d.get("tpf"),
    }


async def scrape(client: httpx.AsyncClient, root: str, timeout: float) -> dict[str, float]:
    """The server's dllm_* metrics (its /metrics under `root`), or {} when it has none (any
    other OpenAI server)."""
    try:
        r = await client.get(root + "/metrics", timeout=timeout)
        return parse(r.text) if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


def stats_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict:
    if not after:
        return {}
    out: dict[str, Any] = {k: int(after[m] - before.get(m, 0)) for k, m in SCRAPED_COUNTERS.items() if m in after}
    steps = out.get("steps")
    if steps and "dllm_batched_requests" in after:
        out["mean_batch_size"] = (after["dllm_batched_requests"] - before.get("dllm_batched_requests", 0)) / steps
    if "dllm_kv_pool_capacity_tokens" in after:
        out["kv_pool_tokens"] = int(after["dllm_kv_pool_capacity_tokens"])
    return out


def http_overhead(records: Iterable[Mapping]) -> dict:
    """Median and largest time HTTP added to a request (client E2EL minus the server's own
    job-to-last-block time), from servers that report it (ours); {} from others."""
    added = sorted((r["finished_time"] - r.get("start_time", r["arrival_time"])) * 1e3 - r["server_e2el_ms"] for r in records
                   if r.get("server_e2el_ms") is not None and r.get("finished_time") is not None)
    if not added:
        return {}
    return {"http_overhead_median_ms": statistics.median(added), "http_overhead_max_ms": added[-1]}
