"""`dllm-bench simulate --paper`: the paper's serving experiments replayed at their scale
(LLaDA-8B by shape on the L40S / RTX 4090 profiles), published vs simulated with the error of
each cell. ONE scalar, a common efficiency u multiplying the profile's compute and bandwidth
rates, is fitted on ONE published point (dLLM-Serve's L40S Burst throughput) and used for every
other cell, the RTX 4090 included. Inputs the paper does not give are declared, not fitted: prompt
lengths (our dataset length models), the baselines' static batch (batch 1, what the pinned
upstream code runs, and the largest that fits the memory model), the engine's memory utilisation
(0.9); a user can declare other prompt lengths and batches (--paper-prompt-len, --paper-batch).

published.py  the published numbers     setting.py  the setting, declared inputs, the fit of u
tables.py     Table 4, Figures 3/7/8     checks.py   leave-one-out over the fit point; system ordering
replay.py     the command's output
"""
