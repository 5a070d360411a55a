"""From an agent's turn to a command, and the opening prompt.

An action is either a bare command (``go to cabinet 1``) or the ReAct form that agent-RL
codebases use (``<think>...</think><action>go to cabinet 1</action>``). ALFWorld's
``put X in/on Y`` is accepted as a synonym of ``move X to Y``.
"""

from __future__ import annotations

import re

# Longer actions are never a command; cut early so that a 1 MB turn costs microseconds.
MAX_COMMAND_CHARS = 200
_PUT_RE = re.compile(r"^put (.+?) (?:in|on|in/on|into|onto) (.+)$")

INSTRUCTIONS = (
    "You are in a household. Interact with it to solve the task. Each turn, reply with one command, "
    "either bare or as <think>your reasoning</think><action>command</action>. Commands: look, inventory, "
    "go to (receptacle), open (receptacle), close (receptacle), take (object) from (receptacle), "
    "move (object) to (receptacle), examine (something), use (object), heat (object) with (receptacle), "
    "clean (object) with (receptacle), cool (object) with (receptacle), help."
)


def extract_command(action: str) -> str:
    """The command inside an agent's turn, normalised (lower case, single spaces); may be ''."""
    if not isinstance(action, str):
        return ""
    if "<" in action:
        text = _strip_markup(action)
    else:
        text = action
    text = text.strip()
    if len(text) > MAX_COMMAND_CHARS:
        return ""
    cmd = " ".join(text.lower().split())
    cmd = cmd.rstrip(".!,;").rstrip()
    m = _PUT_RE.match(cmd)
    if m:
        cmd = f"move {m.group(1)} to {m.group(2)}"
    return cmd


def _strip_markup(action: str) -> str:
    """The last ``<action>`` block, else the text outside ``<think>`` blocks (linear time)."""
    low = action.lower()
    # The last <action> block wins: models sometimes restate a draft first.
    start = low.rfind("<action>")
    if start >= 0:
        end = low.find("</action>", start)
        return action[start + 8 : end if end >= 0 else len(action)]
    parts, pos = [], 0
    while True:
        open_ = low.find("<think>", pos)
        if open_ < 0:
            parts.append(action[pos:])
            return " ".join(parts)
        parts.append(action[pos:open_])
        close = low.find("</think>", open_)
        if close < 0:
            return " ".join(parts)
        pos = close + 8


def opening_prompt(intro: str) -> str:
    """The whole first observation: instructions, then ALFWorld's intro text with the task."""
    return f"{INSTRUCTIONS}\n\n{intro}"
