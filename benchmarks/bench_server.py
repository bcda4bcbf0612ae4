"""`make bench-server`: the HTTP server's own cost per request, with a stub engine, from one run.

The stub finishes every request in the step after it arrives, with no model work, so what is
left is the server: parsing and validating the body, the hand-over to the engine thread and
back, building the response (or the SSE chunks). The server runs in its own process pinned to
one core (`--server-core`); the load generator (httpx, `--concurrency` requests in flight)
pinned to another. Reported per mode (whole response, streamed): requests/s seen by the client,
and the server process's CPU seconds per request, whose inverse is the request rate one core of
server-side handling sustains (the number to compare with a GPU engine's request rate). On a
shared machine the CPU-time figure is the robust one: it does not count time the process waited.
`--repeats N` measures both modes N times on the same server; the run directory (kind
bench-server, benchmarks/bench_result.py) holds each, the summary table their median and range.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import bench_result
import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


class StubEngine:
    """The serving-system interface with no model: each request finishes in the next step with
    `gen_length` copies of token 1. Just enough engine state for EngineLoop and /metrics."""

    def __init__(self) -> None:
        from collections import deque
        from types import SimpleNamespace

        self.scheduler = SimpleNamespace(waiting=deque(), running=[])
        self.pool = SimpleNamespace(used=0, capacity=None, bytes_per_token=0)
        self.counters = {"steps": 0, "forwards": 0, "query_tokens": 0, "logits_rows": 0}
        self.batch_sizes: list[int] = []
        self.max_model_len = 1 << 20

    def add_request(self, prompt_ids, params, request_id=None, arrival_time=None) -> str:
        self.scheduler.waiting.append((request_id, list(prompt_ids), params, arrival_time))
        return request_id

    def abort(self, request_id) -> None:
        self.scheduler.waiting = type(self.scheduler.waiting)(
            r for r in self.scheduler.waiting if r[0] != request_id)

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting)

    def step(self):
        from engine.request import RequestOutput

        now = time.perf_counter()
        batch = list(self.scheduler.waiting)
        self.scheduler.waiting.clear()
        self.counters["steps"] += 1
        self.counters["forwards"] += 1
        self.batch_sizes.append(len(batch))
        return [RequestOutput(request_id=rid, prompt_ids=ids, token_ids=[1] * p.gen_length, nfe=1,
                              arrival_time=arr, admitted_time=now, first_token_time=now, finished_time=now)
                for rid, ids, p, arr in batch]


def serve_stub(port: int) -> None:
    import uvicorn

    from dllm_bench.server.app import ServerState, create_app
    from dllm_bench.server.engine_loop import EngineLoop

    state = ServerState(loop=EngineLoop(StubEngine()), tokenizer=None, model_name="stub", model_root="",
                        max_model_len=1 << 20, block_length=32, eos_token_id=None, max_waiting=1 << 30)
    uvicorn.run(create_app(state), host="127.0.0.1", port=port, log_level="warning")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


async def load(url: str, n: int, concurrency: int, stream: bool) -> float:
    body = {"model": "stub", "prompt": list(range(1, 33)), "max_tokens": 32, "stream": stream}
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        async def one() -> None:
            async with sem:
                if stream:
                    async with client.stream("POST", "/v1/completions", json=body) as r:
                        assert r.status_code == 200
                        async for _ in r.aiter_lines():
                            pass
                else:
                    r = await client.post("/v1/completions", json=body)
                    assert r.status_code == 200
        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1, help="measure both modes N times")
    ap.add_argument("--serve-stub", type=int, metavar="PORT", help=argparse.SUPPRESS)
    bench_result.add_arguments(ap)
    a = ap.parse_args()
    if a.serve_stub:
        serve_stub(a.serve_stub)
        return
    bench_result.check(a)
    if a.repeats < 1 or a.requests < 1 or a.concurrency < 1:
        bench_result.fail("--repeats, --requests and --concurrency must be positive")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cores = os.sched_getaffinity(0)
    proc = subprocess.Popen([sys.executable, __file__, "--serve-stub", str(port)],
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        if a.server_core in cores:
            os.sched_setaffinity(proc.pid, {a.server_core})
        if a.client_core in cores:
            os.sched_setaffinity(0, {a.client_core})
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        asyncio.run(load(url, 200, a.concurrency, False))     # warm-up
        print(f"stub engine, {a.requests} requests, {a.concurrency} in flight, server pinned to core "
              f"{a.server_core}, load generator to core {a.client_core}")
        runs = []
        for _ in range(a.repeats):
            run = {}
            for stream in (False, True):
                cpu0 = cpu_seconds(proc.pid)
                wall = asyncio.run(load(url, a.requests, a.concurrency, stream))
                cpu = cpu_seconds(proc.pid) - cpu0
                run["streamed" if stream else "whole"] = dict(requests=a.requests, wall_s=wall, server_cpu_s=cpu)
                print(f"{'streamed' if stream else 'whole   '}: client {a.requests / wall:7.1f} req/s; server "
                      f"{1000 * cpu / a.requests:.2f} ms CPU/request = {a.requests / cpu:7.1f} req/s per core")
            runs.append(run)
    finally:
        proc.terminate()
        proc.wait(30)
    config = {k: getattr(a, k) for k in ("requests", "concurrency", "server_core", "client_core", "repeats")}
    bench_result.save("bench-server", a, config, {"runs": runs})


if __name__ == "__main__":
    main()
