"""Tensor parallelism: one engine over N devices (or N CPU processes) on torch.distributed (docs/PARALLEL.md)."""
