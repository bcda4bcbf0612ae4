"""`dllm-bench frontier`: speed and quality of each (system, decoding policy) on one plot
(docs/FRONTIER.md). configs: the configurations; measure: one configuration on one model at a
fixed concurrency (accuracy and throughput from the same requests); pareto: the front and the
goals' verdicts; output: table, plot, Markdown; run: the command's run."""
