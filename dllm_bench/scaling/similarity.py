"""Scale similarity: the dimensionless ratios that decide which serving system wins, computed
from a model shape, a request shape and a machine (`dllm-bench models similarity`).

A CPU scale model answers the paper's question for LLaDA-8B on a GPU only where it keeps these
ratios, as a wind-tunnel model keeps the Reynolds number: LM head vs body, logit row vs KV
token, prompt / block, attention share, the baselines' largest static batch and the engine's
concurrency, dLLM-Cache's step share, and the Reuse forward's arithmetic intensity against the
machine's ridge point. Everything is computed from the config fields (`Preset`), nothing is typed
in; the machines' peaks are public measured matmul/bandwidth figures (datasheet where no
measurement exists). Each ratio's formula and what it decides: docs/SCALING.md.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from baselines.registry import SYSTEMS, RefreshPeak
from dllm_bench.checkpoints.presets import PRESETS as MODELS
from dllm_bench.checkpoints.presets import Preset
from dllm_bench.serve.presets import PAPER_BASELINE_KNOBS
from dllm_bench.serve.presets import PRESETS as SERVE
from dllm_bench.units import parse_size
from engine.config import GPU_MEMORY_UTILIZATION
from engine.kv_cache import kv_need
from workloads.datasets import PRESETS as LENGTHS
from workloads.serving import gen_length_for

GiB = 2**30
FP64 = 8


@dataclass(frozen=True)
class Machine:
    name: str
    memory_bytes: int          # device memory visible to the process
    reserved_bytes: int        # runtime context and allocator slack, never available
    matmul_flops: float        # achieved dense matmul rate in the serving dtype (FLOP/s)
    bandwidth: float           # achieved memory bandwidth (B/s)
    dtype_bytes: int           # serving dtype: weights, KV and logits
    source: str

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a kernel is compute-bound."""
        return self.matmul_flops / self.bandwidth


# bf16 serving. RTX 4090 / L40S: public torch bf16 matmul and device-copy measurements (the L40S
# sustains ~74 % of its datasheet tensor peak; no public bandwidth run: 85 % of 864 GB/s).
# H100 SXM: datasheet dense bf16 and HBM3 bandwidth (no measured figure used).
MACHINES: dict[str, Machine] = {m.name: m for m in [
    Machine("rtx4090", 24_564 * 2**20, GiB, 163e12, 920e9, 2, "measured matmul / copy"),
    Machine("l40s", 45 * GiB, GiB, 269e12, 734e9, 2, "measured matmul; 85 % of datasheet bandwidth"),
    Machine("h100", 80 * GiB, GiB, 989e12, 3.35e12, 2, "datasheet (SXM)"),
]}


@dataclass(frozen=True)
class Costs:
    """Per-forward costs of a model shape (bytes at `dtype_bytes` per element)."""
    linear_flops_per_token: float     # all blocks' GEMMs for one query token
    lm_head_flops_per_row: float
    attn_flops_per_pair: float        # QK^T + PV for one (query, key) pair, all heads and layers
    weights_read_bytes: float         # per forward: blocks + LM head (the embedding is a gather)
    weights_bytes: float              # everything stored, embedding included
    kv_bytes_per_token: float
    act_bytes_per_token: float        # one layer's live activations per token (MLP gate/up/act + residual)
    vocab: int
    n_heads: int


def costs(p: Preset, dtype_bytes: int) -> Costs:
    d, f, kv = p.d_model, p.mlp_hidden_size, p.n_kv_heads * p.head_dim
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * f      # Q, O, K, V, gate, up, down
    body = p.n_layers * per_layer
    return Costs(
        linear_flops_per_token=2.0 * body,
        lm_head_flops_per_row=2.0 * d * p.vocab_size,
        attn_flops_per_pair=4.0 * d * p.n_layers,
        weights_read_bytes=float(body + d * p.vocab_size) * dtype_bytes,
        weights_bytes=float(p.n_params) * dtype_bytes,
        kv_bytes_per_token=2.0 * p.n_layers * kv * dtype_bytes,
        act_bytes_per_token=float(3 * f + 4 * d) * dtype_bytes,
        vocab=p.vocab_size,
        n_heads=p.n_heads,
    )


@dataclass(frozen=True)
class RequestShape:
    prompt_len: float                 # mean prompt length
    gen_length: int
    block_length: int

    @property
    def length(self) -> float:
        """Mean canvas length: bidirectional attention reads the whole canvas every step."""
        return self.prompt_len + self.gen_length


def mean_prompt_len(dataset: str, length_scale: float = 1.0, n: int = 20_000, seed: int = 0) -> float:
    """Mean prompt length of a dataset's length model (workloads.datasets), sampled."""
    prompts, _ = LENGTHS[dataset].sample(n, np.random.default_rng(seed))
    return float(np.mean(prompts)) * length_scale


def ratios(c: Costs, shape: RequestShape, logit_bytes: int, kv_dtype_bytes: int, dtype_bytes: int) -> dict:
    """The scale-similarity ratios of one (model, request shape). `logit_bytes` per logit entry
    (2: bf16 logits; 8: an fp64 softmax), KV and `costs` at `dtype_bytes`."""
    kv_token = c.kv_bytes_per_token / dtype_bytes * kv_dtype_bytes
    attn = c.attn_flops_per_pair * shape.length
    return {
        "lm_head_over_body": c.lm_head_flops_per_row / c.linear_flops_per_token,
        "logit_row_over_kv_token": c.vocab * logit_bytes / kv_token,
        "prompt_over_block": shape.prompt_len / shape.block_length,
        "attention_share": attn / c.linear_flops_per_token,
        "blocks_per_request": shape.gen_length / shape.block_length,
    }


def dllm_cache_step_share(p: Preset, shape: RequestShape, prompt_interval: int = 100,
                          gen_interval: int = 7, transfer_ratio: float = 0.25) -> float:
    """dLLM-Cache's mean linear work per step / a full forward's, over one request's
    steps (= gen_length, the step counter global across blocks as upstream). Layer 0 always
    recomputes the whole canvas (maomaocun/dLLM-cache since 1ef9d03), so the share falls with
    depth (~0.15 for LLaDA-8B's 32 layers, 1.0 for one layer, where dLLM-Cache is plain LLaDA);
    any other layer at step t: everything at t = 1 or when both intervals hit, the gen part when
    the gen interval hits, else V for every gen token plus the int(G·ratio) least-similar gen
    tokens in full (and the prompt when its interval hits)."""
    P, G = shape.prompt_len, float(shape.gen_length)
    d, kv = p.d_model, p.n_kv_heads * p.head_dim
    v_share = d * kv / (2 * d * d + 2 * d * kv + 3 * d * p.mlp_hidden_size)
    L, picked = P + G, int(G * transfer_ratio)
    total = 0.0
    steps = int(shape.gen_length)
    for t in range(1, steps + 1):
        hit_p, hit_g = (t - 1) % prompt_interval == 0, (t - 1) % gen_interval == 0
        if hit_p and hit_g:
            other = L
        elif hit_g:
            other = G
        else:
            other = (P if hit_p else 0.0) + picked + G * v_share
        total += (L + (p.n_layers - 1) * other) / (p.n_layers * L)
    return total / steps


# The cache-reusing baselines (their Refresh peaks: baselines.registry.RefreshPeak, per family).
BASELINE_PEAKS: tuple[str, ...] = tuple(n for n, s in SYSTEMS.items() if s.refresh_peak and s.reuses)


def peak_bytes_per_token(peak: RefreshPeak, c: Costs, dtype_bytes: int) -> float:
    """A static batch's live bytes per token at its Refresh forward: the system's KV and logit
    copies (RefreshPeak) plus one layer's activations."""
    logit = peak.logit_copies * dtype_bytes + peak.fp64_logit_copies * FP64
    return peak.kv_copies * c.kv_bytes_per_token + c.vocab * logit + c.act_bytes_per_token


def largest_static_batch(c: Costs, free_bytes: float, length: float, system: str, dtype_bytes: int,
                         model_type: str = "llada") -> int:
    """Largest B whose Refresh peak (B requests of `length` tokens, a `model_type` model) fits `free_bytes`."""
    per_request = peak_bytes_per_token(SYSTEMS[system].peak_on(model_type), c, dtype_bytes) * length
    return int(free_bytes // per_request)


@dataclass(frozen=True)
class EngineBudget:
    """The engine's pool sizing: budget − weights − activations at the token budget − logit
    budget rows (fp32 logits + fp32 confidence temporaries: 8 B an entry) − guard. Without
    FlashAttention (SDPA on CPU) one canvas' [heads, T, T] float32 scores are live too."""
    max_num_batched_tokens: int
    max_num_logits: int
    retention: float = 0.5
    page_tokens: int | None = None    # dLLM-Serve reserves KV in pages of 256 tokens; ours in slots
    guard_fraction: float = 0.0
    materialized_scores: bool = False

    def kv_pool_bytes(self, c: Costs, budget: float) -> float:
        t = self.max_num_batched_tokens
        act = t * c.act_bytes_per_token + (c.n_heads * t * t * 4 if self.materialized_scores else 0)
        logits = self.max_num_logits * c.vocab * 8
        return budget - c.weights_bytes - act - logits - self.guard_fraction * budget

    def tokens_per_request(self, length: float, block_length: int) -> int:
        if self.page_tokens:          # dLLM-Serve: ⌈⌈r·L⌉ / page⌉ whole pages for the request's life
            return math.ceil(math.ceil(self.retention * length) / self.page_tokens) * self.page_tokens
        return kv_need("sparse", length, block_length, self.retention)   # the engine's own reservation

    def concurrency(self, c: Costs, budget: float, shape: RequestShape) -> int:
        need = self.tokens_per_request(shape.length, shape.block_length) * c.kv_bytes_per_token
        return max(0, int(self.kv_pool_bytes(c, budget) // need))


# dLLM-Serve's RTX 4090 serving config: 4,000 batched tokens, 2,048 logit rows, 256-token KV pages,
# gpu_memory_utilization 0.9 (the engine's own default, engine.config.GPU_MEMORY_UTILIZATION).
DLLM_SERVE_GPU = EngineBudget(max_num_batched_tokens=4000, max_num_logits=2048, page_tokens=256)


def reuse_intensity(c: Costs, n_requests: int, shape: RequestShape, retention: float, dtype_bytes: int) -> float:
    """FLOPs per byte of one Reuse forward of n requests (block queries against their kept
    context): weights streamed once, each request's kept KV read, its block's logits written."""
    q = shape.block_length
    keys = int((shape.length - q) * retention) + q
    flops = n_requests * q * (c.linear_flops_per_token + c.lm_head_flops_per_row + keys * c.attn_flops_per_pair)
    moved = c.weights_read_bytes + n_requests * (keys * c.kv_bytes_per_token + q * c.vocab * dtype_bytes)
    return flops / moved


def measure_cpu(threads: int = 2, size: int = 1024, dtype_bytes: int = 4) -> Machine:
    """This CPU's float32 matmul rate and copy bandwidth, measured now (a few seconds)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    t, n = time.perf_counter(), 5
    for _ in range(n):
        a @ b
    flops = 2 * size**3 * n / (time.perf_counter() - t)
    x = torch.empty(2**24)
    y = torch.empty_like(x)
    y.copy_(x)
    t = time.perf_counter()
    for _ in range(n):
        y.copy_(x)
    bw = 2 * x.numel() * 4 * n / (time.perf_counter() - t)
    return Machine(f"cpu ({threads} threads)", 0, 0, flops, bw, dtype_bytes, "measured now")


# ---------------------------------------------------------------- the table of docs/SCALING.md
# A paper-length request for the batch-capacity columns (prompt 256, 256 output tokens).
REFERENCE_REQUEST = RequestShape(prompt_len=256, gen_length=256, block_length=32)
PAPER_SHAPE_DATASET = "livebench"
PAPER_GEN_LENGTH = 256
REAL_MODELS = ("llada-8b", "dream-7b")  # each family's real shape, on every GPU of MACHINES


def serve_shape(sp) -> RequestShape:
    """Mean request shape of a serve preset's workload (its dataset's length model, scaled,
    outputs mapped to gen_length as `serve` maps them)."""
    prompts, outputs = LENGTHS[sp.dataset].sample(20_000, np.random.default_rng(0))
    scaled = np.maximum(1, np.round(outputs * sp.length_scale)).astype(int)
    gens = [sp.gen_length or gen_length_for(int(o), sp.block_length, sp.gen_cap) for o in scaled]
    return RequestShape(float(np.mean(prompts)) * sp.length_scale, float(np.mean(gens)), sp.block_length)


def similarity_row(name: str, preset: Preset, c: Costs, shape: RequestShape, dtype_bytes: int, budget: float, free: float,
                   engine: EngineBudget, engine_budget: float, ridge: float | None) -> dict:
    """One row of the similarity table: ratios at `shape`, capacities at REFERENCE_REQUEST."""
    ref = REFERENCE_REQUEST
    n = engine.concurrency(c, engine_budget, ref)
    row = {"model @ machine": name, **ratios(c, shape, dtype_bytes, dtype_bytes, dtype_bytes),
           "weights_over_budget": c.weights_bytes / budget,
           "request_kv_over_free": c.kv_bytes_per_token * ref.length / free}
    row.update({f"B {s}": largest_static_batch(c, free, ref.length, s, dtype_bytes, preset.model_type)
                for s in BASELINE_PEAKS})
    row["engine n"] = n
    knobs = PAPER_BASELINE_KNOBS["dllm-cache"]
    row["dllm-cache step share"] = dllm_cache_step_share(
        preset, shape, knobs["prompt_interval"], knobs["gen_interval"])
    row["reuse AI (1 req)"] = reuse_intensity(c, 1, ref, engine.retention, dtype_bytes)
    row["reuse AI (n req)"] = reuse_intensity(c, max(n, 1), ref, engine.retention, dtype_bytes)
    row["ridge"] = ridge
    return row


def similarity_table(cpu: Machine | None = None):
    """LLaDA-8B and Dream-7B on every GPU of MACHINES at the paper's shapes, then every model preset at the
    workload of its serve preset (float32 on this CPU: `cpu` gives the ridge point)."""
    rows = []
    paper = RequestShape(mean_prompt_len(PAPER_SHAPE_DATASET), PAPER_GEN_LENGTH, 32)
    for big in (MODELS[name] for name in REAL_MODELS):
        for m in MACHINES.values():
            c = costs(big, m.dtype_bytes)
            free = m.memory_bytes - m.reserved_bytes - c.weights_bytes
            rows.append(similarity_row(f"{big.name} @ {m.name}", big, c, paper, m.dtype_bytes, m.memory_bytes, free,
                                       DLLM_SERVE_GPU, m.memory_bytes * GPU_MEMORY_UTILIZATION, m.ridge))
    for p in MODELS.values():
        sp = next((q for q in SERVE.values() if q.model == p.name), None)
        if sp is None or sp.memory_budget is None or sp.dataset not in LENGTHS:
            continue                  # no serve preset of its own, or a task's prompts: no length model to compare at
        b = 4 if sp.dtype == "float32" else 2
        c = costs(p, b)
        budget = parse_size(sp.memory_budget)
        engine = EngineBudget(sp.max_num_batched_tokens, sp.max_num_logits or sp.max_num_batched_tokens,
                              sp.retention, guard_fraction=0.05, materialized_scores=sp.device == "cpu")
        rows.append(similarity_row(f"{p.name} @ {sp.name}", p, c, serve_shape(sp), b, budget,
                                   budget - c.weights_bytes, engine, budget, cpu.ridge if cpu else None))
    return pd.DataFrame(rows)
