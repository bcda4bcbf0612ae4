"""GSM8K-style answer extraction and exact-match, reproducing lm-eval 0.4.13 exactly.

Source of every constant: lm-eval 0.4.13 `lm_eval/tasks/gsm8k/gsm8k.yaml` (filters, metric kwargs),
`lm_eval/filters/extraction.py::RegexFilter` (findall, group_select, first non-empty group of a
tuple match, strip, fallback "[invalid]") and `lm_eval/api/metrics.py::exact_match_hf_evaluate`
(regexes removed from both sides in order, then lower-casing; ignore_punctuation is false).
Re-implemented here (not imported) so the CLI harness scores without importing lm-eval, while the
lm-eval tasks in dllm_bench/accuracy/lm_eval_tasks use lm-eval's own filters; a test pins the two together.
The synthetic task (workloads.tasks.synth) uses the same answer format and therefore the same scoring.
"""
from __future__ import annotations

import re

STRICT_PATTERN = r"#### (\-?[0-9\.\,]+)"             # strict-match: needs the GSM8K answer line
FLEXIBLE_PATTERN = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"     # flexible-extract: any number, last one wins
FALLBACK = "[invalid]"                                # RegexFilter's default when nothing matches
REGEXES_TO_IGNORE = (",", "\\$", "(?s).*#### ", "\\.$")  # applied in this order to both sides
IGNORE_CASE = True
IGNORE_PUNCTUATION = False
FILTERS = ("strict-match", "flexible-extract")

_STRICT = re.compile(STRICT_PATTERN)
_FLEXIBLE = re.compile(FLEXIBLE_PATTERN)


def _regex_filter(text: str, regex: re.Pattern, group_select: int) -> str:
    """RegexFilter.apply for one response, then take_first (a no-op for one response)."""
    if not isinstance(text, str):
        text = ""
    matches = regex.findall(text)
    if not matches:
        return FALLBACK
    match = matches[group_select]
    if isinstance(match, tuple):                     # several groups: the first non-empty one
        nonempty = [m for m in match if m]
        match = nonempty[0] if nonempty else FALLBACK
    return match.strip()


def extract_strict(text: str) -> str:
    """First `#### N` number (raw, e.g. "1,234"), or "[invalid]"."""
    return _regex_filter(text, _STRICT, 0)


def extract_flexible(text: str) -> str:
    """Last number-like span (raw, e.g. "$18."), or "[invalid]"."""
    return _regex_filter(text, _FLEXIBLE, -1)


def extract(text: str, filter_name: str) -> str:
    if filter_name == "strict-match":
        return extract_strict(text)
    if filter_name == "flexible-extract":
        return extract_flexible(text)
    raise ValueError(f"unknown filter {filter_name!r}; expected one of {FILTERS}")


def normalize(s: str) -> str:
    """exact_match's normalisation: drop ",", "$", everything up to "#### ", a trailing "."; lower."""
    for rx in REGEXES_TO_IGNORE:
        s = re.sub(rx, "", s)
    return s.lower() if IGNORE_CASE else s


def exact_match(prediction: str, reference: str) -> float:
    """1.0 if equal after normalisation. `reference` may be a full GSM8K answer ("... #### 18")."""
    return float(normalize(prediction) == normalize(reference))


def score_gsm8k(completion: str, reference: str) -> dict[str, float]:
    """Both lm-eval GSM8K scores of one completion: {"strict-match": 0/1, "flexible-extract": 0/1}.

    `reference` is the doc's full answer (lm-eval's doc_to_target "{{answer}}") or just its number.
    """
    return {f: exact_match(extract(completion, f), reference) for f in FILTERS}


def aggregate(scores: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each filter's score over a list of `score_gsm8k` results (0.0 for an empty list)."""
    n = len(scores)
    return {f: (sum(s[f] for s in scores) / n if n else 0.0) for f in FILTERS}
