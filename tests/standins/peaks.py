"""A stand-in for `dllm_bench.timing.peak_rates` on a faked CUDA (nothing to time on a CPU
pretending to be a GPU): an H100's GEMM rate and bandwidth as the `h100` profile has them, so a
faked GPU's measured ridge is 262 rows in bf16."""
from __future__ import annotations

H100_FLOPS, H100_BANDWIDTH = 789.2e12, 3015e9
calls: list[tuple] = []


def fake_peaks(n, copy_elems, dtype, device, repeats):
    calls.append((n, copy_elems, dtype, str(device), repeats))
    return H100_FLOPS, H100_BANDWIDTH
