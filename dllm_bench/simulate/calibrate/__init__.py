"""`dllm-bench calibrate`: profile this machine and write a hardware profile (docs/SIMULATE.md).

peaks and operators (operators.py) -> each system's host time (host.py) -> the profile (run.py);
dllm_bench.timing holds the one way anything is timed on a device, mode.py how a calibration times
a CPU or a GPU, clocks.py a GPU's clocks, drift.py (in simulate/) what a machine whose speed drifts
needs on top.
"""
