"""The ranks of a tensor-parallel engine: their process group, the workers' loop, and their failures."""
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

from engine.engine import resolve_device

JOIN_TIMEOUT = datetime.timedelta(minutes=5)
STEP_TIMEOUT = datetime.timedelta(minutes=30)      # the longest a step's collective waits for a stuck peer
IDLE_TIMEOUT = datetime.timedelta(days=365)
STOP = None


class RankFailure(RuntimeError):
    """A rank of the tensor-parallel group failed or exited: the run cannot continue."""


@dataclass
class TPGroup:
    rank: int
    size: int
    device: torch.device
    group: object          # tensors (NCCL on GPU, gloo on CPU)
    host_group: object     # the driver's messages (gloo)
    runner: object = None  # a worker's share of the engine it serves

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        dist.all_reduce(t, op=op, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor, dim: int | None = None) -> torch.Tensor:
        """[N, *t.shape] in rank order, or every rank's t joined along `dim`."""
        out = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(out, t.contiguous(), group=self.group)
        return torch.stack(out) if dim is None else torch.cat(out, dim)

    def broadcast(self, obj=None):
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.host_group)
        return box[0]


def init_group(rank: int, size: int, device: str, store=None) -> TPGroup:
    dev = resolve_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(dev)
    join = {"init_method": "env://"} if store is None else {"store": store}
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=size,
                            timeout=STEP_TIMEOUT, **join)
    return TPGroup(rank, size, dev, dist.group.WORLD, dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT))


def serve(tp: TPGroup) -> None:
    """A worker rank: run the driver's calls fn(tp, *args) until it says stop."""
    while (msg := tp.broadcast()) is not STOP:
        fn, args = msg
        fn(tp, *args)
    dist.destroy_process_group()


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


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ and "WORLD_SIZE" in os.environ


class Cluster:
    """The driver's side of the ranks: rank 0's group and the workers it spawned (none under torchrun)."""

    def __init__(self, tp: TPGroup | None, procs: list | None = None, store=None):
        self.tp, self.procs, self.store = tp, procs or [], store
        self.closed = self.busy = False
        atexit.register(self.close)

    @classmethod
    def start(cls, size: int, device: str = "cpu", threads: int = 1) -> Cluster:
        """torchrun's rank 0 (its other ranks serve, then exit the process), else a spawned cluster."""
        if not launched_by_torchrun():
            return cls.spawn(size, device, threads)
        world = int(os.environ["WORLD_SIZE"])
        if world != size:
            raise ValueError(f"torchrun started {world} processes but the tensor-parallel size is {size}")
        tp = init_group(int(os.environ["RANK"]), size, device)
        if tp.rank == 0:
            return cls(tp)
        serve(tp)
        raise SystemExit(0)

    @classmethod
    def spawn(cls, size: int, device: str = "cpu", threads: int = 1) -> Cluster:
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=JOIN_TIMEOUT, wait_for_workers=False)
        ctx = torch.multiprocessing.get_context("spawn")
        cluster = cls(None, [ctx.Process(target=_worker_main, args=(r, size, store.port, device, threads),
                                         daemon=True, name=f"tp-rank-{r}") for r in range(1, size)], store)
        for p in cluster.procs:
            p.start()
        deadline = time.monotonic() + JOIN_TIMEOUT.total_seconds()
        while not store.check([f"ready/{r}" for r in range(1, size)]):
            if time.monotonic() > deadline or cluster.dead():
                raise cluster.failure("tensor-parallel workers did not start in time", starting=True)
            time.sleep(0.02)
        if resolve_device(device).type == "cpu":
            torch.set_num_threads(threads)
        cluster.tp = init_group(0, size, device, store)
        return cluster

    def send(self, fn, *args) -> None:
        """fn(tp, *args) on every worker (`fn` importable by name); the driver runs its own share."""
        with self.guard():
            self.tp.broadcast((fn, args))

    @contextlib.contextmanager
    def guard(self):
        """The driver's side of collectives: any error ends the cluster, a rank's as one RankFailure line."""
        self.busy = True
        try:
            yield
        except Exception as e:
            if not isinstance(e, RuntimeError) or isinstance(e, RankFailure) or self.closed:
                self.close(kill=True)
                raise
            deadline = time.monotonic() + 2.0     # gloo and NCCL raise at once: let a dead worker's exit code arrive
            while self.procs and not self.dead() and time.monotonic() < deadline:
                time.sleep(0.02)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise self.failure(f"tensor-parallel step failed: {first}") from None
        # not in a `finally`: interrupted, the cluster stays busy, so closing it kills the workers
        self.busy = False

    def dead(self) -> int | None:
        return next((r for r, p in enumerate(self.procs, 1) if p.exitcode is not None), None)

    def failure(self, otherwise: str, starting: bool = False) -> RankFailure:
        """The cluster ended; why: the first exited worker's recorded error or exit code, else `otherwise`."""
        rank, why = self.dead(), otherwise
        if rank is not None:
            when = "while starting" if starting else "mid-run"
            why = f"tensor-parallel rank {rank} exited {when} (exit code {self.procs[rank - 1].exitcode})"
            with contextlib.suppress(Exception):
                if self.store.check([f"error/{rank}"]):
                    error = self.store.get(f"error/{rank}").decode()
                    why = f"tensor-parallel rank {rank} failed{' while starting' if starting else ''}: {error}"
        self.close(kill=True)
        return RankFailure(why)

    def close(self, kill: bool = False) -> None:
        """Stop the workers (at once when `kill` or mid-step) and leave the group (idempotent; also at exit)."""
        if self.closed:
            return
        self.closed = True
        kill = kill or self.busy          # mid-step the workers wait in a collective: they would never read STOP
        if not kill:
            with contextlib.suppress(Exception):
                self.tp.broadcast(STOP)
        for p in self.procs:
            p.join(timeout=0 if kill else 10)
            p.kill()
            p.join()
        if self.tp is not None:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
