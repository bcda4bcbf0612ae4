"""A rank's model: its collectives, its slices of the weights read shard-wise, its vocabulary-parallel decode."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from engine.logits import RowSegment, by_rule, decode_rows
from engine.models import DenseLM, ModelConfig, load_model
from engine.unmask import gumbel_noise, gumbel_scores, proposal_argmax

KEY, TOKEN, LOGIT, MAX, SUM, ENT = range(6)       # the columns of a rank's proposal per row
_BLOCK_AXIS = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "attn_out": 1, "ff_proj": 0, "up_proj": 0, "ff_out": 1}


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


@dataclass
class RankConfig(ModelConfig):
    """The checkpoint's config as one rank sees it: global fields unchanged, `kv_heads` the rank's."""
    tp_size: int = 1

    @property
    def kv_heads(self) -> int:
        return (self.n_kv_heads or self.n_heads) // self.tp_size

    @classmethod
    def of(cls, cfg: ModelConfig, tp_size: int) -> RankConfig:
        sizes = {"n_heads": cfg.n_heads, "n_kv_heads": cfg.kv_heads, "mlp_hidden_size": cfg.mlp_hidden_size,
                 "the vocabulary (embedding_size)": cfg.padded_vocab}
        for what, size in sizes.items():
            if size % tp_size:
                raise ValueError(f"tensor-parallel size {tp_size} does not divide {what} = {size}")
        return cls(**asdict(cfg), tp_size=tp_size)


class _ShardShape(RankConfig):
    @property
    def head_dim(self) -> int:
        return self.d_model // (self.n_heads * self.tp_size)


def slice_of(name: str, shape: tuple[int, ...], rank: int, size: int) -> tuple[slice, ...]:
    """The rank's part of weight `name` of full `shape` ([out, in] for linears; norms whole, docs/PARALLEL.md)."""
    module = name.split(".")[-2]
    axis = _BLOCK_AXIS.get(module) if ".blocks." in name else 0 if module in ("wte", "ff_out") else None
    n = 0 if axis is None else shape[axis] // size
    return tuple(slice(rank * n, (rank + 1) * n) if i == axis else slice(None) for i in range(len(shape)))


class ShardedLM(DenseLM):
    """A `DenseLM` over the rank's heads, MLP columns and vocabulary rows (its `config`: a `RankConfig`)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        config, n = RankConfig.of(cfg, tp.size), tp.size
        super().__init__(_ShardShape(**{**asdict(config), "n_heads": cfg.n_heads // n, "n_kv_heads": cfg.kv_heads,
                                        "mlp_hidden_size": cfg.mlp_hidden_size // n,
                                        "embedding_size": cfg.padded_vocab // n}))
        self.config, self.tp, self.vocab_start = config, tp, tp.rank * cfg.padded_vocab // n
        self.decode_rows = partial(decode_rows, chunk=self.decode_chunk)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attn, rope) -> torch.Tensor:
        h = self.embed(input_ids)
        for i, blk in enumerate(self.blocks):
            q, k, v = blk.qkv(h, positions, rope)
            h = h + self.tp.all_reduce(blk.attn_out(attn(i, q, k, v).reshape(h.shape[0], -1)))
            h = h + self.tp.all_reduce(blk.mlp(h))
        return self.final_norm(h)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        wte = self.model.transformer.wte.weight
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= wte.shape[0])
        return self.tp.all_reduce(F.embedding(local.masked_fill(outside, 0), wte).masked_fill_(outside[:, None], 0))

    def head_mean(self, scores: torch.Tensor) -> torch.Tensor:
        """[G, H, g, Lc] scores of this rank's heads -> [G, Lc], the mean over every rank's heads."""
        return self.tp.all_reduce(scores.sum((1, 2))) / (scores.shape[1] * scores.shape[2] * self.tp.size)

    def decode_chunk(self, logits: torch.Tensor, c0: int, segments: list[RowSegment], mask_id: int, entropy: bool):
        def plain(part: torch.Tensor, at: int):
            ranks = self.tp.all_gather(self.proposal(part, at, segments, mask_id, entropy))   # [N, rows, KEY..]
            dt = torch.promote_types(part.dtype, torch.float32)
            winner = ranks[..., KEY].argmax(0)                        # ties: the first (lowest) rank
            best = ranks.gather(0, winner[None, :, None].expand(1, *ranks.shape[1:]))[0]
            x0, l_x0 = best[:, TOKEN].long(), best[:, LOGIT].to(dt)
            m, s = ranks[..., MAX].to(dt), ranks[..., SUM].to(dt)
            conf = (s * (m - l_x0).exp()).sum(0).reciprocal()
            if not entropy:
                return x0, conf, None
            top = m.amax(0)
            w = (m - top).exp()
            total = (w * s).sum(0)
            return x0, conf, total.log() - (w * (ranks[..., ENT].to(dt) + (m - top) * s)).sum(0) / total

        return by_rule(logits, c0, segments, mask_id, entropy, plain, partial(self.tp.all_gather, dim=1))

    def proposal(self, logits: torch.Tensor, c0: int, segments: list[RowSegment], mask_id: int, entropy: bool):
        """[rows, 5 or 6] float64: this rank's candidate and log-sum-exp parts per row (columns KEY..ENT)."""
        n, width = logits.shape
        start = self.vocab_start
        mask_col = mask_id - start if start <= mask_id < start + width else None
        col = logits.argmax(-1) if mask_col is None else proposal_argmax(logits, mask_col)
        key = logits.gather(1, col[:, None])[:, 0].to(torch.float64)
        for seg in segments:
            a, b = max(seg.start, c0), min(seg.start + seg.count, c0 + n)
            if seg.temperature == 0 or a >= b:
                continue
            noise = gumbel_noise((b - a, self.config.padded_vocab), seg.temperature, seg.gen, logits.device)
            scores = gumbel_scores(logits[a - c0 : b - c0], noise[:, start : start + width])
            c = scores.argmax(-1) if mask_col is None else proposal_argmax(scores, mask_col)
            col[a - c0 : b - c0] = c
            key[a - c0 : b - c0] = scores.gather(1, c[:, None])[:, 0]
        dt = torch.promote_types(logits.dtype, torch.float32)
        m = logits.amax(-1, keepdim=True)
        cols = [key, (col + start).to(torch.float64), logits.gather(1, col[:, None])[:, 0].double(), m[:, 0].double()]
        shifted = logits.sub_(m)
        e = shifted.exp() if entropy else shifted.exp_()
        cols.append(e.sum(-1, dtype=dt).double())
        if entropy:
            cols.append((e * shifted).sum(-1, dtype=dt).double())
        return torch.stack(cols, dim=1)


def load_sharded(path: str | Path, tp: TPGroup, dtype: torch.dtype) -> ShardedLM:
    return load_model(path, dtype, tp.device, partial(ShardedLM, tp=tp), partial(slice_of, rank=tp.rank, size=tp.size))
