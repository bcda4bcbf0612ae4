"""`dllm-bench doctor`: the first command on a new machine. Each check is a row (ok / warn / fail /
skipped with the reason): the device, torch and CUDA, the attention kernel, the dtypes, free memory, a
checkpoint's layout (`--model`), one request on the device against the float64 reference sampler,
and one LLaDA-8B-shaped layer timed against the simulator's cost model for this hardware.

checks.py (the environment and the checkpoint), generation.py (the request), layer_timing.py
(the layer), report.py (table, JSON, next commands), run.py (every check in order).
"""
