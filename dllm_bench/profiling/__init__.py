"""`dllm-bench profile`: the offline profiler's KV-pool sizing, measured or planned (run.py), and its tables."""
