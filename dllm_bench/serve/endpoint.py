"""Open-loop replay of a workload against an OpenAI-compatible HTTP endpoint (`serve --endpoint`):
the HTTP counterpart of dllm_bench.serve.loadgen.run_open_loop, returning the same result
document, so metrics, result files and plots are shared with the in-process systems.

Every request is sent at t0 + its arrival offset whatever the server is doing, each on its own
asyncio task (httpx, no connection limit), like vLLM's `bench serve`; with `max_concurrency` at
most that many are in flight and the others wait for a slot in arrival order (vLLM's semaphore),
their latencies counted from when they are sent (`start_time`). Times are taken on this side:
arrival = the scheduled send time, then the response's own times (dllm_bench.serve.response).
A key (`--api-key`, else OPENAI_API_KEY) goes with every request as `Authorization: Bearer`, as
OpenAI's clients send it; it is no part of the Endpoint, whose knobs are written to the run.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import httpx

from dllm_bench.checkpoints.load import load_tokenizer
from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.errors import UserError
from dllm_bench.serve.loadgen import ProgressFn, _get, arrival_offset
from dllm_bench.serve.response import Outcome, error_text, http_overhead, record, scrape, send, stats_delta
from dllm_bench.systems.spec import ENDPOINT, SystemVariant
from engine.decoding import Decoding

APIS = ("completions", "chat")
CONNECT_TIMEOUT_S = 30.0
API_KEY_ENV = "OPENAI_API_KEY"   # the key OpenAI's clients send when none is given


class EndpointError(Exception):
    """The endpoint cannot be used (unreachable, no models, not OpenAI-compatible)."""


@dataclass(frozen=True)
class Endpoint:
    url: str                       # base URL ending in /v1
    model: str
    api: str = "completions"       # completions | chat
    stream: bool = True
    dllm_extras: bool = True       # send block_length/steps and ask for token ids (our server)
    decoding: Decoding = Decoding()   # serve --decoding, sent as threshold / factor / entropy with the extras

    def variant(self) -> SystemVariant:
        """The endpoint as a system of a serve run. Its label, which names it in every table,
        plot and point directory, is the served model at its URL (`label`), so a served engine
        is never mistaken for the in-process `engine`; `system_name` stays `endpoint`."""
        knobs = (("url", self.url), ("model", self.model), ("api", self.api), ("stream", self.stream),
                 ("dllm_extras", self.dllm_extras))
        return SystemVariant(ENDPOINT, knobs, self.label)

    @property
    def label(self) -> str:
        return f"{self.model}@{self.url}"

    @classmethod
    def from_variant(cls, v: SystemVariant) -> Endpoint:
        return cls(**v.knob_dict)

    @property
    def completions_url(self) -> str:
        return self.url + ("/chat/completions" if self.api == "chat" else "/completions")

    @property
    def root(self) -> str:
        """The server's root (where /metrics and /health live)."""
        return self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise EndpointError(f"--endpoint must be an http(s) URL, got {url!r}")
    return url if url.endswith("/v1") else url + "/v1"


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def endpoint_api_key(option: str | None) -> str | None:
    """The key `serve --endpoint` sends: --api-key, else $OPENAI_API_KEY, else none."""
    return option or os.environ.get(API_KEY_ENV) or None


def list_models(url: str, timeout: float = CONNECT_TIMEOUT_S, api_key: str | None = None) -> list[dict]:
    """GET {url}/models: the endpoint's model cards (EndpointError when it does not answer)."""
    try:
        r = httpx.get(url + "/models", timeout=timeout, headers=auth_headers(api_key))
        if r.status_code == 401:
            raise EndpointError(f"endpoint {url} refused the API key ({error_text(401, r.text)}): "
                                f"give the server's key with --api-key or ${API_KEY_ENV}")
        r.raise_for_status()
        data = r.json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise EndpointError(f"endpoint {url} does not list its models ({type(e).__name__}: {e})") from None
    if not data:
        raise EndpointError(f"endpoint {url} serves no model")
    return list(data)


def request_body(ep: Endpoint, item: Any, *, block_length: int | None, decode: Callable | None) -> dict:
    ids = list(_get(item, "prompt_ids"))
    gen = int(_get(item, "gen_length"))
    body: dict[str, Any] = {"model": ep.model, "max_tokens": gen, "temperature": 0.0, "stream": ep.stream}
    if ep.api == "chat":
        body["messages"] = [{"role": "user", "content": decode(ids)}]
    else:
        body["prompt"] = ids
    if ep.stream:
        body["stream_options"] = {"include_usage": True}
    if ep.dllm_extras:
        body.update(steps=gen, return_token_ids=True)
        if block_length:
            body["block_length"] = block_length
        d = ep.decoding
        if not d.fixed:
            body[d.kind] = d.value
    return body


async def replay(ep: Endpoint, workload: Iterable[Any], *, block_length: int | None = None,
                 decode: Callable[[list[int]], str] | None = None, progress: ProgressFn | None = None,
                 max_duration: float | None = None, progress_interval: float = 0.25,
                 holder: dict | None = None, max_concurrency: int | None = None,
                 api_key: str | None = None) -> dict:
    """Replay `workload` against `ep` in real time, at most `max_concurrency` requests in flight
    (None: no cap); the result document of run_open_loop. `holder["result"]` is kept current,
    so a caller interrupted by Ctrl-C still has the partial result."""
    if ep.api == "chat" and decode is None:
        raise ValueError("the chat API sends text: pass decode (token ids -> text)")
    items = sorted(enumerate(workload), key=lambda p: arrival_offset(p[1]))
    clock = time.perf_counter
    holder = {} if holder is None else holder
    records: list[dict] = []
    rejected: list[dict] = []
    live: dict[str, asyncio.Task] = {}
    started: set[str] = set()   # live requests past the concurrency cap (the others wait unsent)
    state = {"arrived": 0, "sent": 0, "out_tokens": 0, "interrupted": False, "timed_out": False}
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency is not None else contextlib.nullcontext()
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=auth_headers(api_key)) as client:
        before = await scrape(client, ep.root, CONNECT_TIMEOUT_S)
        t0 = clock()

        def result() -> dict:
            el = clock() - t0
            return {"records": list(records), "rejected": list(rejected), "duration": el,
                    "interrupted": state["interrupted"], "timed_out": state["timed_out"],
                    "unfinished": len(started), "unfinished_ids": sorted(started),
                    "not_sent": len(items) - state["sent"],
                    "num_requests": len(items), "stats": {}}

        async def one(idx: int, item: Any, arrival: float) -> None:
            rid = str(_get(item, "request_id") or f"req-{idx}")
            out = Outcome()
            async with slots:
                start = arrival if max_concurrency is None else max(arrival, clock())
                started.add(rid)
                state["sent"] += 1
                try:
                    await send(client, ep.completions_url, request_body(ep, item, block_length=block_length,
                                                                        decode=decode), out, clock)
                except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:  # transport or a malformed reply
                    out.error = f"{type(e).__name__}: {e}"
                live.pop(rid, None)
                started.discard(rid)
            if out.error is not None or out.finished is None:
                rejected.append({"request_id": rid, "prompt_len": len(_get(item, "prompt_ids")),
                                 "gen_length": _get(item, "gen_length"), "arrival_time": arrival - t0,
                                 "error": out.error or "no response"})
                return
            rec = record(rid, len(_get(item, "prompt_ids")), out, arrival, start, t0)
            records.append(rec)
            state["out_tokens"] += rec["output_len"]

        async def report() -> None:
            while True:
                holder["result"] = result()
                if progress is not None:
                    el = clock() - t0
                    progress(state["arrived"], len(records), state["out_tokens"] / el if el > 0 else 0.0)
                await asyncio.sleep(progress_interval)

        reporter = asyncio.create_task(report())
        deadline = math.inf if max_duration is None else t0 + float(max_duration)
        try:
            for idx, item in items:
                at = t0 + arrival_offset(item)
                if at > deadline:
                    break
                await asyncio.sleep(max(0.0, at - clock()))
                rid = str(_get(item, "request_id") or f"req-{idx}")
                live[rid] = asyncio.create_task(one(idx, item, at))
                state["arrived"] += 1
            pending = list(live.values())
            if pending:
                _, still = await asyncio.wait(pending, timeout=None if math.isinf(deadline) else max(0.0, deadline - clock()))
                if still:
                    state["timed_out"] = True
            elif state["arrived"] < len(items):
                state["timed_out"] = True
        except asyncio.CancelledError:
            state["interrupted"] = True
        finally:
            reporter.cancel()
            res = result()
            for task in list(live.values()):  # closing the connection makes the server abort it
                task.cancel()
            await asyncio.gather(*live.values(), return_exceptions=True)
            res["stats"] = {**stats_delta(before, await scrape(client, ep.root, CONNECT_TIMEOUT_S)),
                            **http_overhead(records)}
            holder["result"] = res
            if progress is not None:
                progress(state["arrived"], len(records), state["out_tokens"] / max(res["duration"], 1e-9))
    return res


def run_endpoint(ep: Endpoint, workload: Iterable[Any], **kw: Any) -> dict:
    """replay() from synchronous code. Ctrl-C: a KeyboardInterrupt carrying the partial result
    as `.partial` (the convention of dllm_bench.serve.process.run_worker)."""
    holder: dict = {}
    try:
        return asyncio.run(replay(ep, list(workload), holder=holder, **kw))
    except KeyboardInterrupt:
        exc = KeyboardInterrupt()
        res = holder.get("result")
        if res is not None:
            res["interrupted"] = True
        exc.partial = res  # type: ignore[attr-defined]
        raise exc from None


def measure_endpoint(run: Any, variant: SystemVariant, workload: list, on_event: Callable[[dict], None]) -> dict:
    """One serve point against an endpoint: {result, info} as a worker writes it, and the
    worker's progress events on the way (dllm_bench.serve.process.progress_handler)."""

    ep = replace(Endpoint.from_variant(variant), decoding=run.decoding)
    decode = None
    if ep.api == "chat":
        tok = load_tokenizer(run.model_dir)
        decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    cards = {m.get("id"): m for m in list_models(ep.url, api_key=run.api_key)}
    on_event({"event": "status", "message": f"{ep.url} ({ep.api}, {'stream' if ep.stream else 'whole'})"})
    total = len(workload)
    t0 = time.perf_counter()

    def progress(arrived: int, finished: int, tps: float) -> None:
        on_event({"event": "progress", "arrived": arrived, "finished": finished, "total": total, "tps": tps,
                  "elapsed": time.perf_counter() - t0})

    card = cards.get(ep.model, {})
    info = {"system": ENDPOINT, "label": variant.label, "kind": "endpoint", "knobs": variant.knob_dict,
            "model_id": ep.model,
            "scenario": f"HTTP endpoint {ep.url}, model {ep.model}, {ep.api} API, "
                        f"{'streamed' if ep.stream else 'whole responses'}",
            "scenario_kind": "endpoint", "served_model_root": card.get("root"), "memory_budget": None}
    try:
        res = run_endpoint(ep, workload, block_length=run.preset.block_length if ep.dllm_extras else None,
                           decode=decode, progress=progress, max_duration=run.max_duration,
                           max_concurrency=run.max_concurrency, api_key=run.api_key)
    except KeyboardInterrupt as e:
        part = getattr(e, "partial", None)
        e.partial = None if part is None else {"result": part, "info": info}  # type: ignore[attr-defined]
        raise
    on_event({"event": "done"})
    info["kv_pool_tokens"] = res["stats"].get("kv_pool_tokens")
    return {"result": res, "info": info}


def resolve_endpoint(url: str, model_name: str | None, api: str, stream: bool, dllm_extras: bool,
                     model: str | None, api_key: str | None = None) -> tuple[Endpoint, str | None]:
    """`serve --endpoint` options -> (the Endpoint, the --model whose vocabulary and tokenizer
    the workload uses). Without --model: the served model's id, or its `root`, when it names a
    local preset or checkpoint. Any problem is a UserError (nothing measured yet). `api_key`
    is sent, never stored: it is no part of the Endpoint (whose knobs go into config.json)."""

    if api not in APIS:
        raise UserError(f"--api must be one of {', '.join(APIS)}, got {api!r}")
    try:
        base = normalize_url(url)
        cards = list_models(base, api_key=api_key)
    except EndpointError as e:
        raise UserError(str(e)) from None
    ids = [c.get("id") for c in cards]
    name = model_name or ids[0]
    if model_name is not None and model_name not in ids:
        raise UserError(f"--endpoint-model {model_name!r}: {base} serves {', '.join(map(str, ids))}")
    if model is None:
        card = cards[ids.index(name)]
        for candidate in (name, card.get("root")):
            if not candidate:
                continue
            try:
                resolve_model(candidate)
            except UserError:
                continue
            model = candidate
            break
        else:
            raise UserError(f"{base} serves {name!r}, which is no local preset or checkpoint: give --model "
                            "(a preset or checkpoint dir with the served model's tokenizer) for the workload")
    return Endpoint(base, name, api, stream, dllm_extras), model
