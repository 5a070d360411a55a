"""The ReAct text protocol of Search-R1 / Tree-GRPO: parsing actions, formatting results.

An action is the model's whole turn, e.g. ``<think>…</think><search>query</search>``. The
first complete tool tag decides what the turn does; reasoning in ``<think>`` is optional for
the env but counts toward the format score.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from treegym.retrieval_index.types import Hit, clean_text

# Search-R1's message for a turn with no usable tag, verbatim so that its checkpoints carry over.
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)


_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


@dataclass(frozen=True)
class ParsedAction:
    """What a turn asks for. ``kind`` is a tool tag, or ``"invalid"`` with ``error`` saying why."""

    kind: str
    argument: str = ""
    error: str | None = None
    well_formed: bool = False  # reasoning in <think> first, then exactly one tool tag


def parse_action(text: object, tags: Sequence[str] = ("search", "answer"), max_chars: int = 16384) -> ParsedAction:
    """Parse one turn. Never raises: anything unusable is an ``invalid`` action with a reason."""
    if not isinstance(text, str):
        return ParsedAction("invalid", error=f"an action must be text, got {type(text).__name__}")
    if len(text) > max_chars:
        return ParsedAction("invalid", error=f"the action is {len(text)} characters long; the limit is {max_chars}")
    text = clean_text(text)
    alternatives = "|".join(re.escape(t) for t in tags)
    match = re.search(rf"<({alternatives})>(.*?)</\1>", text, re.DOTALL)
    if match is None:
        return ParsedAction("invalid", error="no complete " + " or ".join(f"<{t}>…</{t}>" for t in tags) + " tag")
    kind, argument = match.group(1), match.group(2).strip()
    if re.search(rf"</?({alternatives})>", argument):
        return ParsedAction("invalid", error=f"tags nested inside <{kind}>")
    if not argument:
        return ParsedAction("invalid", error=f"empty <{kind}> tag")
    tool_tags = re.findall(rf"<({alternatives})>", text)
    think = _THINK.search(text)
    well_formed = len(tool_tags) == 1 and think is not None and think.end() <= match.start()
    return ParsedAction(kind, argument, None, well_formed)


def format_information(hits: Sequence[Hit]) -> str:
    """Search-R1's result block: ``Doc i(Title: t) text`` lines inside ``<information>``."""
    lines = [f"Doc {i}(Title: {hit.title}) {hit.text}" for i, hit in enumerate(hits, 1)]
    return "\n\n<information>" + "\n".join(lines) + "</information>\n\n"
