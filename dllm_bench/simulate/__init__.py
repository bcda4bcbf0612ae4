"""`dllm-bench simulate` / `calibrate`: the real schedulers on a virtual clock with a cost model as
the forward (docs/SIMULATE.md)."""
