"""One LLaDA-8B-shaped layer (the engine's own block: norms, QKV, RoPE, the engine's attention
call, O, SwiGLU MLP) over a T-token canvas, timed on the device and set beside what `simulate`'s
cost model charges for the same work on this machine's hardware profile.

The ratio says whether `simulate --hardware NAME` describes this machine: ~1 it does; far off,
`dllm-bench calibrate` profiles it. On a CPU the profile is `cpu` (a calibrated one in the cache
wins over the built-in, as in `simulate`) and T is the largest that the profile predicts in a
fraction of a second; on a GPU the built-in profile named in the GPU's name, if any.
"""
from __future__ import annotations

import dataclasses
import re

import torch

from dllm_bench.checkpoints.presets import get_preset
from dllm_bench.doctor.checks import OK, SKIP, WARN, Check
from dllm_bench.errors import UserError
from dllm_bench.simulate import hardware
from dllm_bench.simulate.cost_model import CostModel, Forward, HostCost, LayerPass, ModelShape, Seg
from dllm_bench.simulate.implementations import default_impl, get_impl
from dllm_bench.timing import device_sync, median_time
from engine import attention
from engine.models import DenseBlock, RotaryEmbedding

TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TARGET_S = 0.25          # the predicted time of one timed pass: 1 + REPEATS passes stay near a second
REPEATS = 3
RATIO_OK = (0.5, 2.0)    # a profile within 2x of this machine still ranks systems the same way
UNMATCHED_TOKENS = 1024
# (pattern in the lower-cased GPU name, built-in profile); the first match wins
GPU_PROFILES = ((r"h200", "h200"), (r"h100", "h100"), (r"a100.*80\s*g", "a100-80g"), (r"l40s", "l40s"),
                (r"4090", "rtx4090"))


def profile_for_gpu(name: str) -> str | None:
    """The built-in hardware profile of a CUDA device name, None when none matches (an A100 40GB
    is not the 80GB profile: its memory, and so every capacity, differs)."""
    low = name.lower()
    return next((prof for pat, prof in GPU_PROFILES if re.search(pat, low)), None)


def llada_8b_layer_config():
    return dataclasses.replace(get_preset("llada-8b").model_config(), n_layers=1)


def predicted_s(hw, cfg, wbytes: int, tokens: int) -> float:
    """The cost model's device time of one layer pass of `tokens` queries over as many keys (a
    Refresh of a `tokens`-long canvas), in the implementation the profile simulates for the engine."""
    shape = ModelShape.from_config(cfg, wbytes)
    cm = CostModel(shape, hw.peak_flops, hw.bandwidth, hw.efficiency, get_impl(default_impl("engine", hw.kind, hw.impl)),
                   HostCost())
    return cm.step(Forward((LayerPass(1, (Seg(tokens, tokens),)),))).t_device


def pick_tokens(predict, target_s: float = TARGET_S) -> int:
    """The largest canvas whose predicted pass fits `target_s` (at least the smallest)."""
    fits = [t for t in TOKENS if predict(t) <= target_s]
    return fits[-1] if fits else TOKENS[0]


def _block(cfg, dtype: torch.dtype, dev: torch.device):
    with torch.device("meta"):
        blk = DenseBlock(cfg)
    blk = blk.to_empty(device=dev).to(dtype)
    with torch.no_grad():
        for name, p in blk.named_parameters():
            # Small weights keep activations finite; the values do not change the time.
            p.fill_(1.0) if name.endswith("norm.weight") else p.uniform_(-0.02, 0.02)
    blk.fuse()                   # as a loaded model runs it (DenseBlock.fuse)
    return blk.eval()


def _attention(dev: torch.device, dtype: torch.dtype):
    """The engine step's attention call for one sequence: the packed varlen kernel where the
    engine would use one (torch's varlen_attn or flash-attn), else its padded batch SDPA."""
    backend = attention.choose_backend("auto", dev, dtype).name
    if backend in attention.PACKED:
        kernel = attention.PackedKernel(backend)

        def attn(layer, q, k, v):
            n = q.shape[0]
            cu = torch.tensor([0, n], dtype=torch.int32, device=q.device)
            return kernel(q, k, v, cu, cu, n, n)
        return attn, attention.LABELS[backend]
    return (lambda layer, q, k, v: attention.padded_attention(q[None], k[None], v[None], None)[0]), "SDPA"


def measure_layer_s(cfg, dtype: torch.dtype, dev: torch.device, tokens: int, repeats: int = REPEATS) -> tuple[float, str]:
    blk = _block(cfg, dtype, dev)
    attn, kernel = _attention(dev, dtype)
    rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
    x = torch.randn(tokens, cfg.d_model, device=dev).to(dtype)
    pos = torch.arange(tokens, device=dev)
    with torch.no_grad():
        t = median_time(lambda: blk(x, pos, rope, 0, attn), repeats, device_sync(dev))
    return t, kernel


def _hardware(dev: torch.device):
    """(profile, why none) for this device: `cpu` on a CPU, the GPU's named built-in profile."""
    if dev.type == "cuda":
        gpu = torch.cuda.get_device_name(dev)
        name = profile_for_gpu(gpu)
        if name is None:
            return None, (f"no built-in profile matches {gpu!r} ({', '.join(p for _, p in GPU_PROFILES)}); "
                          "`dllm-bench calibrate --device cuda --name mygpu` makes one")
        return hardware.load(str(hardware.BUILTIN_DIR / f"{name}.json")), ""
    try:
        return hardware.load("cpu"), ""
    except UserError as e:
        return None, str(e)


def layer_check(dev: torch.device) -> Check:
    cfg = llada_8b_layer_config()
    hw, why = _hardware(dev)
    dtype_name = str((hw.fit.get("dtype") if hw is not None else None) or
                     ("bfloat16" if dev.type == "cuda" else "float32"))
    dtype = getattr(torch, dtype_name)
    wbytes = torch.empty(0, dtype=dtype).element_size()
    threads = torch.get_num_threads()
    if dev.type == "cpu" and hw is not None and hw.fit.get("threads"):
        torch.set_num_threads(int(hw.fit["threads"]))        # the thread count the profile was fitted at
    try:
        tokens = pick_tokens(lambda t: predicted_s(hw, cfg, wbytes, t)) if hw is not None else UNMATCHED_TOKENS
        measured, kernel = measure_layer_s(cfg, dtype, dev, tokens)
    finally:
        torch.set_num_threads(threads)
    what = f"one LLaDA-8B layer, {tokens}-token canvas, {dtype_name}, {kernel}: {measured * 1e3:.1f} ms measured"
    data = {"tokens": tokens, "dtype": dtype_name, "attention": kernel, "measured_ms": measured * 1e3}
    if hw is None:
        return Check("layer timing", SKIP, f"{what}; {why}", data)
    sim = predicted_s(hw, cfg, wbytes, tokens)
    ratio = measured / sim
    data.update(profile=hw.name, profile_path=hw.path, simulated_ms=sim * 1e3, ratio=ratio)
    text = f"{what}, {sim * 1e3:.1f} ms simulated on profile {hw.name!r}: measured/simulated {ratio:.2f}"
    if RATIO_OK[0] <= ratio <= RATIO_OK[1]:
        return Check("layer timing", OK, text, data)
    return Check("layer timing", WARN, f"{text}; the profile does not describe this machine: "
                 f"`dllm-bench calibrate{' --device cuda' if dev.type == 'cuda' else ''}` profiles it", data)
