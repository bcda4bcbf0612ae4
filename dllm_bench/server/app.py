"""The FastAPI application of `dllm-bench server`: OpenAI's completions and chat completions
over one EngineLoop, with block streaming, OpenAI-style errors, /v1/models, /health, /metrics.

A request is handed to the engine thread and the handler waits for `accepted` before it answers,
so everything add_request refuses (prompt too long for the model, the token budget or the KV
pool; ids outside the vocabulary; sampling on a greedy-only engine) is a 400 with the engine's
own message rather than an error in the middle of a stream. With `stream: true` each committed
block is one SSE chunk, the last one carries the finish reason, then a chunk with empty choices
carries the usage (OpenAI's `include_usage` shape), then `[DONE]`. A client that goes away
aborts its request, which frees its KV reservation. A completions `prompt` that is a list of
prompts is one engine request per prompt, all admitted together (or none), batched by the
scheduler like any other requests; choice i answers prompt i, stream chunks carry their choice's
index, and the usage sums over the prompts. With an API key every /v1 route wants it
(dllm_bench.server.auth); /health and /metrics stay open.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dllm_bench.metrics import page as metrics_page
from dllm_bench.server import auth, protocol
from dllm_bench.server.engine_loop import EngineLoop, Job
from dllm_bench.server.protocol import ChatCompletionRequest, CompletionRequest
from dllm_bench.server.text import Detokenizer, PromptError, chat_ids, prompt_ids
from engine.decoding import Decoding
from engine.sampling import SamplingParams

log = logging.getLogger("dllm_bench.server")


@dataclass
class ServerState:
    loop: EngineLoop
    tokenizer: Any                   # None: token-id prompts only, empty response text
    model_name: str
    model_root: str
    max_model_len: int
    block_length: int                # default block length of a request
    eos_token_id: int | None
    max_waiting: int                 # 503 once this many requests wait for admission
    retry_after_s: int = 1
    api_key: str | None = None       # every /v1 route wants `Authorization: Bearer <key>`
    decoding: Decoding = Decoding()   # the policy of a request that names no rule (server --decoding)


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          headers: dict | None = None) -> JSONResponse:
    return JSONResponse(protocol.error_body(message, kind, param, status), status_code=status, headers=headers)


def sampling_params(state: ServerState, body: protocol._Body):
    """max_tokens rounded up to whole blocks; steps default to one token per step; the body's
    parallel-decoding rule (threshold / factor / entropy) as the request's decoding policy, else
    the server's default (--decoding)."""

    max_tokens = body.gen_max_tokens()
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    block = body.block_length or state.block_length
    gen_length = math.ceil(max_tokens / block) * block
    asked = body.decoding()
    return SamplingParams(gen_length=gen_length, steps=body.steps or gen_length, block_length=block,
                          temperature=body.temperature, remasking=body.remasking, seed=body.seed or 0,
                          decoding=state.decoding if asked.fixed else asked)


def create_app(state: ServerState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if not state.loop.alive:
            state.loop.start()
        yield
        state.loop.stop()

    app = FastAPI(title="dllm-bench server", lifespan=lifespan)
    v1 = auth.guard(app, state.api_key)   # the dependencies of every /v1 route

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        e = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        return error(400, f"{'.'.join(loc) + ': ' if loc else ''}{e.get('msg')}", param=loc[0] if loc else None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error(500, f"internal server error: {type(exc).__name__}", "internal_server_error")

    @app.get("/health")
    async def health() -> JSONResponse:
        if not state.loop.alive:
            return error(503, "the engine loop is not running", "service_unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models", dependencies=v1)
    async def models() -> dict:
        return {"object": "list", "data": [protocol.model_card(state.model_name, state.model_root, state.max_model_len)]}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics_page.render(state.loop.snapshot()),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions", dependencies=v1)
    async def completions(body: CompletionRequest, request: Request):
        return await generate(state, body, request, chat=False)

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await generate(state, body, request, chat=True)

    return app


async def generate(state: ServerState, body: Any, request: Request, chat: bool):
    if body.model is not None and body.model != state.model_name:
        return error(404, f"The model `{body.model}` does not exist.", "not_found_error", "model")
    if not state.loop.alive:
        return error(503, "the engine loop is not running", "service_unavailable")
    prompts = [None] if chat else body.prompts()
    n = len(prompts)
    if n > state.max_waiting:   # could never be admitted: not a matter of retrying later
        return error(400, f"{n} prompts in one request: this server takes at most {state.max_waiting} "
                          "(--max-waiting)", param="prompt")
    waiting = state.loop.num_waiting()
    if waiting + n > state.max_waiting:
        return error(503, f"server busy: {waiting} requests waiting (limit {state.max_waiting}); retry later",
                     "service_unavailable", headers={"Retry-After": str(state.retry_after_s)})
    where = (lambda i: f"prompt[{i}]: ") if n > 1 else (lambda i: "")
    ids: list[list[int]] = []
    try:
        params = sampling_params(state, body)
        for i, p in enumerate(prompts):
            try:
                ids.append(chat_ids(state.tokenizer, [{"role": m.role, "content": m.text()} for m in body.messages])
                           if chat else prompt_ids(state.tokenizer, p))
            except (PromptError, ValueError) as e:
                raise ValueError(where(i) + str(e)) from None
    except (PromptError, ValueError) as e:
        return error(400, str(e))
    rid = protocol.new_id("chatcmpl" if chat else "cmpl")
    events: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    jobs = [Job(rid if n == 1 else f"{rid}-{i}", p, params, loop, stream=body.stream, events=events, index=i)
            for i, p in enumerate(ids)]
    state.loop.submit(*jobs)
    for _ in jobs:   # the group is admitted whole (all accepted) or refused by one of its jobs
        i, kind, payload = await events.get()
        if kind == "rejected":
            return error(400, where(i) + payload)
        if kind == "failed":
            return error(500, payload, "internal_server_error")
    reply = Reply(state, rid, jobs, events, chat, body, int(time.time()))
    if body.stream:
        return StreamingResponse(reply.stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await reply.whole(request)


class Reply:
    """The response to one accepted request (its jobs, one per prompt, reporting on one queue of
    `(index, kind, payload)` events), whole or as SSE chunks tagged with each choice's index."""

    def __init__(self, state: ServerState, rid: str, jobs: list[Job], events: asyncio.Queue, chat: bool,
                 body: Any, created: int):
        self.state, self.rid, self.jobs, self.events = state, rid, jobs, events
        self.chat, self.body, self.created = chat, body, created
        self.detoks = [Detokenizer(state.tokenizer) for _ in jobs]
        self.outs: list[Any] = [None] * len(jobs)     # RequestOutput of each finished job
        self.model = state.model_name

    def finish_reason(self, token_ids: list[int]) -> str:
        eos = self.state.eos_token_id
        return "stop" if eos is not None and eos in token_ids else "length"

    def dllm(self) -> dict | list[dict]:
        """Per-request engine counters (an extension field; OpenAI clients ignore it): one
        object for one prompt, a list in choice order for several."""
        per = [{"gen_length": j.params.gen_length, "steps": j.params.steps, "block_length": j.params.block_length,
                "decoding": str(j.params.decoding), "nfe": o.nfe, "tpf": o.tokens_per_forward,
                "steps_per_block": list(o.steps_per_block),
                "logits_rows": o.logits_rows, "kv_tokens": o.kv_tokens, "kv_bytes": o.kv_bytes,
                # From the handler's job to the engine's last block: a client's E2EL minus this is
                # what HTTP adds (parsing, events, delivery), measured within one run.
                "server_e2el_ms": None if o.finished_time is None else (o.finished_time - j.arrival_time) * 1e3}
               for j, o in zip(self.jobs, self.outs)]
        return per[0] if len(per) == 1 else per

    def usage(self) -> dict:
        return protocol.usage(sum(len(o.prompt_ids) for o in self.outs), sum(len(o.token_ids) for o in self.outs))

    def ids(self, toks: list[int]) -> list[int] | None:
        return toks if self.body.return_token_ids else None

    def abort_unfinished(self) -> None:
        for job, out in zip(self.jobs, self.outs):
            if out is None:
                self.state.loop.abort(job.request_id)

    async def whole(self, request: Request):
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while any(o is None for o in self.outs):
                waiter = asyncio.ensure_future(self.events.get())
                await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not waiter.done():
                    waiter.cancel()
                    self.abort_unfinished()
                    return error(499, "client closed the request")
                i, kind, out = waiter.result()
                if kind == "failed":
                    self.abort_unfinished()
                    return error(500, out, "internal_server_error")
                if kind == "finished":
                    self.outs[i] = out
        finally:
            gone.cancel()
        choices = [protocol.choice(self.chat, self.detoks[i].add(o.token_ids, final=True),
                                   self.finish_reason(o.token_ids), self.ids(o.token_ids), delta=False, index=i)
                   for i, o in enumerate(self.outs)]
        return JSONResponse(protocol.envelope(self.chat, self.rid, self.model, self.created, chunk=False,
                                              choices=choices, usage=self.usage(), dllm=self.dllm()))

    def sse(self, choices: list[dict], **extra: Any) -> str:
        doc = protocol.envelope(self.chat, self.rid, self.model, self.created, chunk=True, choices=choices, **extra)
        return f"data: {json.dumps(doc)}\n\n"

    async def stream(self) -> AsyncIterator[str]:
        first = [True] * len(self.jobs)
        try:
            while any(o is None for o in self.outs):
                i, kind, payload = await self.events.get()
                detok = self.detoks[i]
                if kind == "block":
                    c = protocol.choice(self.chat, detok.add(payload), None, self.ids(payload), True, first[i], i)
                    first[i] = False
                    yield self.sse([c])
                elif kind == "finished":
                    out = self.outs[i] = payload
                    rest = out.token_ids[len(detok.ids):]
                    c = protocol.choice(self.chat, detok.add(rest, final=True), self.finish_reason(out.token_ids),
                                        self.ids(rest), True, first[i], i)
                    yield self.sse([c])
                else:  # failed: the status line is gone, so the error is the last event
                    yield f"data: {json.dumps(protocol.error_body(payload, 'internal_server_error', code=500))}\n\n"
                    return
            yield self.sse([], usage=self.usage(), dllm=self.dllm())
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the generator was cancelled or closed), or a step failed
            self.abort_unfinished()


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone away (the body is already read, so the next ASGI
    message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
