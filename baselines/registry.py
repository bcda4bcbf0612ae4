"""The baseline systems: each a decoding policy (one module per system) over the engine's model
code, served by `baselines.static_batch.StaticBatchSystem` behind the engine's interface.

`SYSTEMS[name]` holds each system's facts: its knobs with their defaults, the sampling shape its
upstream evaluation uses, the upstream source it re-implements (repository + pinned commit), the
static batch that code runs, which knob is its KV retention, which parallel-decoding rules it has
(and the knob of each), the memory its Refresh step holds, whether it reuses a cache at all and
which implementation profile its upstream code is (the simulator's), and which model families
(config.json `model_type`) it runs, with the knobs a family lacks. Code elsewhere reads these
instead of comparing system names. A policy reads the family's rules from the model's config.
`make_system(name, model, max_batch_size, **knobs)` builds a ready StaticBatchSystem.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from baselines.dllm_cache import DREAM_TASK_DEFAULTS, DLLMCache
from baselines.dream import DreamSampler
from baselines.fast_dllm import FastDLLM
from baselines.llada import LLaDASampler
from baselines.sparse_dllm import SparseDLLM
from baselines.static_batch import Policy, StaticBatchSystem


@dataclass(frozen=True)
class RefreshPeak:
    """Live bytes per token at the Refresh forward (a static batch's peak) as the upstream code
    holds them: `kv_copies` of a token's KV (dLLM-Cache also caches the attention/MLP outputs it
    reuses), `logit_copies` of its logit row in the model dtype (logits, softmax, temporaries)
    and `fp64_logit_copies` in float64 (Fast-dLLM upcasts its logits and softmax)."""
    kv_copies: int
    logit_copies: int
    fp64_logit_copies: int = 0


@dataclass(frozen=True)
class SystemSpec:
    name: str
    policy: type[Policy]
    knobs: dict                       # knob name -> default (CLI names)
    sampling: dict                    # upstream's default gen_length / block_length / steps
    upstream: dict                    # repo, commit, files
    notes: str = ""
    knob_args: dict = field(default_factory=dict)   # CLI knob name -> policy argument name
    upstream_batch: int | None = None  # the static batch its upstream generation runs (`batch=upstream`)
    retention_knob: str | None = None  # the knob that is its KV retention (the engine's `retention`)
    decoding_knobs: dict = field(default_factory=dict)   # parallel-decoding rule -> its knob (engine.decoding)
    refresh_peak: RefreshPeak | None = None   # its Refresh memory per token (`models similarity`)
    reuses: bool = True                # it has cache-reusing forwards (a Reuse phase), not only full ones
    upstream_impl: str = "hf-eager"    # the implementation profile of its upstream code (simulate.implementations)
    families: tuple[str, ...] = ("llada", "Dream")   # the model_types it runs (each its upstream code for that family)
    absent_knobs: dict = field(default_factory=dict)  # model_type -> knobs its code for that family lacks
    family_defaults: dict = field(default_factory=dict)  # model_type -> knob defaults its code for that family uses
    family_peaks: dict = field(default_factory=dict)  # model_type -> its Refresh peak where that family's code differs

    def peak_on(self, model_type: str) -> RefreshPeak | None:
        """Its Refresh memory per token on a model of `model_type` (its code for that family)."""
        return self.family_peaks.get(model_type, self.refresh_peak)

    def knobs_for(self, model_type: str) -> dict:
        """Its knobs with their defaults on a model of `model_type`; {} if it does not run that family."""
        if model_type not in self.families:
            return {}
        knobs = {**self.knobs, **self.family_defaults.get(model_type, {})}
        return {k: v for k, v in knobs.items() if k not in self.absent_knobs.get(model_type, ())}


SYSTEMS: dict[str, SystemSpec] = {
    "llada": SystemSpec(
        "llada", LLaDASampler, {},
        dict(gen_length=128, block_length=32, steps=128),            # generate.py main()
        dict(repo="ML-GSAI/LLaDA", commit="b7e6c3565f194352da44b38dd12b6970597309f3", files=["generate.py"]),
        "no cache: S full forwards per block, full-sequence logits",
        upstream_batch=1,   # eval_llada.py generate_until: one request at a time
        refresh_peak=RefreshPeak(kv_copies=0, logit_copies=3),   # logits, softmax, a temporary (generate.py)
        reuses=False,
        families=("llada",),
    ),
    "dream": SystemSpec(
        "dream", DreamSampler, {},
        dict(gen_length=128, block_length=128, steps=128),           # Fast-dLLM dream/eval.py defaults (no blocks)
        dict(repo="NVlabs/Fast-dLLM", commit="24cc59e75f20a6384bae8c905965bb090b96388e",
             files=["dream/model/generation_utils.py"]),             # Dream's own, as in its checkpoint
        "Dream's diffusion_generate, no cache: `steps` full forwards over the whole generation (no blocks); "
        "the request's alg / eps / alg_temp / top_p / top_k",
        refresh_peak=RefreshPeak(kv_copies=0, logit_copies=3),   # logits, softmax probs, the filtered copy
        reuses=False,
        families=("Dream",),
    ),
    "fast-dllm": SystemSpec(
        "fast-dllm", FastDLLM, dict(fast_dllm_cache="dual", threshold=None, factor=None),
        dict(gen_length=256, block_length=32, steps=256),            # gsm8k eval, non-parallel
        dict(repo="NVlabs/Fast-dLLM", commit="24cc59e75f20a6384bae8c905965bb090b96388e",
             files=["llada/generate.py", "llada/model/modeling_llada.py", "dream/model/generation_utils_block.py",
                    "dream/model/modeling_dream.py"]),
        "dual|prefix cache refreshed at each block start; threshold (e.g. 0.9) or factor (e.g. 1.0) = parallel decoding",
        knob_args=dict(fast_dllm_cache="cache", threshold="threshold", factor="factor"),
        upstream_batch=1,   # llada/eval_llada.py generate_until: one request at a time (no batch set)
        # generate.py's get_transfer_index (threshold) and get_transfer_index_dynamic (factor)
        decoding_knobs=dict(threshold="threshold", factor="factor"),
        refresh_peak=RefreshPeak(kv_copies=1, logit_copies=1, fp64_logit_copies=2),
        # dream/model/generation_utils_block.py: the logits, their shifted copy and the softmax over
        # the whole canvas, all in the model dtype (no float64 upcast as in llada/generate.py)
        family_peaks={"Dream": RefreshPeak(kv_copies=1, logit_copies=3)},
        upstream_impl="hf-fast-dllm",
        absent_knobs={"Dream": ("factor",)},   # factor is llada/generate.py's alone
    ),
    "dllm-cache": SystemSpec(
        "dllm-cache", DLLMCache, dict(prompt_interval=50, gen_interval=7, transfer_ratio=0.25),
        dict(gen_length=256, block_length=8, steps=256),             # gsm8k script (block 8 upstream)
        dict(repo="maomaocun/dLLM-cache", commit="17235bffc8c5b587a2dc6f7dc76fcd01eab76e3a",
             files=["dllm_cache/hooks/cache_hook_LLaDA.py", "dllm_cache/cache/Cache.py", "utils/generate_function.py",
                    "dllm_cache/hooks/cache_hook_Dream.py"]),
        "per-task upstream settings: baselines.dllm_cache.TASK_DEFAULTS",
        knob_args=dict(prompt_interval="prompt_interval", gen_interval="gen_interval", transfer_ratio="transfer_ratio"),
        upstream_batch=2,   # scripts/run_LLaDA_*_Instruct.sh: --batch_size 2 (per GPU)
        family_defaults={"Dream": dict(zip(("prompt_interval", "gen_interval", "transfer_ratio"),
                                           DREAM_TASK_DEFAULTS["gsm8k"], strict=True))},
        refresh_peak=RefreshPeak(kv_copies=2, logit_copies=2),
        upstream_impl="hf-dllm-cache",
    ),
    "sparse-dllm": SystemSpec(
        "sparse-dllm", SparseDLLM, dict(keep_ratio=0.5, kernel_size=3),
        dict(gen_length=256, block_length=32, steps=256),            # shipped eval configs
        dict(repo="OpenMOSS/Sparse-dLLM", commit="3fd8986bee4ddd68e70ee8041da3a8c9de44f405",
             files=["opencompass/models/sparse_dllm/llada_generate.py", "opencompass/models/sparse_dllm/modeling_llada.py",
                    "opencompass/models/sparse_dllm/dream/generation_utils.py", "opencompass/models/sparse_dllm/dream/Cache.py"]),
        "delayed eviction: kept subset built at step 1 of each block",
        knob_args=dict(keep_ratio="keep_ratio", kernel_size="kernel_size"),
        upstream_batch=1,   # myeval/eval_performance/eval_sparse_dllm_llada_chat.py: batch_size=1
        retention_knob="keep_ratio",
        refresh_peak=RefreshPeak(kv_copies=1, logit_copies=4),
    ),
}


def systems_for(model_type: str) -> list[str]:
    """The systems that run a model of `model_type`."""
    return [name for name, spec in SYSTEMS.items() if model_type in spec.families]


def make_policy(name: str, model, **knobs) -> Policy:
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; choose from {sorted(SYSTEMS)}")
    spec = SYSTEMS[name]
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if mt is not None and mt not in spec.families:
        raise ValueError(f"system {name!r} does not run {mt} models; systems for {mt}: {', '.join(systems_for(mt))}")
    unknown = set(knobs) - set(spec.knobs)
    if unknown:
        raise ValueError(f"system {name!r} has no knob(s) {sorted(unknown)}; its knobs: {sorted(spec.knobs)}")
    defaults = spec.knobs if mt is None else spec.knobs_for(mt)
    args = {spec.knob_args[k]: v for k, v in {**defaults, **knobs}.items()}
    return spec.policy(model, **args)


def make_system(name: str, model, max_batch_size: int = 8, max_model_len: int | None = None, **knobs) -> StaticBatchSystem:
    """A StaticBatchSystem running system `name` with its defaults overridden by `knobs`."""
    return StaticBatchSystem(model, make_policy(name, model, **knobs), max_batch_size, max_model_len)
