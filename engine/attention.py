"""Bidirectional attention: the one SDPA + GQA helper (`sdpa`) every model path calls, the
padded batch form the engine's step uses on CPU (`padded_attention`: one SDPA call for a whole
phase group, padding keys masked out), and flash-attn varlen on CUDA (`flash_varlen`).

Why padded SDPA on CPU (measured in docs/PERFORMANCE.md): flex_attention without
torch.compile materializes the score matrix and ran 5-10x slower; a per-sequence loop costs
host work per request; padding waste is small when a group's lengths are alike, and the
runner splits a group into chunks so no padded call exceeds a key budget.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)
FLASH_DTYPES = (torch.float16, torch.bfloat16)


def flash_attn_import_error() -> str | None:
    """None when `flash_attn_varlen_func` imports, else why not. A wheel built for another torch
    is found by the import system and fails only when imported, so the import itself is the test."""
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401  (optional, CUDA builds)
    except Exception as e:  # ImportError, or an undefined symbol of a mismatched build (OSError)
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def flash_attn_available() -> bool:
    return flash_attn_import_error() is None


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """auto: flash-attn varlen on CUDA when it imports and the dtype is fp16/bf16, else SDPA
    (on CUDA with one log line saying why). flash_attn asked for by name must be usable: it needs
    a half dtype and an importable package (on a CPU only the test suite's stand-in imports)."""
    if name == "sdpa":
        return name
    err = flash_attn_import_error()
    half = dtype is None or dtype in FLASH_DTYPES
    if name == "auto":
        if device.type != "cuda":
            return "sdpa"
        why = err if err is not None else (None if half else f"it supports only fp16/bf16, the model is {dtype}")
        if why is None:
            return "flash_attn"
        log.warning("attention: SDPA, not flash-attn (%s)", why)
        return "sdpa"
    if err is not None:
        raise ValueError(f"attention backend flash_attn needs the flash-attn package (pip install '.[gpu]'): {err}")
    if not half:
        raise ValueError(f"attention backend flash_attn supports only float16/bfloat16, not {dtype}")
    if device.type != "cuda" and not _runs_on_cpu():
        raise ValueError("attention backend flash_attn needs CUDA")
    return name


def _runs_on_cpu() -> bool:
    # flash-attn kernels are CUDA-only; an implementation of its contract that declares it runs
    # on the CPU (the test suite's stand-in) lets the engine's flash path run here.
    import flash_attn

    return bool(getattr(flash_attn, "RUNS_ON_CPU", False))


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ/√D) v, no causal mask: q [..., Hq, Lq, D], k/v [..., Hkv, Lk, D]; query head
    h uses KV head h // (Hq / Hkv) (GQA). mask: bool, True = attend, broadcast to the scores."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[-3] != k.shape[-3])


def key_bias(key_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """key_mask [G, Lk] (True = a real key) -> the additive mask [G, 1, 1, Lk] (0 / -inf) SDPA
    takes as is: built once per step, it saves every layer the bool-to-bias conversion."""
    bias = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device).masked_fill_(~key_mask, -torch.inf)
    return bias[:, None, None, :]


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """q [G, Lq, Hq, D], k/v [G, Lk, Hkv, D], bias [G, 1, 1, Lk] from `key_bias` (None: every
    key is real) -> [G, Lq, Hq, D]."""
    # A contiguous [G, H, Lq, D] query is several times faster in CPU SDPA than a strided view.
    return sdpa(q.transpose(1, 2).contiguous(), k.transpose(1, 2), v.transpose(1, 2), bias).transpose(1, 2)


def varlen_attention(q: torch.Tensor, cu_q: list[int], keys: list[torch.Tensor], values: list[torch.Tensor],
                     backend: str = "sdpa") -> torch.Tensor:
    """q [Nq, Hq, D] packed; segment i is q[cu_q[i]:cu_q[i+1]] and attends over keys[i] /
    values[i] ([Hkv, Lk_i, D]). Returns [Nq, Hq, D]. A convenience over lists (benchmarks and
    tests); the engine's step builds its padded or packed keys from the pool directly."""
    lk = [t.shape[1] for t in keys]
    if backend == "flash_attn":
        kp = torch.cat([t.transpose(0, 1) for t in keys])
        vp = torch.cat([t.transpose(0, 1) for t in values])
        return flash_varlen(q, cu_q, kp, vp, [0, *torch.tensor(lk).cumsum(0).tolist()])
    lq = [cu_q[i + 1] - cu_q[i] for i in range(len(keys))]
    G, Lq, Lk = len(keys), max(lq), max(lk)
    qp = q.new_zeros(G, Lq, *q.shape[1:])
    kp = q.new_zeros(G, Lk, keys[0].shape[0], q.shape[-1])
    vp = torch.zeros_like(kp)
    mask = torch.zeros(G, Lk, dtype=torch.bool, device=q.device)
    for i in range(G):
        qp[i, : lq[i]] = q[cu_q[i] : cu_q[i + 1]]
        kp[i, : lk[i]] = keys[i].transpose(0, 1)
        vp[i, : lk[i]] = values[i].transpose(0, 1)
        mask[i, : lk[i]] = True
    o = padded_attention(qp, kp, vp, key_bias(mask, q.dtype))
    return torch.cat([o[i, : lq[i]] for i in range(G)])


def flash_varlen(q: torch.Tensor, cu_q, k: torch.Tensor, v: torch.Tensor, cu_k, max_q: int | None = None,
                 max_k: int | None = None) -> torch.Tensor:
    """flash_attn_varlen_func over packed q [Nq, Hq, D] and k/v [Nk, Hkv, D]. cu_q/cu_k: int32
    tensors on q's device with max_q/max_k given (the engine's step: no host work), or lists."""
    from flash_attn import flash_attn_varlen_func  # optional dependency, CUDA only

    if not torch.is_tensor(cu_q):
        max_q = max(b - a for a, b in zip(cu_q, cu_q[1:]))
        max_k = max(b - a for a, b in zip(cu_k, cu_k[1:]))
        cu_q = torch.tensor(cu_q, dtype=torch.int32, device=q.device)
        cu_k = torch.tensor(cu_k, dtype=torch.int32, device=q.device)
    return flash_attn_varlen_func(q.contiguous(), k.contiguous(), v.contiguous(), cu_q, cu_k, int(max_q), int(max_k),
                                  causal=False)
