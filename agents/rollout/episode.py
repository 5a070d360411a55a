"""Driving one text agent through one episode: ``run_episode(env, agent) -> Episode``.

The agent sees the chat so far (the env's prompt as the first user message, its own actions
as assistant turns, observations as user turns) and returns its next action. An agent that
raises does not crash the caller: the episode ends there and ``Episode.error`` says what
happened, with the episode id, so an evaluation can report it and go on.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from treegym.agents.base import AgentLike, Message, as_agent, begin


@dataclass(frozen=True)
class Episode:
    """What happened in one episode.

    reward: the sum of the env's step rewards. turns: actions taken. tool_calls: tool calls
    those actions made. invalid: per action, whether the env could not parse it
    (``info["invalid_action"]``). info: the env's info after the last step (after reset if none).
    error: ``None``, or the agent's (or env's) exception as ``"episode ID: Type: message"``.
    """

    episode_id: str
    messages: list[Message]
    reward: float
    turns: int
    tool_calls: int
    info: dict[str, Any]
    error: str | None = None
    terminated: bool = False
    truncated: bool = False
    traceback: str | None = field(default=None, repr=False)
    invalid: tuple[bool, ...] = ()


def run_episode(
    env: gym.Env,
    agent: AgentLike,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    max_turns: int | None = None,
    episode_id: str | None = None,
) -> Episode:
    """Reset ``env`` and let ``agent`` act until the episode ends (or ``max_turns`` actions).

    ``agent`` is anything with ``act(messages) -> str`` or a plain callable; its optional
    ``begin(info)`` hook gets the reset info. Each action goes through ``env.step``, wrappers
    included; tool calls are read from the env's cumulative ``info["tool_calls"]`` (a key every
    treegym env keeps).
    """
    eid = episode_id if episode_id is not None else (f"seed={seed}" if options is None else f"seed={seed} options={options}")
    messages: list[Message] = []
    reward, turns, tool_calls = 0.0, 0, 0
    invalid: list[bool] = []
    info: dict[str, Any] = {}
    terminated = truncated = False
    try:
        actor = as_agent(agent)
        obs, info = env.reset(seed=seed, options=options)
        messages.append({"role": "user", "content": obs})
        begin(actor, dict(info))
        while not (terminated or truncated) and (max_turns is None or turns < max_turns):
            action = actor.act([dict(m) for m in messages])
            if not isinstance(action, str):
                raise TypeError(f"the agent returned {type(action).__name__}, not a string")
            messages.append({"role": "assistant", "content": action})
            obs, r, terminated, truncated, info = env.step(action)
            tool_calls = int(info.get("tool_calls", tool_calls))
            turns += 1
            invalid.append(bool(info.get("invalid_action", False)))
            reward += float(r)
            if obs or not (terminated or truncated):
                messages.append({"role": "user", "content": obs})
    except Exception as exc:  # an agent's failure is this episode's result, not the caller's crash
        return Episode(eid, messages, reward, turns, tool_calls, dict(info),
                       error=f"episode {eid}: {type(exc).__name__}: {exc}",
                       terminated=terminated, truncated=truncated, traceback=traceback.format_exc(),
                       invalid=tuple(invalid))
    return Episode(eid, messages, reward, turns, tool_calls, dict(info), None, terminated, truncated,
                   invalid=tuple(invalid))
