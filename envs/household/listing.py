"""The admissible-commands observation (``TextHousehold-v0(list_admissible=True)``): verl-agent's
layout, with the list capped for context.

verl-agent prompts ALFWorld agents with the task, the current observation and "Your admissible
actions of the current situation are: [...]" on every turn. treegym's contexts grow turn by
turn (branches share their prefix), and a full list costs 79-310 SmolLM2 tokens a turn (median
181; 24 commands, 18 of them ``go to``), so 10 turns of it would not fit a 2-core budget. The
list is therefore capped: all of it when it fits in ``max_tokens`` tokens, else the ``top_n``
most relevant commands, in order of relevance (``rank_commands``). Commands left off stay
admissible: the cap shortens what is shown, never what can be done.
"""

from __future__ import annotations

from collections.abc import Sequence

from treegym.envs.household.catalogue import CAN_CONTAIN

HEADER = "Your admissible actions of the current situation are: "
# SmolLM2's tokenizer averages about 3 characters per token on these lists ("go to cabinet 1" is
# 5 tokens for 15 characters; a whole list of 24 commands, 181 tokens for 531 characters).
CHARS_PER_TOKEN = 3
# The treatment a task type needs, and the receptacle kind that performs it.
APPLIANCE = {"pick_clean_then_place_in_recep": "sinkbasin", "pick_heat_then_place_in_recep": "microwave",
             "pick_cool_then_place_in_recep": "fridge"}


def _kind(name: str) -> str:
    return name.rsplit(" ", 1)[0]


def _number(name: str) -> int:
    tail = name.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def rank_commands(commands: Sequence[str], task_type: str, obj: str, target: str) -> list[str]:
    """``commands`` from most to least relevant to the task (move ``obj`` to ``target``, with the
    treatment ``task_type`` asks for).

    1. Commands that name the goal object (take, move, heat / clean / cool, examine it).
    2. Commands on what is here that are not about another object: open, close, use.
    3. ``go to`` a receptacle the task names (its target), the appliance its treatment needs, or
       one that can hold the goal object (ALFRED's object-receptacle table, the catalogue).
    4. Every other ``go to``.
    5. The rest: take / move / treat another object, examine a receptacle, look, inventory, help.

    Within a group, number 1 of every kind comes first, then the 2s, ... (so a cut list still
    shows every kind), and kinds in name order.
    """
    places = {target, APPLIANCE.get(task_type, "")}

    def group(cmd: str) -> int:
        words = cmd.split()
        if obj in words:
            return 0
        if words[0] in ("open", "close", "use"):
            return 1
        if cmd.startswith("go to "):
            kind = _kind(cmd[6:])
            return 2 if kind in places or obj in CAN_CONTAIN.get(kind, ()) else 3
        return 4

    def key(cmd: str) -> tuple[int, int, str]:
        return group(cmd), _number(cmd), cmd

    return sorted(commands, key=key)


def estimated_tokens(text: str) -> int:
    """A tokenizer-free estimate of ``text``'s length in tokens (``CHARS_PER_TOKEN``)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def listed_commands(commands: Sequence[str], task_type: str, obj: str, target: str, top_n: int, max_tokens: int) -> list[str]:
    """What the observation lists: every command, most relevant first, when the list fits in
    ``max_tokens`` (estimated); else the ``top_n`` most relevant."""
    ranked = rank_commands([c for c in commands if c != "help"], task_type, obj, target)
    if estimated_tokens(actions_line(ranked)) <= max_tokens:
        return ranked
    return ranked[:top_n]


def actions_line(listed: Sequence[str]) -> str:
    """``Your admissible actions of the current situation are: [a, b, c].``"""
    return f"{HEADER}[{', '.join(listed)}]."


def observation(task: str, feedback: str, listed: Sequence[str]) -> str:
    """A step's observation in verl-agent's layout: the task, what the step said, the list."""
    return f"Your task is to: {task}.\n{feedback}\n{actions_line(listed)}"


def split_observation(text: str) -> tuple[str, list[str] | None]:
    """(the feedback, the listed commands) of an observation; (``text``, None) for one in the
    plain layout (ALFWorld's own text)."""
    head, sep, tail = text.rpartition("\n" + HEADER)
    if not sep:
        if text.startswith(HEADER):
            head, tail = "", text[len(HEADER):]
        else:
            return text, None
    inner = tail.strip().removesuffix(".").strip()
    inner = inner[1:-1] if inner.startswith("[") and inner.endswith("]") else inner
    listed = [c.strip() for c in inner.split(", ") if c.strip()]
    if head.startswith("Your task is to: "):
        head = head.split("\n", 1)[1] if "\n" in head else ""
    return head, listed
