"""The device's ridge in query rows (`EngineConfig.ridge_rows`, what `cache=auto` weighs:
engine.kv_cache): the rows at which a GEMM through the weights stops being bound by reading
them, peak FLOP/s / bandwidth x bytes per weight / 2 (an H100 in bf16 ~260, an RTX 4090 ~180,
an L40S ~370). A measured CUDA run measures its device's peaks once (an 8192^3 GEMM in the
serving dtype and a 256 MiB copy: ~0.1 s); a simulated GPU takes its hardware profile's peaks,
so a simulated and a measured run weigh alike. A CPU, measured or simulated, gets CPU_RIDGE_ROWS
(this machine's float32 profile gives ~7.5: a few rows, below any request's Reuse block, so auto
serves dual wherever one dual request fits its pool). A simulated GPU also states a step's fixed
cost beyond the roofline (`overhead`: its profile's host and per-kernel costs, in rows at its peak
for the model's weights); measured runs and CPUs weigh none (0)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_bench.device_defaults import SimulatedGpu, gpu_name, resolve_device
from dllm_bench.timing import peak_rates

AUTO = "auto"
CPU_RIDGE_ROWS = 8
PEAK_GEMM, PEAK_COPY = 8192, 64 << 20      # elements of the copy (256 MiB in float32)


@dataclass(frozen=True)
class Ridge:
    rows: int
    rule: str                 # why: "measured on <gpu>: ...", "<profile>'s peaks: ...", "a CPU: ..."
    overhead: int = 0         # a step's fixed cost in rows (EngineConfig.overhead_rows)


def ridge_rows(peak_flops: float, bandwidth: float, dtype_bytes: int) -> int:
    return max(1, round(peak_flops / bandwidth * dtype_bytes / 2))


def from_peaks(peak_flops: float, bandwidth: float, dtype_bytes: int, where: str, overhead: int = 0) -> Ridge:
    rows = ridge_rows(peak_flops, bandwidth, dtype_bytes)
    why = f"{where}: {peak_flops / 1e12:.0f} TFLOP/s / {bandwidth / 1e12:.2f} TB/s"
    return Ridge(rows, why + (f", step overhead {overhead} rows" if overhead else ""), overhead)


def overhead_rows(gpu: SimulatedGpu, model_info: dict | None) -> int:
    """A simulated GPU's fixed step cost as the query rows its peak computes through the weights
    a forward reads (every parameter but the embedding, a gather) in that time; 0 unknown."""
    if model_info is None:
        return 0
    seconds = gpu.step_overhead_s + model_info["n_layers"] * gpu.layer_overhead_s
    weights = model_info["n_params"] - model_info["d_model"] * model_info["padded_vocab"]
    return round(seconds * gpu.peak_flops / (2 * weights))


def device_ridge(device, dtype: torch.dtype, model_info: dict | None = None) -> Ridge:
    """The ridge of `device` ("auto" too) for weights in `dtype`: measured on CUDA, a simulated
    GPU's from its profile's peaks (and its step overhead for the model of `model_info`,
    serve's `model_info`), CPU_RIDGE_ROWS elsewhere."""
    if isinstance(device, SimulatedGpu):
        return from_peaks(device.peak_flops, device.bandwidth, dtype.itemsize, f"{device.name}'s peaks",
                          overhead_rows(device, model_info))
    dev = resolve_device(device)
    if dev.type != "cuda":
        return Ridge(CPU_RIDGE_ROWS, "a CPU: a few rows")
    flops, bw = peak_rates(PEAK_GEMM, PEAK_COPY, dtype, dev, repeats=5)
    torch.cuda.empty_cache()
    return from_peaks(flops, bw, dtype.itemsize, f"measured on {gpu_name(dev)}")
