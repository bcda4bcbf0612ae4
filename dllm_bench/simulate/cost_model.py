"""Per-forward cost model: a forward's work (what the system computes) -> its duration on a
hardware profile under an implementation profile.

Work is described without token values: a forward is one or more `LayerPass`es (a set of layers
that all see the same query segments; dLLM-Cache's partial layers need several) plus the
forward-wide LM-head rows, KV traffic and implementation extras. Each term (GEMMs on the step's
real M with a per-M compute efficiency, attention with no S×S tensor in memory, LM head, KV
traffic, elementwise, host) is a roofline, and the terms add rather than overlap: kernels run
one after another, the pessimistic, eager-execution choice; host time is serial with the device
time (every system here synchronises each step). The formulas: docs/SIMULATE.md ("Cost model").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple


@dataclass(frozen=True)
class ModelShape:
    """The model as the cost model sees it (a dense family: SwiGLU MLP, untied LM head, GQA), with
    what its family adds: q/k/v biases and the prediction `shift` (a Reuse step's rows before its block)."""

    d: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    wbytes: int = 2          # bytes per weight / activation element (bf16 = 2, fp32 = 4)
    qkv_bias: bool = False   # q, k, v projections carry biases (Dream)
    shift: int = 0           # the family's prediction shift (engine.models.ModelConfig.shift)
    family: str = "llada"    # config.json's model_type: which upstream code each baseline runs on it

    @classmethod
    def from_config(cls, cfg, wbytes: int) -> ModelShape:
        """From an engine.models.ModelConfig."""
        return cls(cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.mlp_hidden_size,
                   cfg.padded_vocab, wbytes, cfg.qkv_bias, cfg.shift, cfg.model_type)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        """Query heads x head_dim: d for the whole model, d / N on a tensor-parallel rank."""
        return self.heads * self.head_dim

    def gemms(self) -> tuple[tuple[str, int, int], ...]:
        """(name, K, N) of each per-layer GEMM."""
        return (("qkv", self.d, self.q_dim + 2 * self.kv_dim), ("o", self.q_dim, self.d),
                ("gate_up", self.d, 2 * self.ffn), ("down", self.ffn, self.d))

    def rank_share(self, n: int) -> ModelShape:
        """What one of n tensor-parallel ranks holds and computes (engine.parallel.model): its
        query and KV heads, MLP columns and vocabulary rows; d (the residual stream) whole."""
        if n == 1:
            return self
        for what, size in (("heads", self.heads), ("kv_heads", self.kv_heads), ("ffn", self.ffn),
                           ("vocab", self.vocab)):
            if size % n:
                raise ValueError(f"tensor-parallel size {n} does not divide {what} = {size}")
        return replace(self, heads=self.heads // n, kv_heads=self.kv_heads // n, ffn=self.ffn // n,
                       vocab=self.vocab // n)

    @property
    def bias_params(self) -> int:
        """One layer's q/k/v bias elements (0 without biases)."""
        return (self.q_dim + 2 * self.kv_dim) * self.qkv_bias

    @property
    def block_params(self) -> int:
        return sum(k * n for _, k, n in self.gemms()) + self.bias_params

    @property
    def linear_flops_per_token(self) -> int:
        return 2 * sum(k * n for _, k, n in self.gemms()) * self.layers

    @property
    def lm_head_flops_per_row(self) -> int:
        return 2 * self.d * self.vocab

    @property
    def attn_flops_per_pair(self) -> int:
        """QKᵀ and PV over all heads and layers for one (query, key) pair (bidirectional)."""
        return 4 * self.heads * self.head_dim * self.layers

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_dim * self.wbytes

    @property
    def weights_read_per_forward(self) -> int:
        """Blocks plus LM head (the embedding is a gather)."""
        return (self.block_params * self.layers + self.d * self.vocab) * self.wbytes

    @property
    def n_params(self) -> int:
        return self.block_params * self.layers + 2 * self.d * self.vocab


class Seg(NamedTuple):
    """One request's slice of a layer pass: `q` query tokens attending over `k` keys."""

    q: int
    k: int


class Call(NamedTuple):
    """One padded attention call: `g` members, each `q` query rows over `k` keys (the longest)."""

    g: int
    q: int
    k: int


@dataclass(frozen=True)
class LayerPass:
    """`layers` layers that all process the same segments. `v_only` tokens go through the V
    projection alone (dLLM-Cache's V-verify of the tokens it does not recompute). `calls`: the
    attention calls per layer where they are padded (every member to its call's longest, as
    padded SDPA runs them); None: one call over the segments as they are (a packed kernel)."""

    layers: int
    segs: tuple[Seg, ...]
    v_only: int = 0
    calls: tuple[Call, ...] | None = None

    def attention(self, m: ModelShape) -> list[tuple[float, float]]:
        """(FLOPs, bytes) of each attention call of one layer."""
        if self.calls is None:
            return [(sum(s.q * s.k for s in self.segs) * 4.0 * m.heads * m.head_dim,
                     sum(attention_bytes(s.q, s.k, m.q_dim, m.kv_dim, m.wbytes) for s in self.segs))]
        return [(c.g * c.q * c.k * 4.0 * m.heads * m.head_dim, c.g * attention_bytes(c.q, c.k, m.q_dim, m.kv_dim, m.wbytes))
                for c in self.calls]


def attention_bytes(q: int, k: int, q_dim: int, kv_dim: int, wbytes: int) -> int:
    """What one attention call moves, no score matrix: its queries read and outputs written at the
    query heads' width, its keys and values at the KV heads' (GQA: a KV head serves a query group)."""
    return (2 * q * q_dim + 2 * k * kv_dim) * wbytes


@dataclass(frozen=True)
class Forward:
    """A whole forward (one engine step, or one static-batch forward)."""

    passes: tuple[LayerPass, ...]
    rows: int = 0                 # LM-head rows
    kv_read: int = 0              # cached tokens read (all layers)
    kv_write: int = 0             # tokens written to the cache
    cached_key_layers: int = 0    # (cached key, layer) pairs attended: a pre-RoPE cache re-RoPEs each
    n_seq: int = 1                # sequences in the forward (host loops run over them)
    softmax_rows: int = 0         # rows whose full-vocabulary softmax the decoder computes
    lm_chunk: int = 0             # rows per LM-head call (the logit budget); 0 = one call
    refresh: int = 0              # sequences whose whole canvas is recomputed (Refresh)
    graph: bool = False           # replayed through a CUDA graph (engine.graphs), padded to its bucket
    capture: bool = False         # ... and this replay captures a graph not seen before
    first: bool = False           # a point's first forward (what a one-request warm-up left cold)

    @property
    def query_tokens(self) -> int:
        return max((sum(s.q for s in p.segs) for p in self.passes), default=0)


@dataclass(frozen=True)
class ImplProfile:
    """What an implementation adds on top of the algorithm's GEMMs (counted from the code,
    not fitted). `elem` = elementwise bytes per query token per layer as multiples of (d, ffn)."""

    name: str
    elem_d: float                 # bytes per query token per layer per unit of d
    elem_f: float                 # ... per unit of ffn
    softmax_bytes_per_entry: float  # per (row, vocab entry) of the decoder's softmax
    rope_bytes_per_key_d: float   # per cached key per layer per unit of d (0: cache holds RoPE'd keys)
    kv_copy: float                # times each cached token is moved per read (gather, cat, attend)
    source: str = ""

    def elem_bytes_per_token_layer(self, m: ModelShape) -> float:
        return self.elem_d * m.d + self.elem_f * m.ffn


@dataclass(frozen=True)
class Efficiency:
    """The fitted part of a hardware profile (calibrate writes these)."""

    u_c: float = 1.0              # fraction of peak FLOP/s a GEMM reaches
    u_m: float = 1.0              # fraction of peak bandwidth a memory-bound kernel reaches
    u_attn: float = 1.0           # attention's compute rate relative to a GEMM's
    c_op: float = 0.0             # seconds per GEMM call (launch / dispatch)
    c_attn: float = 0.0           # seconds per attention call
    u_c_by_m: tuple[tuple[int, float], ...] = ()   # (M, u_c) measured per GEMM row count, M ascending

    def u_c_at(self, m: int) -> float:
        """u_c for a GEMM of m rows: the per-M table interpolated in log M (held flat beyond
        its ends), or the scalar u_c without a table."""
        t = self.u_c_by_m
        if not t:
            return self.u_c
        if m <= t[0][0]:
            return t[0][1]
        for (m0, u0), (m1, u1) in zip(t, t[1:]):
            if m <= m1:
                w = math.log(m / m0) / math.log(m1 / m0)
                return u0 + w * (u1 - u0)
        return t[-1][1]

    def scaled(self, u: float) -> Efficiency:
        """Every compute and bandwidth efficiency multiplied by u (one fitted scalar)."""
        return replace(self, u_c=self.u_c * u, u_m=self.u_m * u,
                       u_c_by_m=tuple((m, v * u) for m, v in self.u_c_by_m))


@dataclass(frozen=True)
class HostCost:
    """What a step costs beyond its operators, for one implementation (fitted per machine:
    `calibrate` fits c_step, c_seq, c_row; `simulate --fit` the rest from serve runs)."""

    c_step: float = 0.0
    c_seq: float = 0.0
    c_sl: float = 0.0             # per sequence per layer
    c_row: float = 0.0            # per query row (token) of the forward
    wake_s: float = 0.0           # extra time of a system's work after a long idle gap ...
    wake_tau_s: float = 0.1       # ... approached as 1 - exp(-gap / tau)
    c_add: float = 0.0            # per request handed to the system (add_request), outside its steps
    c_refresh: float = 0.0        # per Refresh canvas (selection, KV store, attention beyond the roofline)
    c_logit: float = 0.0          # per logit row (decoding beyond the LM head's GEMM)
    c_graph: float = 0.0          # a step replayed through a CUDA graph, over an eager one (< 0: cheaper)
    c_capture: float = 0.0        # per CUDA graph captured during a point
    c_start: float = 0.0          # a point's first step, over any other

    def time(self, n_seq: int, layers: int, rows: int = 0) -> float:
        return self.c_step + self.c_seq * n_seq + self.c_sl * n_seq * layers + self.c_row * rows

    def step_time(self, fw: Forward, layers: int) -> float:
        """`time` plus the terms that depend on what kind of step `fw` is; never below 0."""
        t = (self.time(fw.n_seq, layers, fw.query_tokens) + self.c_refresh * fw.refresh + self.c_logit * fw.rows
             + self.c_graph * fw.graph + self.c_capture * fw.capture + self.c_start * fw.first)
        return max(0.0, t)

    def wake(self, gap: float) -> float:
        """What a step costs more after the system idled `gap` seconds: caches and predictors
        refilled after the idle time (measured by `calibrate`; 0 on GPU profiles)."""
        if gap <= 0 or self.wake_s <= 0:
            return 0.0
        return self.wake_s * -math.expm1(-gap / self.wake_tau_s)


@dataclass
class StepCost:
    t: float
    t_device: float
    t_host: float
    flops: float
    bytes: float
    parts: dict = field(default_factory=dict)


def gemm_time(m: int, k: int, n: int, wbytes: int, peak: float, bw: float, eff: Efficiency) -> float:
    if m <= 0:
        return 0.0
    f = 2.0 * m * k * n
    b = (k * n + m * k + m * n) * wbytes
    return max(f / (peak * eff.u_c_at(m)), b / (bw * eff.u_m)) + eff.c_op


def attention_time(flops: float, nbytes: float, peak: float, bw: float, eff: Efficiency) -> float:
    """One attention call (all heads): FlashAttention-style, no score matrix in memory."""
    if flops <= 0:
        return 0.0
    return max(flops / (peak * eff.u_c * eff.u_attn), nbytes / (bw * eff.u_m)) + eff.c_attn


class CostModel:
    """Step durations of one (model, hardware, implementation)."""

    def __init__(self, model: ModelShape, peak_flops: float, bandwidth: float, eff: Efficiency,
                 impl: ImplProfile, host: HostCost):
        self.m, self.peak, self.bw, self.eff, self.impl, self.host = model, peak_flops, bandwidth, eff, impl, host

    def step(self, fw: Forward) -> StepCost:
        m, e, impl = self.m, self.eff, self.impl
        bw = self.bw * e.u_m
        parts = dict(gemm=0.0, attn=0.0, lm_head=0.0, kv=0.0, elem=0.0)
        flops = nbytes = 0.0
        for p in fw.passes:
            M = sum(s.q for s in p.segs)
            for _, k, n in m.gemms():
                parts["gemm"] += p.layers * gemm_time(M, k, n, m.wbytes, self.peak, self.bw, e)
                flops += p.layers * 2.0 * M * k * n
                nbytes += p.layers * (k * n + M * k + M * n) * m.wbytes
            if M and m.bias_params:                # the q/k/v biases: read with the weights, added per row
                bb = p.layers * m.bias_params * m.wbytes
                parts["gemm"] += bb / bw
                flops += p.layers * M * m.bias_params
                nbytes += bb
            if p.v_only:
                parts["gemm"] += p.layers * gemm_time(p.v_only, m.d, m.kv_dim, m.wbytes, self.peak, self.bw, e)
                flops += p.layers * 2.0 * p.v_only * m.d * m.kv_dim
            for af, ab in p.attention(m):
                parts["attn"] += p.layers * attention_time(af, ab, self.peak, self.bw, e)
                flops += af * p.layers
                nbytes += ab * p.layers
            eb = (M + p.v_only) * impl.elem_bytes_per_token_layer(m) * p.layers
            parts["elem"] += eb / bw
            nbytes += eb
        if fw.rows:
            c = fw.lm_chunk or fw.rows
            full, rest = divmod(fw.rows, c)      # every chunk streams the LM head again
            parts["lm_head"] = (full * gemm_time(c, m.d, m.vocab, m.wbytes, self.peak, self.bw, e)
                                + gemm_time(rest, m.d, m.vocab, m.wbytes, self.peak, self.bw, e))
            flops += 2.0 * fw.rows * m.d * m.vocab
            nbytes += (m.d * m.vocab + fw.rows * (m.d + m.vocab)) * m.wbytes
        sb = fw.softmax_rows * m.vocab * impl.softmax_bytes_per_entry
        rb = fw.cached_key_layers * impl.rope_bytes_per_key_d * m.d
        kvb = (impl.kv_copy * fw.kv_read + fw.kv_write) * m.kv_bytes_per_token
        parts["elem"] += (sb + rb) / bw
        parts["kv"] = kvb / bw
        nbytes += sb + rb + kvb
        t_dev = sum(parts.values())
        t_host = self.host.step_time(fw, m.layers)
        parts["host"] = t_host
        return StepCost(t_dev + t_host, t_dev, t_host, flops, nbytes, parts)
