"""`dllm-bench memory` (docs/MEMORY.md): the longest canvas each system runs within a memory
budget (search.py over trace.py's measured requests), the memory over one request's steps
(trace.py, output.py), and the measured bytes carried to LLaDA-8B's shape (derive.py)."""
