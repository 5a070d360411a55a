"""QA answer scoring: SQuAD-normalised exact match and token F1. These describe QA data (every
dataset in ``qa.py`` is scored this way), so they live beside ``QAItem``; the envs' reward table
is in ``envs/rewards.py``."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and articles, fold white space."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def f1_score(prediction: str, answers: Iterable[str]) -> float:
    """Best token-level F1 of the prediction against any answer."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for answer in answers:
        gold_tokens = normalize_answer(answer).split()
        common = Counter(pred_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision = overlap / len(pred_tokens)
        recall = overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
