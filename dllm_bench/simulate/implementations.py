"""Implementation profiles: what a code base adds on top of its algorithm's GEMMs, counted per
element from the code (never fitted). A system's algorithm (its schedule of forwards) and its
implementation are independent, so `--impl fast-dllm=engine` asks "Fast-dLLM's algorithm on
our engine". Each profile's counts and the upstream code they come from are in the comment
above it (docs/SIMULATE.md, "Implementation profiles").
"""
from __future__ import annotations

from baselines import SYSTEMS
from dllm_bench.errors import UserError
from dllm_bench.simulate.cost_model import ImplProfile
from dllm_bench.systems.spec import ENGINE

IMPLEMENTATIONS: dict[str, ImplProfile] = {p.name: p for p in [
    # Fused RMSNorm/RoPE and SiLU-mul, per-sequence index copies (24d + 6f + 32d bytes per query
    # token and layer); a Reuse step gathers the packed K/V, concatenates the block and attends
    # (3 moves per cached token); bf16 confidence softmax.
    ImplProfile("engine", elem_d=56, elem_f=6, softmax_bytes_per_entry=6, rope_bytes_per_key_d=0, kv_copy=3,
                source="nano-vllm-style engine (dLLM-Serve); docs/SIMULATE.md"),
    # Upstream HF LLaDA as the baselines run it: fp32 RMSNorm twice (~36 B/elem), fp32 RoPE on q
    # and k (~52-56 B/elem), SiLU, mul, residual adds: 144d + 10f; softmax in the logits' dtype
    # over every logit row (6 B per entry); Sparse-dLLM's cached layers torch.cat kept K/V with the
    # block's (3 moves per cached token, OpenMOSS/Sparse-dLLM@3fd8986 modeling_llada.py).
    ImplProfile("hf-eager", elem_d=144, elem_f=10, softmax_bytes_per_entry=6, rope_bytes_per_key_d=0, kv_copy=3,
                source="ML-GSAI/LLaDA@b7e6c35 modeling; dLLM-cache@17235bf; Sparse-dLLM@3fd8986"),
    # hf-eager plus keys cached before RoPE, so every forward re-applies fp32 RoPE to every cached
    # key in every layer (56d bytes per key per layer), and generate.py's softmax of
    # logits.to(float64) over all rows (26 B per entry); the block is written into the cache in
    # place, so a cached token is read once.
    ImplProfile("hf-fast-dllm", elem_d=144, elem_f=10, softmax_bytes_per_entry=26, rope_bytes_per_key_d=56,
                kv_copy=1, source="NVlabs/Fast-dLLM@24cc59e llada/model/modeling_llada.py, llada/generate.py"),
    # hf-eager plus a cache of K before RoPE that RoPe_forward rotates whole in fp32 in every
    # attention call (56d bytes per key per layer), and torch.cat of cached and block K/V.
    ImplProfile("hf-dllm-cache", elem_d=144, elem_f=10, softmax_bytes_per_entry=6, rope_bytes_per_key_d=56,
                kv_copy=3, source="maomaocun/dLLM-cache@17235bf dllm_cache/hooks/cache_hook_LLaDA.py (RoPe_forward)"),
    # This repository's code (engine and baselines share engine/models/dense.py), eager: what
    # `serve` measures, so a profile `calibrate` wrote defaults to it (its host time fitted there).
    ImplProfile("dllm-bench", elem_d=144, elem_f=10, softmax_bytes_per_entry=12, rope_bytes_per_key_d=0,
                kv_copy=2, source="this repository (engine/, baselines/), eager float32 on CPU"),
]}

# The implementation whose host time `dllm-bench calibrate` measures (per system): a system
# simulated on it without a fitted host term is charged too little.
MEASURED_HOST = "dllm-bench"

# Which implementation each system runs by default on a built-in GPU profile (upstream code) and
# on a CPU profile (this repository's code, which is what `serve` measures there).


def default_impl(system: str, hardware_kind: str, measured: str = "") -> str:
    """`measured`: the implementation a calibrated profile timed (a GPU calibrated by `dllm-bench
    calibrate` predicts this repository's code there, as `serve` would measure it)."""
    if measured:
        return measured
    if hardware_kind == "cpu":
        return MEASURED_HOST
    return SYSTEMS[system].upstream_impl if system in SYSTEMS else ENGINE


# What each implementation is, in the words every simulated table names it with.
KINDS = {"engine": "a nano-vllm-style engine", "hf-eager": "upstream HF code", "hf-fast-dllm": "upstream HF code",
         "hf-dllm-cache": "upstream HF code", "dllm-bench": "this project's code, as serve measures it"}


def implementations_line(impls: dict[str, str]) -> str:
    """`implementation per system: engine = dllm-bench (this project's code, ...), ...`."""
    return "implementation per system: " + ", ".join(f"{s} = {i} ({KINDS.get(i, i)})" for s, i in impls.items())


def get_impl(name: str) -> ImplProfile:
    try:
        return IMPLEMENTATIONS[name]
    except KeyError:
        raise UserError(f"unknown implementation profile {name!r}; choose from {', '.join(IMPLEMENTATIONS)}") from None


def parse_impl_overrides(text: str | None, systems: list[str]) -> dict[str, str]:
    """`fast-dllm=engine,dllm-cache=engine` -> {system: profile}; every name checked."""
    out: dict[str, str] = {}
    for tok in (t.strip() for t in (text or "").split(",")):
        if not tok:
            continue
        sysname, sep, impl = tok.partition("=")
        if not sep or not impl:
            raise UserError(f"--impl: expected SYSTEM=PROFILE, got {tok!r}")
        if sysname not in systems:
            raise UserError(f"--impl: {sysname!r} is not one of the simulated systems ({', '.join(systems)})")
        get_impl(impl)
        out[sysname] = impl
    return out
