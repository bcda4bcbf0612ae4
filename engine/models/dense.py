"""The dense Llama-style decoder every dense family shares (RMSNorm, RoPE, GQA with optional q/k/v
biases, SwiGLU) on packed tokens, attention delegated to a callable (`AttentionFn`; docs/ENGINE.md)."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import sdpa
from engine.models.family import ModelConfig

# attn(layer_idx, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, Hq, D]; q and k carry RoPE.
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    y = F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.shape[-1],), eps=eps)
    return weight * y.to(x.dtype)


def _rotate(cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor, positions=None) -> torch.Tensor:
    """x [N, H, D] rotated at the positions its cos/sin rows were gathered at (`positions`: ignored)."""
    xf = x.to(cos.dtype)
    return (xf * cos + xf.roll(x.shape[-1] // 2, dims=-1) * sin).to(x.dtype)


class RotaryEmbedding:
    """Rotate-half RoPE over a cos/sin table grown on demand; `at(positions)`: the rotation for a forward."""

    def __init__(self, head_dim: int, theta: float):
        self.head_dim, self.theta = head_dim, theta
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def reserve(self, n: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos and signed sin tables of n positions or more, grown now (a CUDA graph must not see that)."""
        key = (device, torch.promote_types(dtype, torch.float32))
        if key not in self._cache or self._cache[key][0].shape[0] < n:
            n, dtype = max(n, 4096), key[1]
            inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, device=device, dtype=dtype) / self.head_dim))
            freqs = torch.outer(torch.arange(n, device=device, dtype=dtype), inv)
            self._cache[key] = torch.cat([freqs, freqs], dim=-1).cos(), torch.cat([-freqs.sin(), freqs.sin()], dim=-1)
        return self._cache[key]

    def at(self, positions: torch.Tensor, dtype: torch.dtype, top: int | None = None) -> Callable:
        """The rotation at `positions` for tensors of `dtype`; `top`: a bound on the largest position."""
        cos, sin = self.reserve((int(positions.max()) if top is None else top) + 1, positions.device, dtype)
        return partial(_rotate, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.at(positions, x.dtype)(x)


def dense_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of one sequence over itself (bidirectional, no mask): q [L, Hq, D], k/v [L, Hkv, D]."""
    return sdpa(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)


class DenseBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd, f = cfg.d_model, cfg.head_dim, cfg.mlp_hidden_size
        self.n_heads, self.n_kv, self.head_dim, self.eps = cfg.n_heads, cfg.kv_heads, hd, cfg.rms_norm_eps
        self.attn_norm = nn.RMSNorm(d)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, n * hd, bias=cfg.qkv_bias)
                                                 for n in (cfg.n_heads, self.n_kv, self.n_kv))
        self.attn_out = nn.Linear(cfg.n_heads * hd, d, bias=False)
        self.ff_norm = nn.RMSNorm(d)
        self.ff_proj, self.up_proj = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.ff_out = nn.Linear(f, d, bias=False)
        self._qkv = self._gate_up = self._qkv_bias = None

    def fuse(self) -> None:
        """One GEMM for q/k/v and one for gate/up, each projection's weight (and bias) a view of its rows."""
        with torch.no_grad():
            qkv = (self.q_proj, self.k_proj, self.v_proj)
            self._qkv, self._qkv_bias = _stacked(qkv, "weight"), _stacked(qkv, "bias")
            self._gate_up = _stacked((self.ff_proj, self.up_proj), "weight")

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if self._qkv is not None and self.q_proj.weight.data_ptr() != self._qkv.data_ptr():
            self.fuse()          # the weights moved or were cast: they are no longer views of the fused ones
        return out

    def qkv(self, x: torch.Tensor, positions: torch.Tensor, rope: Callable):
        """Normed input -> RoPE'd q [N, Hq, D], RoPE'd k [N, Hkv, D], v [N, Hkv, D]."""
        n, hd = rms_norm(x, self.attn_norm.weight, self.eps), self.head_dim
        if self._qkv is None:
            q, k, v = self.q_proj(n), self.k_proj(n), self.v_proj(n)
        else:
            rows = [m.out_features for m in (self.q_proj, self.k_proj, self.v_proj)]
            q, k, v = F.linear(n, self._qkv, self._qkv_bias).split(rows, dim=-1)
        q, k = q.reshape(-1, self.n_heads, hd), k.reshape(-1, self.n_kv, hd)
        return rope(q, positions), rope(k, positions), v.reshape(-1, self.n_kv, hd).contiguous()

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        n = rms_norm(x, self.ff_norm.weight, self.eps)
        if self._gate_up is None:
            return self.ff_out(F.silu(self.ff_proj(n)) * self.up_proj(n))
        # in place in the gate half (slices: a split's views refuse in-place ops): the peak is the [N, 2m] output
        out, m = F.linear(n, self._gate_up), self.ff_proj.out_features
        return self.ff_out(F.silu(out[..., :m], inplace=True).mul_(out[..., m:]))

    def forward(self, x, positions, rope, layer: int, attn: AttentionFn):
        q, k, v = self.qkv(x, positions, rope)
        x = x + self.attn_out(attn(layer, q, k, v).reshape(x.shape[0], -1))
        return x + self.mlp(x)


def _stacked(linears: tuple[nn.Linear, ...], name: str) -> torch.Tensor | None:
    """The linears' `name` tensors stacked (None if they have none); each linear's becomes a view of its rows."""
    if getattr(linears[0], name) is None:
        return None
    t = torch.cat([getattr(m, name) for m in linears])
    for m, rows in zip(linears, t.split([m.out_features for m in linears]), strict=True):
        setattr(m, name, nn.Parameter(rows, requires_grad=m.weight.requires_grad))
    return t


class DenseLM(nn.Module):
    """The model on packed tokens; state-dict names: LLaDA's (each family maps its own: Family.hf_name)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = nn.Module()
        self.model.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.padded_vocab, cfg.d_model),
            blocks=nn.ModuleList(DenseBlock(cfg) for _ in range(cfg.n_layers)),
            ln_f=nn.RMSNorm(cfg.d_model), ff_out=nn.Linear(cfg.d_model, cfg.padded_vocab, bias=False)))
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.transformer.blocks

    @property
    def dtype(self) -> torch.dtype:
        return self.model.transformer.wte.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.transformer.wte.weight.device

    def fuse(self) -> None:
        for blk in self.blocks:
            blk.fuse()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.transformer.wte(input_ids)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn,
                      rope: Callable | None = None) -> torch.Tensor:
        """Packed tokens -> final-normed hidden states [N, d] (`rope`: the rotation at `positions`)."""
        h = self.embed(input_ids)
        rope = rope if rope is not None else self.rope.at(positions, h.dtype)
        for i, block in enumerate(self.blocks):
            h = block(h, positions, rope, i, attn)
        return self.final_norm(h)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return rms_norm(h, self.model.transformer.ln_f.weight, self.config.rms_norm_eps)

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.transformer.ff_out(h)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, L] -> logits [B, L, V], row p predicting token p (from the hidden at p - shift, row 0 its own)."""
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        logits = torch.stack([self.lm_head(self.hidden_states(row, pos, dense_attention)) for row in input_ids])
        s = self.config.shift
        return torch.cat([logits[:, :s], logits[:, :-s]], dim=1) if s else logits
