"""One rank's model (its heads, MLP columns, vocabulary rows); hooks `decode_rows`, `head_mean`."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models import DenseBlock, DenseLM, ModelConfig, RotaryEmbedding
from engine.models.dense import _Norm
from engine.parallel.group import TPGroup
from engine.parallel.sharding import RankConfig, vocab_range
from engine.parallel.vocab_decode import VocabParallelDecode


class ShardedBlock(DenseBlock):
    """A block over the rank's heads and MLP columns (its sizes come from the rank's share)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        nn.Module.__init__(self)     # DenseBlock's own __init__ would allocate the full block
        n, d, hd = tp.size, cfg.d_model, cfg.head_dim
        self.tp = tp
        self.n_heads, self.n_kv, self.head_dim, self.eps = cfg.n_heads // n, cfg.kv_heads // n, hd, cfg.rms_norm_eps
        self.attn_norm = _Norm(d)
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=cfg.qkv_bias)
        self.attn_out = nn.Linear(self.n_heads * hd, d, bias=False)
        self.ff_norm = _Norm(d)
        self.ff_proj = nn.Linear(d, cfg.mlp_hidden_size // n, bias=False)
        self.up_proj = nn.Linear(d, cfg.mlp_hidden_size // n, bias=False)
        self.ff_out = nn.Linear(cfg.mlp_hidden_size // n, d, bias=False)
        self._qkv = self._gate_up = self._qkv_bias = None

    def forward(self, x, positions, rope, layer: int, attn):
        q, k, v = self.qkv(x, positions, rope)
        a = attn(layer, q, k, v).reshape(x.shape[0], -1)
        x = x + self.tp.all_reduce(self.attn_out(a))
        return x + self.tp.all_reduce(self.mlp(x))


class _ShardedTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        rows = cfg.padded_vocab // tp.size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(rows, cfg.d_model),
            blocks=nn.ModuleList(ShardedBlock(cfg, tp) for _ in range(cfg.n_layers)),
            ln_f=_Norm(cfg.d_model),
            ff_out=nn.Linear(cfg.d_model, rows, bias=False),
        ))


class ShardedLM(DenseLM):
    """Built on the meta device; `engine.parallel.loader` fills it with the rank's slices."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        nn.Module.__init__(self)     # not DenseLM's: that would build the full model
        self.config = RankConfig.of(cfg, tp.size)
        self.tp = tp
        self.vocab_start, self.vocab_end = vocab_range(cfg, tp.rank, tp.size)
        self.model = _ShardedTransformer(cfg, tp)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.decode_rows = VocabParallelDecode(tp, self.vocab_start, cfg.padded_vocab)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Each rank looks up the ids in its rows (zeros elsewhere); one all-reduce sums them."""
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_end - self.vocab_start)
        h = F.embedding(local.masked_fill(outside, 0), self.model.transformer.wte.weight)
        return self.tp.all_reduce(h.masked_fill_(outside[:, None], 0))

    def head_mean(self, scores: torch.Tensor) -> torch.Tensor:
        """[G, H, g, Lc] scores of this rank's heads -> [G, Lc], the mean over every rank's heads."""
        return self.tp.all_reduce(scores.sum((1, 2))) / (scores.shape[1] * scores.shape[2] * self.tp.size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a tensor-parallel rank holds logit columns only: decode through the engine")
