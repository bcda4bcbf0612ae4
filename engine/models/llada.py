"""LLaDA (GSAI-ML/LLaDA-8B-*) with its HF config fields and weight names, on packed tokens with
attention delegated to a callable, so one forward can mix Refresh and Reuse sequences."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import sdpa

# attn(layer_idx, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, Hq, D]; q and k carry RoPE.
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class LLaDAConfig:
    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = 32
    n_layers: int = 32
    mlp_hidden_size: int = 12288
    vocab_size: int = 126464
    embedding_size: int | None = 126464
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    max_sequence_length: int = 4096
    mask_token_id: int = 126336
    eos_token_id: int = 126081
    pad_token_id: int = 126081
    bos_token_id: int | None = None
    weight_tying: bool = False
    include_bias: bool = False
    model_type: str = "llada"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def weights_per_forward(self) -> int:
        """Parameters a forward reads: the blocks' matrices and the LM head."""
        d, kv, f = self.d_model, self._model_kv_heads * self.head_dim, self.mlp_hidden_size
        return self.n_layers * (d * (d + 2 * kv) + d * d + 3 * d * f) + d * self.padded_vocab

    @property
    def _model_kv_heads(self) -> int:
        """The whole model's KV heads (a tensor-parallel rank's `kv_heads` are its share)."""
        return self.n_kv_heads or self.n_heads

    @property
    def kv_per_weight(self) -> float:
        """One token's K and V bytes (every layer) per weight byte a forward reads (engine.cache_mode)."""
        return 2 * self.n_layers * self._model_kv_heads * self.head_dim / self.weights_per_forward

    @property
    def pair_per_row(self) -> float:
        """Attention FLOPs of one (query, key) pair per FLOP of a query row through the weights."""
        return 2 * self.n_layers * self.d_model / self.weights_per_forward

    @property
    def padded_vocab(self) -> int:
        # LLaDA's embedding (and LM head) may be larger than the tokenizer vocab.
        return self.embedding_size or self.vocab_size

    @classmethod
    def from_dict(cls, d: dict) -> LLaDAConfig:
        if d.get("model_type") != "llada":
            raise ValueError(f"config.json has model_type {d.get('model_type')!r}, expected 'llada'")
        known = {f.name for f in fields(cls)}
        cfg = cls(**{k: v for k, v in d.items() if k in known})
        if cfg.weight_tying:
            raise ValueError("weight_tying=true is not supported (LLaDA's LM head is untied)")
        if cfg.include_bias or d.get("include_qkv_bias"):
            raise ValueError("biased LLaDA variants are not supported (LLaDA has no biases)")
        if d.get("alibi") or d.get("rope") is False:
            raise ValueError("only RoPE LLaDA checkpoints are supported")
        if cfg.d_model % cfg.n_heads or cfg.n_heads % cfg.kv_heads:
            raise ValueError("d_model must divide by n_heads and n_heads by n_kv_heads")
        return cfg

    @classmethod
    def from_pretrained(cls, path: str | Path) -> LLaDAConfig:
        p = Path(path) / "config.json"
        if not p.is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p} is not valid JSON: {e}") from None
        return cls.from_dict(d)

    def to_dict(self) -> dict:
        return asdict(self)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # upstream's y * rsqrt(mean(y²) + eps), one fused kernel on CUDA
    y = F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.shape[-1],), eps=eps)
    return weight * y.to(x.dtype)


class RotaryEmbedding:
    """Rotate-half RoPE with a cos/sin table that grows on demand; `at(positions)` gathers the
    rows once for a forward whose every layer rotates at the same positions."""

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


class LLaDABlock(nn.Module):
    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.eps = cfg.n_heads, cfg.kv_heads, hd, cfg.rms_norm_eps
        self.attn_norm = _Norm(d)
        self.q_proj = nn.Linear(d, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_norm = _Norm(d)
        self.ff_proj = nn.Linear(d, cfg.mlp_hidden_size, bias=False)
        self.up_proj = nn.Linear(d, cfg.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(cfg.mlp_hidden_size, d, bias=False)
        self._qkv = self._gate_up = None

    def fuse(self) -> None:
        """One GEMM for q/k/v and one for gate/up: the weights concatenated, each projection's
        weight re-pointed at its rows (same memory and state dict). `_apply` fuses again."""
        with torch.no_grad():
            self._qkv = _fused(self.q_proj, self.k_proj, self.v_proj)
            self._gate_up = _fused(self.ff_proj, self.up_proj)

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
            q, k, v = F.linear(n, self._qkv).split((self.q_proj.out_features, self.k_proj.out_features,
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


def _fused(*linears: nn.Linear) -> torch.Tensor:
    """[sum of out, in]: the linears' weights stacked; each linear's weight becomes a view of it."""
    fused = torch.cat([m.weight for m in linears], dim=0)
    start = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(fused[start : start + rows], requires_grad=m.weight.requires_grad)
        start += rows
    return fused


class _Norm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


class _Transformer(nn.Module):
    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.padded_vocab, cfg.d_model),
                blocks=nn.ModuleList(LLaDABlock(cfg) for _ in range(cfg.n_layers)),
                ln_f=_Norm(cfg.d_model),
                ff_out=nn.Linear(cfg.d_model, cfg.padded_vocab, bias=False),
            )
        )


class LLaDAModelLM(nn.Module):
    """State-dict names are exactly the HF checkpoint's (`model.transformer....`)."""

    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        self.config = cfg
        self.model = _Transformer(cfg)
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
        """Every block's fused q/k/v and gate/up GEMMs (LLaDABlock.fuse): a loaded model's."""
        for blk in self.blocks:
            blk.fuse()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.transformer.wte(input_ids)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn,
                      rope: Rotation | None = None) -> torch.Tensor:
        """Packed tokens -> final-normed hidden states [N, d] (logits are a separate call). `rope`:
        the rotation at `positions` if the caller holds it."""
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
        """Plain HF-style forward of [B, L] equal-length sequences -> logits [B, L, V]."""
        B, L = input_ids.shape
        pos = torch.arange(L, device=input_ids.device)
        outs = [self.lm_head(self.hidden_states(row, pos, dense_attention)) for row in input_ids]
        return torch.stack(outs)


def weight_files(path: Path) -> list[str]:
    """The safetensors files of a checkpoint directory (from its index when sharded), each checked."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index} is not a valid safetensors index: {e}") from None
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")
    for f in files:
        if not (path / f).is_file():
            raise FileNotFoundError(f"shard {f} listed in the index is missing from {path}")
    return files


def load_llada(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> LLaDAModelLM:
    """Load an HF LLaDA checkpoint directory (single file or sharded safetensors)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    cfg = LLaDAConfig.from_pretrained(path)
    files = weight_files(path)
    with torch.device("meta"):
        model = LLaDAModelLM(cfg)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            shard = load_file(str(path / f), device=str(device))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"corrupt safetensors file {path / f}: {e}") from None
        # cast shard by shard: the peak is the cast model plus one shard
        state.update({k: v.to(dtype) for k, v in shard.items()})
        del shard
    expected = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"checkpoint {path} lacks {len(missing)} weights, e.g. {missing[0]}")
    for k, shape in expected.items():
        if tuple(state[k].shape) != tuple(shape):
            raise ValueError(f"weight {k} has shape {tuple(state[k].shape)}, config implies {tuple(shape)}")
    model.load_state_dict({k: state[k] for k in expected}, assign=True)
    model = model.to(device).eval()
    model.fuse()
    return model
