"""`dllm-bench models similarity`: how closely a CPU scale model keeps LLaDA-8B's serving ratios
(docs/SCALING.md). Above checkpoints/ and serve/: it reads their model and serve presets."""
