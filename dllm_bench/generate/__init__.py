"""`dllm-bench generate`: prompts decoded by one system in this process (dllm_bench.generate.run)."""
