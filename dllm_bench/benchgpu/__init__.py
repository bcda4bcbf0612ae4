"""`dllm-bench bench-gpu`: the one run to make on a CUDA machine (docs/GPU.md, "bench-gpu").

It makes the random-weight LLaDA-8B checkpoint, then runs `doctor`, `serve` at saturation on
the whole GPU and at the RTX 4090's budget and the engine's step profile (the baselines' profiles
and the memory report when --only names them), each as a
`dllm-bench` sub-command in its own process (a crash stays in its step), and writes one results
directory whose summary.md sets every goal of the engine on a GPU beside its measured value.

scale.py (the sizes of a run, GPU or CPU), estimate.py (each step's time, the prompt count that
fits the budget), subcommand.py (one sub-command run), record.py (a step's outcome, bench.json),
plan.py (the steps in order, --only), steps/ (one file per step), derive.py (figures from the
points), goals.py (the goals and their verdicts), summary.py (summary.md), run.py (the run).
"""
