"""The tensor-parallel process group (NCCL or gloo) and a gloo host group for the step plans."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Longest a collective of a step may wait for a live but stuck peer.
STEP_TIMEOUT = datetime.timedelta(minutes=30)
IDLE_TIMEOUT = datetime.timedelta(days=365)


class RankFailure(RuntimeError):
    """A rank of the tensor-parallel group failed or exited: the run cannot continue."""


@dataclass
class TPGroup:
    rank: int
    size: int
    device: torch.device
    group: object          # tensors: all-reduce, all-gather (NCCL on GPU, gloo on CPU)
    host_group: object     # host objects: the driver's messages (gloo)

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """In place (no new memory for the meter to count); returns t."""
        dist.all_reduce(t, op=op, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """[N, *t.shape]: every rank's t, in rank order."""
        out = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(out, t.contiguous(), group=self.group)
        return torch.stack(out)

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        return int(self.all_reduce(t, dist.ReduceOp.MIN).item())

    def broadcast(self, obj=None):
        """The driver's `obj` on every rank (workers pass nothing)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.host_group)
        return box[0]


def rank_device(device: str, rank: int) -> torch.device:
    """cpu, or the rank's own GPU (`cuda` / `auto` with CUDA: cuda:<local rank>)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    local = int(os.environ.get("LOCAL_RANK", rank))
    return torch.device("cuda", local % max(1, torch.cuda.device_count()))


def init_group(rank: int, size: int, device: str, store=None) -> TPGroup:
    """Join the group: with `store` (CLI-spawned workers) or from torchrun's environment."""
    dev = rank_device(device, rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    kw = dict(backend=backend, rank=rank, world_size=size, timeout=STEP_TIMEOUT)
    if store is not None:
        kw["store"] = store
    else:
        kw["init_method"] = "env://"
    dist.init_process_group(**kw)
    host = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return TPGroup(rank, size, dev, dist.group.WORLD, host)


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
