"""The server's socket: bound before the engine is built, refused in one line when taken, and
`--port 0` announces the port the OS chose, which is the one uvicorn then serves on."""
from __future__ import annotations

import socket
import types

import pytest

from dllm_bench.errors import UserError
from dllm_bench.server import startup
from dllm_bench.server.options import ServerOptions


def test_a_taken_port_is_one_line_before_anything_is_built():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(UserError, match="cannot listen on 127.0.0.1:"):
            startup.open_listener("127.0.0.1", taken.getsockname()[1])
    with pytest.raises(UserError, match="--port must be in"):
        startup.open_listener("127.0.0.1", 70000)


def test_port_zero_prints_and_serves_the_port_bound(monkeypatch, capsys):
    import uvicorn

    served = {}
    state = types.SimpleNamespace(model_name="tiny")
    monkeypatch.setattr(startup, "build_state", lambda o, **kw: (state, {"label": "engine", "kv_pool_tokens": 64}))
    monkeypatch.setattr("dllm_bench.server.app.create_app", lambda s: ("app", s))
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets: served.update(sockets=sockets))
    startup.start(ServerOptions(host="127.0.0.1", port=0, model="tiny", threads=1, max_waiting=8, sampling=False))
    (sock,) = served["sockets"]
    try:
        port = sock.getsockname()[1]
        assert port != 0
        assert f"on http://127.0.0.1:{port}/v1" in capsys.readouterr().err
    finally:
        sock.close()
