"""A real `dllm-bench server` for tests: the CLI in a subprocess on a free loopback port, with
bounded start-up and shutdown, and its /metrics page parsed."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

from dllm_bench.metrics.page import parse as parse_metrics

REPO = Path(__file__).resolve().parent.parent
MODEL = "tiny"
BLOCK = 8                       # the tiny serve preset's block length
BUDGET_TOKENS = 2048            # --max-num-batched-tokens: room for the long requests below
MEMORY = "256MiB"               # holds a 2048-token step's activations with sampling on
STARTUP_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra: str, model: str = MODEL,
                 knobs: tuple[str, ...] = ("--max-num-batched-tokens", str(BUDGET_TOKENS), "--memory-budget", MEMORY),
                 env: dict[str, str] | None = None):
        """knobs=(): the engine of the model's serve preset, as `serve --model` builds it; env:
        more environment variables for the server."""
        self.log = tempfile.TemporaryFile("w+")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dllm_bench.cli", "server", "--model", model, "--port", str(self.port),
             "--threads", "1", *knobs, *extra],
            env=env, stdout=subprocess.DEVNULL, stderr=self.log, text=True, start_new_session=True)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError("server did not come up")

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(self.url + "/metrics", timeout=30).text)

    def wait_metric(self, name: str, pred, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.metrics()
            if pred(m.get(name)):
                return m
            time.sleep(0.05)
        raise AssertionError(f"{name} never satisfied the condition: {self.metrics()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
