"""The server's API key (dllm_bench.server.auth): in process over httpx's ASGI transport with a
model-free engine, driven by the real `openai` client and by raw HTTP."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from dllm_bench.errors import UserError
from dllm_bench.server.app import ServerState, create_app
from dllm_bench.server.auth import API_KEY_ENV, exposure_warning, resolve_api_key
from dllm_bench.server.engine_loop import EngineLoop
from tests.test_server_loop import FirstStepFails

KEY = "sk-test-0123456789"


def _state(api_key: str | None) -> ServerState:
    engine = FirstStepFails()
    engine.counters["steps"] = 1        # past its failing first step: every step finishes what waits
    return ServerState(loop=EngineLoop(engine), tokenizer=None, model_name="m", model_root="", max_model_len=64,
                       block_length=4, eos_token_id=None, max_waiting=8, api_key=api_key)


def _serve(state: ServerState, go):
    """Run `go(app)` with the engine loop running; its result."""
    async def main():
        state.loop.start()
        try:
            return await go(create_app(state))
        finally:
            state.loop.stop()
    return asyncio.run(asyncio.wait_for(main(), 60))


def _client(app, **kw) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30, **kw)


def test_the_openai_client_with_the_key_is_served_and_a_wrong_key_is_a_401():
    async def go(app):
        right = openai.AsyncOpenAI(base_url="http://test/v1", api_key=KEY, max_retries=0, http_client=_client(app))
        done = await right.completions.create(model="m", prompt=[1, 2], max_tokens=6)
        listed = await right.models.list()
        wrong = openai.AsyncOpenAI(base_url="http://test/v1", api_key=KEY + "x", max_retries=0,
                                   http_client=_client(app))
        with pytest.raises(openai.AuthenticationError) as refused:
            await wrong.completions.create(model="m", prompt=[1, 2], max_tokens=6)
        return done, listed, refused.value

    done, listed, refused = _serve(_state(KEY), go)
    assert done.usage.completion_tokens == 8 and done.choices[0].finish_reason == "length"  # 6 -> 2 blocks of 4
    assert [m.id for m in listed.data] == ["m"]
    assert refused.status_code == 401
    assert refused.body["code"] == "invalid_api_key" and "incorrect API key" in refused.body["message"]


def test_every_v1_route_wants_the_key_and_health_and_metrics_stay_open():
    async def go(app):
        routes = sorted((m, r.path) for r in app.routes if r.path.startswith("/v1") for m in r.methods)
        async with _client(app) as c:
            bare = {(m, p): await c.request(m, p, json={"model": "m", "prompt": [1], "max_tokens": 4})
                    for m, p in routes}
            wrong = await c.get("/v1/models", headers={"Authorization": "Bearer nope"})
            basic = await c.get("/v1/models", headers={"Authorization": f"Basic {KEY}"})
            keyed = await c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            open_ = [await c.get("/health"), await c.get("/metrics")]
        return routes, bare, wrong, basic, keyed, open_

    routes, bare, wrong, basic, keyed, open_ = _serve(_state(KEY), go)
    assert {p for _, p in routes} == {"/v1/models", "/v1/completions", "/v1/chat/completions"}
    for r in [*bare.values(), wrong, basic]:
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "invalid_api_key"
    assert "no API key" in bare[("GET", "/v1/models")].json()["error"]["message"]
    assert "incorrect API key" in wrong.json()["error"]["message"]
    assert keyed.status_code == 200
    assert [r.status_code for r in open_] == [200, 200] and "dllm_requests_finished_total" in open_[1].text


def test_without_a_key_the_server_is_open():
    async def go(app):
        async with _client(app) as c:
            return await c.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "max_tokens": 4})

    assert _serve(_state(None), go).status_code == 200


def test_the_key_comes_from_the_option_then_the_environment(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert resolve_api_key(None) is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key(None) == "from-env"
    assert resolve_api_key("given") == "given"
    for blank in ("", "  "):
        with pytest.raises(UserError, match="--api-key is empty"):
            resolve_api_key(blank)
    monkeypatch.setenv(API_KEY_ENV, "")
    with pytest.raises(UserError, match=API_KEY_ENV):
        resolve_api_key(None)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"])
def test_loopback_without_a_key_is_not_warned_about(host):
    assert exposure_warning(host, None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "no-such-host.invalid"])
def test_binding_beyond_loopback_without_a_key_warns(host):
    text = exposure_warning(host, None)
    assert text.startswith("warning: ") and host in text and "--api-key" in text
    assert exposure_warning(host, KEY) is None
