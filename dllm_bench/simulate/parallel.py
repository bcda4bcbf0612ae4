"""A tensor-parallel engine step on N GPUs (engine.parallel): each rank computes its share of
every forward — its heads, MLP columns and vocabulary rows (`ModelShape.rank_share`), so the
GEMMs', attention's and LM head's FLOPs and weight bytes divide by N, the KV traffic too — and
the ranks then meet in collectives on the profile's `link` (PCIe or NVLink):

* two all-reduces per layer (after the attention output and after the MLP), each of the step's
  query tokens x d activations, plus one for the vocabulary-parallel embedding;
* one all-gather per logit chunk of the decode's per-row candidates (5 float64 per row and rank).

A collective costs (N−1)·latency + its bytes on the wire / bandwidth, ring-style: an all-reduce
moves 2(N−1)/N of the message per rank, an all-gather (N−1)/N of the gathered total. Compute
and communication are serial (the all-reduce sits between a layer's two halves); the driver's
per-step plan broadcast (host objects, on the host) is not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

from dllm_bench.simulate.cost_model import CostModel, Forward, StepCost
from dllm_bench.simulate.hardware import Link

DECODE_FLOATS_PER_ROW = 5


def allreduce_time(nbytes: float, n: int, link: Link) -> float:
    if n == 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.latency + 2 * (n - 1) / n * nbytes / link.bandwidth


def allgather_time(total_bytes: float, n: int, link: Link) -> float:
    if n == 1 or total_bytes <= 0:
        return 0.0
    return (n - 1) * link.latency + (n - 1) / n * total_bytes / link.bandwidth


@dataclass
class ParallelCostModel:
    """`rank`: the CostModel of one rank's share of the model (shape.rank_share(n))."""

    rank: CostModel
    n: int
    link: Link

    def comm(self, fw: Forward) -> float:
        m = self.rank.m
        t = 0.0
        for p in fw.passes:
            tokens = sum(s.q for s in p.segs)
            t += 2 * p.layers * allreduce_time(tokens * m.d * m.wbytes, self.n, self.link)
        t += allreduce_time(fw.query_tokens * m.d * m.wbytes, self.n, self.link)           # the embedding
        if fw.rows:
            chunk = fw.lm_chunk or fw.rows
            full, rest = divmod(fw.rows, chunk)
            per_row = DECODE_FLOATS_PER_ROW * 8 * self.n
            t += full * allgather_time(chunk * per_row, self.n, self.link)
            t += allgather_time(rest * per_row, self.n, self.link)
        return t

    def step(self, fw: Forward) -> StepCost:
        c = self.rank.step(fw)
        comm = self.comm(fw)
        return StepCost(c.t + comm, c.t_device + comm, c.t_host, c.flops, c.bytes, {**c.parts, "comm": comm})
