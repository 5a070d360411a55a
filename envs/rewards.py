"""Answer scoring shared by the QA environments: SQuAD-normalised EM and F1, and format scores."""

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


# Tree-GRPO's format-score table: (answer correct?, format valid?) -> reward.
# "none" means the episode ended without an answer.
FORMAT_TABLE = {
    ("correct", True): 1.0,
    ("correct", False): 0.8,
    ("wrong", True): 0.2,
    ("wrong", False): 0.1,
    ("none", True): 0.2,
    ("none", False): 0.0,
}


def format_reward(answered: bool, correct: bool, format_valid: bool) -> float:
    """Reward from Tree-GRPO's format-score table."""
    outcome = "correct" if answered and correct else ("wrong" if answered else "none")
    return FORMAT_TABLE[(outcome, format_valid)]


def qa_reward(
    answer: str | None, answers: Iterable[str], format_valid: bool, kind: str = "em", format_score: bool = False
) -> tuple[float, float, float]:
    """(reward, em, f1) of an episode's end: ``answer`` is None when it ended without one.

    ``kind`` picks EM or F1 as the reward; ``format_score`` uses Tree-GRPO's table instead.
    """
    answers = list(answers)
    em = exact_match(answer, answers) if answer is not None else 0.0
    f1 = f1_score(answer, answers) if answer is not None else 0.0
    if format_score:
        return format_reward(answer is not None, em == 1.0, format_valid), em, f1
    if answer is None:
        return 0.0, em, f1
    return (em if kind == "em" else f1), em, f1
