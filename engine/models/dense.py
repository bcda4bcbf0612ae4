"""The dense Llama-style decoder every dense family shares (RMSNorm, RoPE, GQA with optional q/k/v
biases, SwiGLU) on packed tokens, attention delegated to a callable (`AttentionFn`)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import sdpa

if TYPE_CHECKING:
    from engine.models.family import ModelConfig

# attn(layer_idx, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, Hq, D]; q and k carry RoPE.
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # upstream's y * rsqrt(mean(y²) + eps), one fused kernel on CUDA
    y = F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.shape[-1],), eps=eps)
    return weight * y.to(x.dtype)


class RotaryEmbedding:
    """Rotate-half RoPE, its cos/sin table grown on demand; `at(positions)`: the rows for a forward."""

    def __init__(self, head_dim: int, theta: float):
        self.head_dim, self.theta = head_dim, theta
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _table(self, n: int, device: torch.device, dtype: torch.dtype):
        key = (device, dtype)
        if key not in self._cache or self._cache[key][0].shape[0] < n:
            n = max(n, 4096)
            inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, device=device, dtype=dtype) / self.head_dim))
            freqs = torch.outer(torch.arange(n, device=device, dtype=dtype), inv)
            emb = torch.cat([freqs, freqs], dim=-1)
            # sin with the rotation's sign folded in (-sin, sin): `Rotation` then needs no negation
            self._cache[key] = (emb.cos(), torch.cat([-freqs.sin(), freqs.sin()], dim=-1))
        return self._cache[key]

    def reserve(self, n: int, device: torch.device, dtype: torch.dtype) -> None:
        """Grow the table to n positions now (a CUDA graph must not see it reallocated)."""
        self._table(n, device, torch.promote_types(dtype, torch.float32))

    def at(self, positions: torch.Tensor, dtype: torch.dtype, top: int | None = None) -> Rotation:
        """The rotation at `positions` for tensors of `dtype`; `top`: a bound on the largest position."""
        dt = torch.promote_types(dtype, torch.float32)
        cos, sin = self._table((int(positions.max()) if top is None else top) + 1, positions.device, dt)
        return Rotation(cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [N, H, D], positions [N] -> x rotated, in x's dtype."""
        return self.at(positions, x.dtype)(x)


class Rotation:
    """cos/sin rows gathered for one positions tensor; applies to x [N, H, D] at those positions."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.cos, self.sin = cos, sin

    def __call__(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        # rotate-half as the halves swapped times the signed sin: one roll, the same products
        xf = x.to(self.cos.dtype)
        return (xf * self.cos + xf.roll(x.shape[-1] // 2, dims=-1) * self.sin).to(x.dtype)


def dense_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of one sequence over itself (bidirectional, no mask): q [L, Hq, D], k/v [L, Hkv, D]."""
    return sdpa(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)


class DenseBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.eps = cfg.n_heads, cfg.kv_heads, hd, cfg.rms_norm_eps
        self.attn_norm = _Norm(d)
        self.q_proj = nn.Linear(d, cfg.n_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=cfg.qkv_bias)
        self.attn_out = nn.Linear(cfg.n_heads * hd, d, bias=False)
        self.ff_norm = _Norm(d)
        self.ff_proj = nn.Linear(d, cfg.mlp_hidden_size, bias=False)
        self.up_proj = nn.Linear(d, cfg.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(cfg.mlp_hidden_size, d, bias=False)
        self._qkv = self._gate_up = self._qkv_bias = None

    def fuse(self) -> None:
        """One GEMM for q/k/v and one for gate/up, each projection's weight a view of its rows."""
        with torch.no_grad():
            self._qkv, self._qkv_bias = _fused(self.q_proj, self.k_proj, self.v_proj)
            self._gate_up, _ = _fused(self.ff_proj, self.up_proj)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        groups = ((self._qkv, (self.q_proj, self.k_proj, self.v_proj)), (self._gate_up, (self.ff_proj, self.up_proj)))
        if self._qkv is not None and not all(m.weight.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                                             for t, ms in groups for m in ms):
            self.fuse()          # the weights moved or were cast: they are no longer views of the fused ones
        return out

    def qkv(self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding):
        """Normed input -> RoPE'd q [N, Hq, D], RoPE'd k [N, Hkv, D], v [N, Hkv, D]."""
        n = rms_norm(x, self.attn_norm.weight, self.eps)
        if self._qkv is None:
            q, k, v = self.q_proj(n), self.k_proj(n), self.v_proj(n)
        else:
            q, k, v = F.linear(n, self._qkv, self._qkv_bias).split((self.q_proj.out_features, self.k_proj.out_features,
                                                     self.v_proj.out_features), dim=-1)
        q = q.reshape(-1, self.n_heads, self.head_dim)
        k = k.reshape(-1, self.n_kv, self.head_dim)
        return rope(q, positions), rope(k, positions), v.reshape(-1, self.n_kv, self.head_dim).contiguous()

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        n = rms_norm(x, self.ff_norm.weight, self.eps)
        if self._gate_up is None:
            return self.ff_out(F.silu(self.ff_proj(n)) * self.up_proj(n))
        # in place in the gate half: the MLP's peak is the [N, 2m] output alone
        out, m = F.linear(n, self._gate_up), self.ff_proj.out_features
        gate, up = out[..., :m], out[..., m:]    # slices, not chunk(): a split's views refuse in-place ops
        return self.ff_out(F.silu(gate, inplace=True).mul_(up))

    def forward(self, x, positions, rope, layer: int, attn: AttentionFn):
        q, k, v = self.qkv(x, positions, rope)
        a = attn(layer, q, k, v).reshape(x.shape[0], -1)
        x = x + self.attn_out(a)
        return x + self.mlp(x)


def _fused(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linears' weights (and biases, if any) stacked; each linear's become views of them."""
    fused = [torch.cat([getattr(m, name) for m in linears], dim=0)
             if getattr(linears[0], name) is not None else None for name in ("weight", "bias")]
    start = 0
    for m in linears:
        rows = m.weight.shape[0]
        for name, t in zip(("weight", "bias"), fused, strict=True):
            if t is not None:
                setattr(m, name, nn.Parameter(t[start : start + rows], requires_grad=m.weight.requires_grad))
        start += rows
    return fused[0], fused[1]


class _Norm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


class DenseLM(nn.Module):
    """The model on packed tokens; state-dict names: LLaDA's (each family maps its own: Family.hf_name)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = nn.Module()
        self.model.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.padded_vocab, cfg.d_model),
            blocks=nn.ModuleList(DenseBlock(cfg) for _ in range(cfg.n_layers)),
            ln_f=_Norm(cfg.d_model), ff_out=nn.Linear(cfg.d_model, cfg.padded_vocab, bias=False)))
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
        """Every block's fused q/k/v and gate/up GEMMs (DenseBlock.fuse): a loaded model's."""
        for blk in self.blocks:
            blk.fuse()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.transformer.wte(input_ids)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn,
                      rope: Rotation | None = None) -> torch.Tensor:
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
        """[B, L] equal-length sequences -> logits [B, L, V], row p the prediction for token p (the
        family's shift applied: row p from the hidden at p - shift, row 0 from its own)."""
        B, L = input_ids.shape
        pos = torch.arange(L, device=input_ids.device)
        logits = torch.stack([self.lm_head(self.hidden_states(row, pos, dense_attention)) for row in input_ids])
        s = self.config.shift
        return torch.cat([logits[:, :s], logits[:, : L - s]], dim=1) if s else logits
