"""The environment checks of `doctor`: what this machine runs the engine on, each as one `Check`.
None of them raises for a machine that cannot do something: that is a row, not a traceback."""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dllm_bench import device_defaults
from dllm_bench.checkpoints.layout import check_layout, load_config
from dllm_bench.units import format_size
from engine import attention
from engine.profiler import budget_from_free

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skipped"
STATUSES = (OK, WARN, FAIL, SKIP)
# LLaDA-8B-Instruct in bfloat16: the weights alone (8.02e9 parameters x 2 bytes)
LLADA_8B_BF16_BYTES = 16.04e9
CPUINFO, NVIDIA_PROC = Path("/proc/cpuinfo"), Path("/proc/driver/nvidia/version")
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass
class Check:
    name: str
    status: str
    detail: str
    data: dict = field(default_factory=dict)      # machine-readable facts (--json)

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status


def cpu_flags(path: Path = CPUINFO) -> set[str]:
    try:
        for line in path.read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_name(path: Path = CPUINFO) -> str:
    try:
        for line in path.read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_driver(path: Path = NVIDIA_PROC) -> str | None:
    """The NVIDIA kernel driver's version line, if one is loaded (it is there even when torch is
    a CPU build, which is how a GPU machine with the wrong torch is told apart from a CPU one)."""
    try:
        first = path.read_text(encoding="ascii", errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    words = first.split()
    return next((w for w in words if w[:1].isdigit() and "." in w), first.strip())


def device_check(dev: torch.device) -> Check:
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        return Check("device", OK, f"{dev}: {p.name}, compute capability {p.major}.{p.minor}, "
                     f"{format_size(p.total_memory)}; {torch.cuda.device_count()} CUDA device(s)",
                     {"type": "cuda", "name": p.name, "capability": [p.major, p.minor],
                      "total_memory": int(p.total_memory), "count": torch.cuda.device_count()})
    data = {"type": "cpu", "name": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    where = f"{data['name']}, {data['cores']} cores, {data['torch_threads']} torch threads"
    if torch.cuda.is_available():
        return Check("device", OK, f"the CPU as asked ({torch.cuda.device_count()} CUDA device(s) present): {where}",
                     {**data, "cuda_devices": torch.cuda.device_count()})
    driver = nvidia_driver()
    if driver is not None:
        why = ("torch is a CPU build" if torch.version.cuda is None
               else f"torch (CUDA {torch.version.cuda}) sees no device: driver too old, or CUDA_VISIBLE_DEVICES?")
        return Check("device", WARN, f"NVIDIA driver {driver} is loaded but {why}; running on the CPU: {where}",
                     {**data, "nvidia_driver": driver})
    return Check("device", OK, f"no GPU: the CPU, {where}", data)


def torch_check(dev: torch.device) -> Check:
    data = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.version.cuda else None, "driver": nvidia_driver()}
    if torch.version.cuda is None:
        return Check("torch", OK, f"torch {torch.__version__} (CPU build)", data)
    parts = [f"torch {torch.__version__}", f"built for CUDA {torch.version.cuda}"]
    if data["cudnn"]:
        parts.append(f"cuDNN {data['cudnn']}")
    if data["driver"]:
        parts.append(f"driver {data['driver']}")
    return Check("torch", OK, ", ".join(parts), data)


def attention_check(dev: torch.device) -> Check:
    """The kernel the engine attends with here in bfloat16 and why (the line a run prints once);
    on CUDA one small call of it proves it runs: a wheel can import and lack this GPU's kernels."""
    choice = attention.choose_backend("auto", dev, torch.bfloat16)
    data = {"backend": choice.name, "why": choice.why, "torch_varlen": attention.torch_varlen() is not None,
            "flash_attn_error": attention.flash_attn_import_error()}
    if dev.type != "cuda":
        return Check("attention", SKIP, f"no CUDA device: {choice.line}", data)
    if choice.name == "sdpa":
        return Check("attention", WARN, f"{choice.line}: slower at long canvases; torch >= 2.10 has varlen_attn, "
                     "or pip install -e '.[gpu]' for flash-attn", data)
    try:
        q = torch.randn(8, 2, 64, dtype=torch.bfloat16, device=dev)
        cu = torch.tensor([0, 8], dtype=torch.int32, device=dev)
        out = attention.PackedKernel(choice.name)(q, q, q, cu, cu, 8, 8)
        torch.cuda.synchronize(dev)
        ok = bool(torch.isfinite(out).all())
    except Exception as e:  # a kernel missing for this architecture raises at the call
        return Check("attention", WARN, f"{choice.line}, but a call fails here: "
                     f"{type(e).__name__}: {e}".splitlines()[0], {**data, "runs": False})
    return Check("attention", OK if ok else WARN, f"{choice.line}: runs on {dev}"
                 + ("" if ok else ", but returned non-finite values"), {**data, "runs": ok})


def _matmul_runs(dtype: torch.dtype, dev: torch.device) -> str | None:
    try:
        a = torch.ones(64, 64, dtype=dtype, device=dev)
        if float((a @ a)[0, 0]) != 64.0:
            return "wrong result"
    except Exception as e:  # a dtype the device has no kernel for
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def dtype_check(dev: torch.device) -> Check:
    failed = {str(dt).removeprefix("torch."): err for dt in (torch.float32, torch.bfloat16, torch.float64)
              if (err := _matmul_runs(dt, dev)) is not None}
    if dev.type == "cuda":
        native = torch.cuda.is_bf16_supported()
        bf16 = "bfloat16 native" if native else "no native bfloat16 on this GPU (use --dtype float16)"
        data = {"bf16": "native" if native else "unsupported", "failed": failed}
        status = OK if native and not failed else WARN
        return Check("dtypes", status, f"float32, float64; {bf16}" + _failed(failed), data)
    have = sorted(cpu_flags() & set(BF16_CPU_FLAGS))
    bf16 = (f"bfloat16 matmul native ({', '.join(have)})" if have else
            "bfloat16 matmul emulated (slow: no avx512_bf16 / amx_bf16 in /proc/cpuinfo; CPU runs use float32)")
    return Check("dtypes", FAIL if failed else OK, f"float32, float64 native; {bf16}" + _failed(failed),
                 {"bf16": "native" if have else "emulated", "cpu_bf16_flags": have, "failed": failed})


def _failed(failed: dict) -> str:
    return "".join(f"; {k} matmul fails: {v}" for k, v in failed.items())


def _meminfo() -> dict[str, int]:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f) if v.strip()}
    except (OSError, ValueError):
        return {}


def memory_check(dev: torch.device, weights_bytes: float | None = None) -> Check:
    """Free memory, and whether LLaDA-8B's weights (or the --model checkpoint's) leave room for a
    KV pool in the budget a run takes by default (free x GPU_MEMORY_UTILIZATION on CUDA)."""
    weights = weights_bytes or LLADA_8B_BF16_BYTES
    what = "the checkpoint's weights" if weights_bytes else "LLaDA-8B's bf16 weights"
    if dev.type == "cuda":
        free, total = device_defaults.free_device_memory(dev)
        budget = budget_from_free(free, 0, device_defaults.GPU_MEMORY_UTILIZATION)   # before any weights load
        data = {"free": free, "total": total, "budget": int(budget), "weights": int(weights)}
        head = f"{format_size(free)} free of {format_size(total)}; default budget {format_size(int(budget))}"
        if budget < weights * 1.1:
            return Check("memory", WARN, f"{head}: too small for {what} ({format_size(int(weights))}) "
                         "and a KV pool", data)
        return Check("memory", OK, f"{head}: {what} ({format_size(int(weights))}) leave "
                     f"{format_size(int(budget - weights))} for activations and the KV pool", data)
    info = _meminfo()
    free, total = info.get("MemAvailable"), info.get("MemTotal")
    if free is None or total is None:
        return Check("memory", SKIP, "/proc/meminfo is not readable here", {})
    return Check("memory", OK, f"{format_size(free)} of {format_size(total)} RAM available",
                 {"free": free, "total": total})


def checkpoint_check(model_dir: Path | None) -> Check:
    """config.json, the index and every shard's header against the model config.json describes,
    on the meta device (no tensor data read: seconds for LLaDA-8B)."""
    if model_dir is None:
        return Check("checkpoint", SKIP, "no --model given (`dllm-bench doctor --model DIR` checks a checkpoint)")
    rep = check_layout(model_dir)
    data = {"path": str(model_dir), "ok": rep.ok, "problems": list(rep.problems), "tensors": rep.n_tensors,
            "params": rep.n_params, "shards": rep.shards, "bytes": rep.total_bytes, "dtypes": list(rep.dtypes)}
    if not rep.ok:
        return Check("checkpoint", FAIL, f"{model_dir}: " + "; ".join(rep.problems), data)
    cfg = load_config(model_dir)
    tok = (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer_config.json").is_file()
    data.update(family=cfg.family.name, d_model=cfg.d_model, layers=cfg.n_layers, heads=cfg.n_heads,
                kv_heads=cfg.kv_heads, vocab=cfg.vocab_size, tokenizer=tok)
    heads = f"{cfg.n_heads} heads" + (f" over {cfg.kv_heads} KV heads" if cfg.kv_heads != cfg.n_heads else "")
    detail = (f"{model_dir}: {cfg.family.name}, {rep.n_params / 1e9:.2f}B parameters in {rep.n_tensors} tensors, "
              f"{rep.shards} shard(s), {'/'.join(rep.dtypes)}; d_model {cfg.d_model}, {cfg.n_layers} layers, "
              f"{heads}, vocab {cfg.vocab_size}; config and index match the model on the meta device")
    if not tok:
        return Check("checkpoint", WARN, detail + "; no tokenizer files (text prompts need them; --prompt-ids works)",
                     data)
    return Check("checkpoint", OK, detail, data)
