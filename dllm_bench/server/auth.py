"""The server's API key, as vLLM's `--api-key`: with a key, every `/v1` route wants
`Authorization: Bearer KEY` and answers anything else with a 401 in OpenAI's error JSON;
`/health` and `/metrics` stay open (probes and Prometheus scrapers carry no key).

The key comes from `server --api-key` or the DLLM_BENCH_API_KEY environment variable (vLLM's is
VLLM_API_KEY). Without one the server is open, so binding it beyond loopback is warned about.
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import socket

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dllm_bench.errors import UserError
from dllm_bench.server import protocol

API_KEY_ENV = "DLLM_BENCH_API_KEY"


class Unauthorized(Exception):
    """A /v1 request without the server's key."""


def resolve_api_key(option: str | None) -> str | None:
    """--api-key, else $DLLM_BENCH_API_KEY, else None (an open server). An empty or blank key
    would let nothing (or everything, to a careless check) through, so it is refused."""
    key = option if option is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        where = "--api-key" if option is not None else f"${API_KEY_ENV}"
        raise UserError(f"{where} is empty: give a key, or none for an open server")
    return key


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1); a name that
    does not resolve counts as not loopback."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (socket.gaierror, UnicodeError):
        return False
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server other machines can reach that takes requests from anyone."""
    if api_key or is_loopback(host):
        return None
    return (f"warning: serving on {host} without an API key: anyone who can reach this machine can use the "
            f"engine; give --api-key KEY (or ${API_KEY_ENV}), or bind to 127.0.0.1")


def guard(app: FastAPI, api_key: str | None) -> list:
    """The dependencies every /v1 route takes (none for an open server); installs the 401
    handler. The comparison takes the same time whatever the key sent (secrets.compare_digest)."""
    if not api_key:
        return []
    bearer = HTTPBearer(auto_error=False)
    want = api_key.encode()

    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), want):
            raise Unauthorized

    @app.exception_handler(Unauthorized)
    async def unauthorized(request: Request, exc: Unauthorized) -> JSONResponse:
        sent = "no API key" if "authorization" not in request.headers else "an incorrect API key"
        body = protocol.error_body(f"You provided {sent}: this server wants `Authorization: Bearer <key>`.",
                                   "invalid_request_error")
        body["error"]["code"] = "invalid_api_key"      # OpenAI's code for a 401
        return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    return [Depends(check)]
