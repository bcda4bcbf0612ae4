"""Implementation profiles: what a code base adds on top of its algorithm's GEMMs, counted per
element from the code (never fitted). A system's algorithm (its schedule of forwards) and its
implementation are independent, so `--impl fast-dllm=engine` asks "Fast-dLLM's algorithm on
our engine".

* `engine` — a nano-vllm-style engine (dLLM-Serve; ours on a GPU): compiled RMSNorm/RoPE,
  fused SiLU-mul, per-sequence index copies (24·d + 6·f + 32·d bytes per query token and
  layer); a Reuse step gathers the packed K/V, concatenates the block, then attends (3 moves
  per cached token); bf16 confidence softmax.
* `hf-eager` — the upstream HF LLaDA modeling code the baselines run (ML-GSAI/LLaDA @ b7e6c35,
  maomaocun/dLLM-cache @ 17235bf, OpenMOSS/Sparse-dLLM @ 3fd8986): fp32 RMSNorm twice
  (≈ 36 B/elem), fp32 RoPE on q and k (≈ 52-56 B/elem), SiLU, mul, residual adds: 144·d + 10·f;
  softmax in the logits dtype over every logit row (read, write, argmax read: 6 B per entry);
  Sparse-dLLM's cached layers torch.cat the kept K/V with the block's, then attend (3 moves per
  cached token: OpenMOSS/Sparse-dLLM @ 3fd8986 modeling_llada.py).
* `hf-fast-dllm` — hf-eager plus NVlabs/Fast-dLLM @ 24cc59e llada/model/modeling_llada.py: keys
  cached before RoPE, so every forward re-applies fp32 RoPE to every cached key in every layer
  (56·d bytes per key per layer), and llada/generate.py's softmax of logits.to(float64) over
  all rows (26 B per entry); its block is written into the cache in place, so a cached token is
  read once.
* `hf-dllm-cache` — hf-eager plus maomaocun/dLLM-cache @ 17235bf
  dllm_cache/hooks/cache_hook_LLaDA.py: its cache holds K before RoPE and its RoPe_forward
  rotates the whole key tensor in fp32 in every attention call, so the cached keys are re-RoPE'd
  in every layer that attends (56·d bytes per key per layer, as Fast-dLLM's), and concatenates
  (torch.cat) the cached K/V with the block's before attending (3 moves per cached token).
* `dllm-bench` — this repository's code (engine and baselines share engine/models/llada.py):
  eager and unfused (float32 on the CPU presets). It is what `serve` measures, so a profile
  written by `dllm-bench calibrate` (CPU or GPU) defaults to it; its host time, which dominates
  on a CPU, is fitted there per system.
"""
from __future__ import annotations

from baselines import SYSTEMS
from dllm_bench.errors import UserError
from dllm_bench.simulate.cost_model import ImplProfile
from dllm_bench.systems.spec import ENGINE

IMPLEMENTATIONS: dict[str, ImplProfile] = {p.name: p for p in [
    ImplProfile("engine", elem_d=56, elem_f=6, softmax_bytes_per_entry=6, rope_bytes_per_key_d=0, kv_copy=3,
                source="nano-vllm-style engine (dLLM-Serve); docs/SIMULATE.md"),
    ImplProfile("hf-eager", elem_d=144, elem_f=10, softmax_bytes_per_entry=6, rope_bytes_per_key_d=0, kv_copy=3,
                source="ML-GSAI/LLaDA@b7e6c35 modeling; dLLM-cache@17235bf; Sparse-dLLM@3fd8986"),
    ImplProfile("hf-fast-dllm", elem_d=144, elem_f=10, softmax_bytes_per_entry=26, rope_bytes_per_key_d=56,
                kv_copy=1, source="NVlabs/Fast-dLLM@24cc59e llada/model/modeling_llada.py, llada/generate.py"),
    ImplProfile("hf-dllm-cache", elem_d=144, elem_f=10, softmax_bytes_per_entry=6, rope_bytes_per_key_d=56,
                kv_copy=3, source="maomaocun/dLLM-cache@17235bf dllm_cache/hooks/cache_hook_LLaDA.py (RoPe_forward)"),
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
