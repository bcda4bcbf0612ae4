"""The server's engine loop when the engine fails: the requests in flight get an OpenAI-style
500 (never a hang), and the next request is served. In process, over httpx's ASGI transport,
with an engine whose first step raises."""
from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

import httpx

from dllm_bench.server.app import ServerState, create_app
from dllm_bench.server.engine_loop import EngineLoop
from engine.request import RequestOutput


class FirstStepFails:
    """The serving-system interface with no model: the first step raises, later ones finish
    every waiting request with gen_length copies of token 3."""

    def __init__(self) -> None:
        self.scheduler = SimpleNamespace(waiting=deque(), running=[])
        self.pool = SimpleNamespace(used=0, capacity=None, bytes_per_token=0)
        self.counters = {"steps": 0}
        self.batch_sizes: list[int] = []
        self.aborted: list[str] = []

    def add_request(self, prompt_ids, params, request_id=None, arrival_time=None):
        self.scheduler.waiting.append((request_id, list(prompt_ids), params))
        return request_id

    def abort(self, request_id):
        self.aborted.append(request_id)
        self.scheduler.waiting = deque(r for r in self.scheduler.waiting if r[0] != request_id)

    def has_unfinished(self):
        return bool(self.scheduler.waiting)

    def step(self):
        self.counters["steps"] += 1
        if self.counters["steps"] == 1:
            raise RuntimeError("boom")
        batch, self.scheduler.waiting = list(self.scheduler.waiting), deque()
        self.batch_sizes.append(len(batch))
        return [RequestOutput(rid, ids, [3] * p.gen_length, 1, 0.0, 0.0, 0.0, 0.0) for rid, ids, p in batch]


def test_a_failing_step_is_a_500_and_the_server_keeps_serving():
    engine = FirstStepFails()
    state = ServerState(loop=EngineLoop(engine), tokenizer=None, model_name="m", model_root="", max_model_len=64,
                        block_length=4, eos_token_id=None, max_waiting=8)

    async def go():
        state.loop.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)),
                                         base_url="http://test", timeout=30) as c:
                body = {"model": "m", "prompt": [1, 2], "max_tokens": 6}
                first = await c.post("/v1/completions", json=body)
                second = await c.post("/v1/completions", json=body)
                metrics = (await c.get("/metrics")).text
                return first, second, metrics
        finally:
            state.loop.stop()

    first, second, metrics = asyncio.run(asyncio.wait_for(go(), 60))
    assert first.status_code == 500
    err = first.json()["error"]
    assert "engine step failed" in err["message"] and "boom" in err["message"] and err["code"] == 500
    assert second.status_code == 200
    assert second.json()["usage"] == {"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10}  # 6 -> 2 blocks of 4
    assert "dllm_requests_failed_total 1.0" in metrics and "dllm_requests_finished_total 1.0" in metrics
    assert len(engine.aborted) == 1          # the failed request was taken out of the engine
