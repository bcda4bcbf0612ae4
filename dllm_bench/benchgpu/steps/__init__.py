"""The steps of `bench-gpu`, one module each: `estimate(bench)` says how long it should take,
`run(bench, record)` runs its sub-commands and fills its record (dllm_bench.benchgpu.record)."""
