"""The ranks of a tensor-parallel engine as processes, the workers' message loop, and their failures."""
from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.parallel.group import RankFailure, TPGroup, destroy, init_group
from engine.parallel.plan import StepPlan, execute
from engine.parallel.rank import build_rank, worker_runner

JOIN_TIMEOUT = datetime.timedelta(minutes=5)


@dataclass
class Build:
    config: EngineConfig


@dataclass
class Call:
    fn: object        # fn(tp, *args), importable by name
    args: tuple


CLOSE, STOP = "close", "stop"     # drop the engine; end the worker


def serve(tp: TPGroup) -> None:
    """A worker rank: execute the driver's messages until it says stop."""
    runner = None
    while True:
        msg = tp.broadcast()
        if isinstance(msg, StepPlan):
            execute(runner, msg)
        elif isinstance(msg, Build):
            runner = worker_runner(build_rank(tp, msg.config), msg.config)
        elif isinstance(msg, Call):
            dist.gather_object(msg.fn(tp, *msg.args), None, dst=0, group=tp.host_group)
        elif msg == CLOSE:
            runner = None
        elif msg == STOP:
            return


def _worker_main(rank: int, size: int, port: int, device: str, threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=JOIN_TIMEOUT)
    try:
        store.set(f"ready/{rank}", "1")
        serve(init_group(rank, size, device, store))
    except BaseException as e:            # noqa: BLE001 - recorded for the driver, then exit
        with contextlib.suppress(Exception):
            store.set(f"error/{rank}", f"{type(e).__name__}: {e}".splitlines()[0])
        os._exit(1)
    destroy()


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ and "WORLD_SIZE" in os.environ


class Cluster:
    def __init__(self, tp: TPGroup, procs: list | None = None, store=None):
        self.tp, self.procs, self.store = tp, procs or [], store
        self.closed = self.busy = False
        atexit.register(self.close)

    @classmethod
    def start(cls, size: int, device: str = "cpu", threads: int = 1) -> Cluster:
        """The driver of a new cluster: torchrun's when launched by it, else spawned workers."""
        if launched_by_torchrun():
            return cls.from_env(size, device)
        return cls.spawn(size, device, threads)

    @classmethod
    def spawn(cls, size: int, device: str = "cpu", threads: int = 1) -> Cluster:
        """Start ranks 1..size-1 (`threads` torch threads each) and join them as rank 0."""
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=JOIN_TIMEOUT, wait_for_workers=False)
        ctx = torch.multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_worker_main, args=(r, size, store.port, device, threads), daemon=True,
                             name=f"tp-rank-{r}") for r in range(1, size)]
        for p in procs:
            p.start()
        keys = [f"ready/{r}" for r in range(1, size)]
        deadline = time.monotonic() + JOIN_TIMEOUT.total_seconds()
        while not store.check(keys):
            dead = next((r for r, p in enumerate(procs, 1) if not p.is_alive()), None)
            if dead is not None or time.monotonic() > deadline:
                cluster = cls(None, procs, store)
                cluster.close(kill=True)
                raise RankFailure("tensor-parallel workers did not start in time" if dead is None else
                                  cluster.startup_failure(dead))
            time.sleep(0.02)
        if torch.device(device).type == "cpu":
            torch.set_num_threads(threads)
        return cls(init_group(0, size, device, store), procs, store)

    @classmethod
    def from_env(cls, size: int, device: str = "cpu") -> Cluster:
        """torchrun: rank 0 returns the driver; any other rank serves, then exits the process."""
        world = int(os.environ["WORLD_SIZE"])
        if world != size:
            raise ValueError(f"torchrun started {world} processes but the tensor-parallel size is {size}")
        tp = init_group(int(os.environ["RANK"]), size, device)
        if tp.is_driver:
            return cls(tp)
        serve(tp)
        destroy()
        raise SystemExit(0)

    def collective_rpc(self, fn, *args) -> list:
        """fn(tp, *args) on every rank at once; every rank's result in rank order (`fn` importable)."""
        self.send(Call(fn, args))
        with self.guard():
            mine = fn(self.tp, *args)
            out = [None] * self.tp.size
            dist.gather_object(mine, out, dst=0, group=self.tp.host_group)
        return out

    def send(self, msg) -> None:
        with self.guard():
            self.tp.broadcast(msg)

    @contextlib.contextmanager
    def guard(self):
        """The driver's side of collectives: any error ends the cluster, a rank's as one RankFailure line."""
        self.busy = True
        try:
            yield
        except Exception as e:
            if self.closed or isinstance(e, RankFailure):
                raise
            err = self.failure(e)
            self.close(kill=True)
            if err is e:
                raise
            raise err from None
        # not in a `finally`: interrupted, the cluster stays busy, so closing it kills the workers
        self.busy = False

    def failure(self, exc: Exception) -> Exception:
        """What ended the run: the driver's own error, a worker that exited, or the collective's error."""
        if not isinstance(exc, RuntimeError):     # gloo and NCCL raise RuntimeErrors
            return exc
        deadline = time.monotonic() + 2.0
        while self.procs and all(p.exitcode is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.02)
        for r, p in enumerate(self.procs, 1):
            if p.exitcode is None:
                continue
            why = self._error(r)
            return RankFailure(f"tensor-parallel rank {r} failed: {why}" if why else
                               f"tensor-parallel rank {r} exited mid-run (exit code {p.exitcode})")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return RankFailure(f"tensor-parallel step failed: {first}")

    def startup_failure(self, rank: int) -> str:
        why = self._error(rank)
        return (f"tensor-parallel rank {rank} failed while starting: {why}" if why else
                f"tensor-parallel rank {rank} exited while starting (exit code {self.procs[rank - 1].exitcode})")

    def _error(self, rank: int) -> str | None:
        with contextlib.suppress(Exception):
            if self.store is not None and self.store.check([f"error/{rank}"]):
                return self.store.get(f"error/{rank}").decode()
        return None

    def close(self, kill: bool = False) -> None:
        """Stop the workers and leave the group (idempotent; also at exit)."""
        if self.closed:
            return
        self.closed = True
        if not (kill or self.busy):
            with contextlib.suppress(Exception):
                self.tp.broadcast(STOP)
        for p in self.procs:
            p.join(timeout=0 if kill else 10)
            if p.is_alive():
                p.kill()
                p.join()
        if self.tp is not None:
            with contextlib.suppress(Exception):
                destroy()
