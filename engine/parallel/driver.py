"""`ParallelEngine` (rank 0) and the ranks it runs: processes, group, each step's plan, failures (docs/PARALLEL.md)."""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import os
import signal
import time

import numpy as np
import torch
import torch.distributed as dist

from engine.attention import choose_backend
from engine.config import DTYPES, EngineConfig, resolve_device
from engine.engine import LLMEngine
from engine.kv_cache import KVPool
from engine.logits import RowSegment
from engine.parallel.model import TPGroup, load_sharded
from engine.profiler import MemoryProfile, profile_kv_pool
from engine.runner import ModelRunner, row_segments
from engine.step import StepMeta

JOIN_TIMEOUT = datetime.timedelta(minutes=5)
STEP_TIMEOUT = datetime.timedelta(minutes=30)      # the longest a step's collective waits for a stuck peer
IDLE_TIMEOUT = datetime.timedelta(days=365)


class RankFailure(RuntimeError):
    """A rank of the tensor-parallel group failed or exited: the run cannot continue."""


def init_group(rank: int, size: int, device: str, store=None) -> TPGroup:
    dev = resolve_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=size, store=store,
                            timeout=STEP_TIMEOUT)       # no store: torchrun's environment (env://)
    return TPGroup(rank, size, dev, dist.group.WORLD, dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT))


def serve(tp: TPGroup) -> None:
    while (msg := tp.broadcast()) is not None:
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
        if (world := int(os.environ["WORLD_SIZE"])) != size:
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
        kill = kill or self.busy          # mid-step the workers wait in a collective: they would never read a stop
        if not kill:
            with contextlib.suppress(Exception):
                self.tp.broadcast(None)
        for p in self.procs:
            p.join(timeout=0 if kill else 10)
            p.kill()
            p.join()
        if self.tp is not None:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


class DriverRunner(ModelRunner):
    def prepare(self, batch, pad=None, fwd_staging=None):
        p = super().prepare(batch, pad, fwd_staging)
        segments = [(s.start, s.count, s.temperature, s.gen.get_state(), s.dream)
                    for s in row_segments([r for r, _ in batch], p.plan)]
        self.cluster.send(worker_step, p.padded_meta, p.ids.cpu().numpy(), p.plan.rows.cpu().numpy(), segments,
                          p.plan.entropy, self.pool.storage.shape[2])
        return p


def build_rank(tp: TPGroup, config: EngineConfig, runner=ModelRunner) -> tuple[ModelRunner, MemoryProfile | None]:
    """A rank's runner over its shard (no pool yet) and profile; a bounded pool: the smallest of any rank's."""
    model = load_sharded(config.model, tp, DTYPES[config.dtype])
    backend = choose_backend(config.attention_backend, model.device, model.dtype).name
    profile = None
    if config.kv_pool_tokens is None and (config.memory_budget is not None or model.device.type == "cuda"):
        profile = profile_kv_pool(model, config, backend, config.max_model_len or model.config.max_sequence_length)
        tokens = torch.tensor([profile.kv_pool_tokens], device=tp.device)
        config = dataclasses.replace(config, kv_pool_tokens=int(tp.all_reduce(tokens, dist.ReduceOp.MIN).item()))
    return runner(model, config, backend, None, config.max_model_len), profile


def worker_build(tp: TPGroup, config: EngineConfig) -> None:
    tp.runner, _ = build_rank(tp, config)
    tp.runner.pool = KVPool(tp.runner.config.kv_pool_tokens, tp.runner.model_config, tp.runner.dtype, tp.runner.device)


def worker_step(tp: TPGroup, meta: StepMeta, ids: np.ndarray, rows: np.ndarray, segments: list[tuple],
                entropy: bool, n_slots: int) -> None:
    runner = tp.runner
    if runner.pool.storage.shape[2] != n_slots:
        runner.pool.grow_to(n_slots)            # an unbounded pool grew on the driver
    fwd = runner.staging.begin()
    p = runner.packed(meta, meta, fwd, ids=ids)
    row_index = fwd.put(rows)
    fwd.flush()
    hidden = runner.forward(p)
    segments = [RowSegment(a, n, t, torch.Generator(device=runner.device).set_state(state), dream)
                for a, n, t, state, dream in segments]
    runner.decode_rows(runner.model.lm_head, hidden, row_index, segments, runner.config.max_num_logits,
                       runner.model_config.mask_token_id, entropy=entropy)


class ParallelEngine(LLMEngine):
    """An engine over `config.tensor_parallel_size` ranks (`cluster`: running ranks, else its own)."""

    def __init__(self, config: EngineConfig, cluster: Cluster | None = None, threads: int = 1):
        self.own_cluster = cluster is None
        self.cluster = cluster or Cluster.start(config.tensor_parallel_size, config.device, threads)
        config = dataclasses.replace(config, cuda_graphs=False)
        self.cluster.send(worker_build, config)
        with self.cluster.guard():
            runner, profile = build_rank(self.cluster.tp, config, DriverRunner)
        runner.cluster = self.cluster
        super().__init__(runner.config, runner=runner)
        runner.pool, self.profile = self.pool, profile

    def step(self):
        with self.cluster.guard():
            return super().step()

    def close(self) -> None:
        if self.own_cluster or self.cluster.busy:
            self.cluster.close()
        elif not self.cluster.closed:
            self.cluster.send(setattr, "runner", None)
