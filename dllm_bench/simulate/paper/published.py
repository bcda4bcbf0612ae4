"""The paper's published serving numbers that the replays are measured against, and the trace
sizes its text gives."""
from __future__ import annotations

# Table 4 (L40S, 1.0 req/s): (avg latency s, throughput tok/s).
TABLE4 = {
    ("livebench", "dllm-cache"): (419.17, 32.52), ("livebench", "sparse-dllm"): (435.18, 32.26),
    ("livebench", "fast-dllm"): (241.19, 56.46), ("livebench", "engine"): (218.50, 90.17),
    ("burstgpt", "dllm-cache"): (6766.53, 33.07), ("burstgpt", "sparse-dllm"): (6466.96, 34.23),
    ("burstgpt", "fast-dllm"): (3158.38, 61.26), ("burstgpt", "engine"): (1551.40, 106.95),
    ("osc", "dllm-cache"): (6898.20, 32.62), ("osc", "sparse-dllm"): (6791.42, 32.87),
    ("osc", "fast-dllm"): (3408.36, 58.23), ("osc", "engine"): (1849.79, 94.32),
}
# §6.2 text on Figure 3 (RTX 4090, Burst): peak throughput tok/s.
FIG3 = {"engine": 76.6, "fast-dllm": 42.4}
# §6.2 text on Figure 4 (RTX 4090, Burst, 0.5 req/s): mean latency s, dLLM-Serve's exact, the
# baselines' a lower bound ("averaging over 4000s").
FIG4_RPS = 0.5
FIG4_LATENCY = {"engine": ("=", 1370.0), "fast-dllm": (">", 4000.0)}
# Figure 7 text (dLLM-Serve / Sparse-dLLM throughput): endpoints of the sweeps.
FIG7_INPUT = {100: 3.12, 600: 2.45}
FIG7_OUTPUT = {128: 3.21, 512: 2.47}
# Figure 8 text (speedup over Sparse-dLLM): rung -> dataset -> ratio.
FIG8 = {"engine": {"livebench": 1.48, "osc": 1.58, "burstgpt": 1.76},
        "+scheduler": {"osc": 1.68, "burstgpt": 1.82},
        "+logit budget": {"livebench": 1.75, "osc": 1.76, "burstgpt": 1.97}}
FIG8_RUNGS = {"engine": dict(scheduler="request", max_num_logits=None),
              "+scheduler": dict(scheduler="phase", max_num_logits=None),
              "+logit budget": dict(scheduler="phase", max_num_logits=2048)}
TRACE = {"livebench": 128, "osc": 2000, "burstgpt": 2000}
NAMES = {"engine": "dLLM-Serve", "fast-dllm": "Fast-dLLM", "sparse-dllm": "Sparse-dLLM", "dllm-cache": "dLLM-Cache"}
BASELINES = ("dllm-cache", "sparse-dllm", "fast-dllm")

# dLLM-Serve's published throughputs, (GPU, dataset) -> tok/s: every point the one scalar could be
# fitted on. The replays fit it on FIT_POINT; the leave-one-out check fits it on each in turn.
ENGINE_POINTS = {**{("l40s", ds): TABLE4[(ds, "engine")][1] for ds in ("burstgpt", "livebench", "osc")},
                 ("rtx4090", "burstgpt"): FIG3["engine"]}
FIT_POINT = ("l40s", "burstgpt")
GPU_LABELS = {"l40s": "L40S", "rtx4090": "RTX 4090"}
DATASET_LABELS = {"burstgpt": "Burst", "livebench": "LiveBench", "osc": "OSC"}


def point_label(point: tuple[str, str]) -> str:
    return f"{GPU_LABELS[point[0]]} {DATASET_LABELS[point[1]]}"
