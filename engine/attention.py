"""Bidirectional attention: SDPA with GQA, packed varlen kernels (`PackedKernel`), keys in pieces
merged by log-sum-exp, and which backend a device runs (`choose_backend`; docs/ENGINE.md)."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

HALF_DTYPES = (torch.float16, torch.bfloat16)
PACKED = ("varlen", "flash_attn")          # the backends that take packed keys and cu_seqlens
LABELS = {"sdpa": "padded SDPA", "varlen": "torch varlen_attn", "flash_attn": "flash-attn varlen"}


def torch_varlen() -> tuple[Callable, bool] | None:
    """torch's varlen_attn (torch >= 2.10) and whether it takes enable_gqa (>= 2.12); None if absent."""
    try:
        from torch.nn.attention.varlen import varlen_attn
        params = inspect.signature(varlen_attn).parameters
    except (ImportError, TypeError, ValueError):
        return None
    fits = {"cu_seq_q", "cu_seq_k", "max_q", "max_k"} <= params.keys()
    return (varlen_attn, "enable_gqa" in params) if fits else None


def flash_attn_import_error() -> str | None:
    """None when `flash_attn_varlen_func` imports, else why not (a mismatched wheel fails only here)."""
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception as e:  # ImportError, or an undefined symbol of a mismatched build (OSError)
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def _kernel(name: str) -> tuple[str, bool] | None:
    """(what it is, whether it runs on a CPU) of packed backend `name` if this install has it."""
    if name == "varlen":
        api = torch_varlen()
        if api is None:
            return None
        gqa = "" if api[1] else "; GQA by repeated K/V heads"
        return f"torch {torch.__version__}'s FlashAttention varlen kernels{gqa}", getattr(api[0], "RUNS_ON_CPU", False)
    if flash_attn_import_error() is not None:
        return None
    import flash_attn
    return f"flash-attn {getattr(flash_attn, '__version__', '?')}", getattr(flash_attn, "RUNS_ON_CPU", False)


@dataclass(frozen=True)
class BackendChoice:
    name: str
    why: str

    @property
    def line(self) -> str:
        return f"attention: {LABELS[self.name]} ({self.why})"


def choose_backend(name: str, device, dtype: torch.dtype | None = None) -> BackendChoice:
    """Backend `name` and why (auto: on CUDA in fp16/bf16 varlen_attn, else flash-attn, else SDPA); ValueError."""
    device, half = torch.device(device), dtype is None or dtype in HALF_DTYPES
    if name == "sdpa":
        return BackendChoice("sdpa", "attention_backend=sdpa")
    if name in PACKED:
        found = _kernel(name)
        if found is None:
            need = (f"the flash-attn package (pip install '.[gpu]'): {flash_attn_import_error()}" if name != "varlen"
                    else f"torch >= 2.10 (torch.nn.attention.varlen.varlen_attn); this is torch {torch.__version__}")
            raise ValueError(f"attention backend {name} needs {need}")
        if not half:
            raise ValueError(f"attention backend {name} supports only float16/bfloat16, not {dtype}")
        if device.type != "cuda" and not found[1]:
            raise ValueError(f"attention backend {name} needs CUDA")
        return BackendChoice(name, f"attention_backend={name}: {found[0]}")
    if name != "auto":
        raise ValueError(f"unknown attention backend {name!r}")
    if device.type != "cuda":
        return BackendChoice("sdpa", f"on {device.type}: the varlen kernels are CUDA-only")
    if not half:
        return BackendChoice("sdpa", f"the model is {str(dtype).removeprefix('torch.')}; varlen kernels take fp16/bf16")
    try:
        cap = tuple(torch.cuda.get_device_capability(device)) if torch.cuda.is_available() else (8, 0)
    except Exception:  # a faked CUDA (tests) has no device to ask
        cap = (8, 0)
    if cap < (8, 0):
        return BackendChoice("sdpa", f"sm_{cap[0]}{cap[1]}: FlashAttention varlen kernels need sm_80 or newer")
    no_torch = f"torch {torch.__version__} has no varlen_attn (torch >= 2.10)"
    for packed in PACKED:
        found = _kernel(packed)
        if found is not None:
            return BackendChoice(packed, found[0] if packed == "varlen" else f"{found[0]}; {no_torch}")
    return BackendChoice("sdpa", f"{no_torch} and flash-attn does not import: {flash_attn_import_error()}")


class PackedKernel:
    """One varlen call over packed q [Nq, Hq, D], k/v [Nk, Hkv, D]: segment b's rows cu_q[b]:cu_q[b+1] (keys: cu_k)."""

    def __init__(self, backend: str):
        self.backend = backend
        if backend == "varlen":
            self._fn, self._gqa = torch_varlen()
        else:
            from flash_attn import flash_attn_varlen_func
            self._fn, self._gqa = flash_attn_varlen_func, True

    def reads_in_place(self, hq: int, hkv: int) -> bool:
        """Whether k/v can be a pool layer as it is (not so where GQA needs repeated heads)."""
        return hq == hkv or self._gqa

    def __call__(self, q, k, v, cu_q, cu_k, max_q: int, max_k: int) -> torch.Tensor:
        if self.backend == "flash_attn":
            return self._fn(q, k, v, cu_q, cu_k, max_q, max_k, causal=False)
        g = q.shape[1] // k.shape[1]
        if g > 1 and not self._gqa:
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        return self._fn(q, k, v, cu_q, cu_k, max_q, max_k, **({"enable_gqa": True} if g > 1 and self._gqa else {}))


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ/√D) v, not causal: q [..., Hq, Lq, D], k/v [..., Hkv, Lk, D]; mask: bool (True: attend) or a bias"""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[-3] != k.shape[-3])


def key_bias(key_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """key_mask [G, Lk] (True = a real key) -> the additive mask [G, 1, 1, Lk], built once per step."""
    bias = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device).masked_fill_(~key_mask, -torch.inf)
    return bias[:, None, None, :]


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """q [G, Lq, Hq, D], k/v [G, Lk, Hkv, D], bias from `key_bias` (None: all real) -> [G, Lq, Hq, D]."""
    qt = q.transpose(1, 2) if q.is_cuda else q.transpose(1, 2).contiguous()   # several times faster in CPU SDPA
    return sdpa(qt, k.transpose(1, 2), v.transpose(1, 2), bias).transpose(1, 2)


def key_piece(key_chunk: int, q_rows: int, hq: int, hkv: int, d: int, dtype: torch.dtype) -> int:
    """Keys per piece of `attention_over_key_chunks` taking no more than `key_chunk` gathered K/V rows do."""
    es, acc = dtype.itemsize, 4 if dtype in HALF_DTYPES else dtype.itemsize
    row = 2 * hkv * d * es
    return max(1, key_chunk * row // (row + (2 * hkv * d * acc if acc != es else 0) + hq * q_rows * acc))


def attention_over_key_chunks(q: torch.Tensor, pieces) -> torch.Tensor:
    """q [Lq, Hq, D] over pieces of (k, v) [Hkv, Lk_i, D] merged by log-sum-exp, one piece at a time (docs/MEMORY.md)"""
    Lq, Hq, D = q.shape
    acc = torch.float32 if q.dtype in HALF_DTYPES else q.dtype
    out = m = den = None
    for k, v in pieces:
        hkv = k.shape[0]                                   # query head h reads KV head h // (Hq / hkv)
        qg = q.to(acc).permute(1, 0, 2).reshape(hkv, Hq // hkv * Lq, D)
        s = torch.matmul(qg, k.to(acc).transpose(1, 2)).mul_(D ** -0.5)     # [Hkv, g*Lq, Lk_i]
        mi = s.amax(-1, keepdim=True)
        p = s.sub_(mi).exp_()
        oi, di = torch.matmul(p, v.to(acc)), p.sum(-1, keepdim=True)
        del s, p, k, v                                     # before the next piece is gathered
        if out is None:
            out, m, den = oi, mi, di
            continue
        mn = torch.maximum(m, mi)
        a, b = (m - mn).exp_(), (mi - mn).exp_()
        out, den, m = out.mul_(a).add_(oi.mul_(b)), den.mul_(a).add_(di.mul_(b)), mn
    return out.div_(den).reshape(Hq, Lq, D).transpose(0, 1).to(q.dtype)
