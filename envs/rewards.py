"""The QA envs' reward: EM or F1 (``retrieval_index.scoring``), or Tree-GRPO's format-score table."""

from __future__ import annotations

from collections.abc import Iterable

from treegym.retrieval_index.scoring import exact_match, f1_score

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
