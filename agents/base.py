"""The agent protocol: anything that maps a chat history to its next turn.

A third-party agent is an object with ``act(messages) -> str`` or a plain callable with the
same signature. ``messages`` is the chat so far: the env's opening prompt as the first
``user`` message, then alternating ``assistant`` turns (the agent's actions) and ``user``
turns (the env's observations). An agent that wants to see the task's ``info`` (oracles do)
may also define ``begin(info)``, which is called once after each reset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, Union, runtime_checkable

Message = dict[str, str]


@runtime_checkable
class Agent(Protocol):
    def act(self, messages: list[Message]) -> str: ...


AgentLike = Union[Agent, Callable[[list[Message]], str]]


def as_agent(obj: AgentLike) -> Agent:
    """Accept an Agent or a plain callable."""
    if isinstance(obj, Agent):
        return obj
    if callable(obj):
        return _CallableAgent(obj)
    raise TypeError(f"an agent needs act(messages) -> str or must be callable; got {type(obj).__name__}")


class _CallableAgent:
    def __init__(self, fn: Callable[[list[Message]], str]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "agent")

    def act(self, messages: list[Message]) -> str:
        return self.fn(messages)


def begin(agent: Any, info: dict[str, Any]) -> None:
    """Call the agent's optional ``begin(info)`` hook."""
    hook = getattr(agent, "begin", None)
    if callable(hook):
        hook(info)
