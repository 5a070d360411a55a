"""aviary/ldp adapter: any treegym env as an aviary ``Environment``, and ``fork`` as ldp's ``env_clone_fn``.

ldp's ``TreeSearchRollout(agent, branching_factor, env_clone_fn)`` grows a tree by calling
``env_clone_fn(env)`` once per child of every node and stepping the clone; it leaves the clone
to the user (its own tests pass ``copy.deepcopy``). ``fork`` here is that function for a treegym
env: ``treegym.envs.fork`` of the episode, O(state), sharing the env's backends (index, HTTP
cache, world templates) and nothing mutable, so a step in one branch never shows in another.

- ``reset()``: the env's opening prompt as a user message, and one tool, ``step(action)``: one
  turn in the env's own protocol (``<search>q</search>``, ``<answer>a</answer>``, a household
  command), as the TRL adapter's ``TRLEnv`` does.
- ``step(ToolRequestMessage)``: runs the tool calls in order; the reward is what the env paid
  for them; ``done`` is terminated or truncated, ``truncated`` gymnasium's.
- ``step_call``: lmi's ``tool_parser`` for a model that answers in plain text, so that ldp's own
  ``SimpleAgent`` can drive the env through a local OpenAI-compatible server.
- ``close()`` frees nothing: ldp closes the root env right after its reset, before the clones
  step, and a treegym episode holds no resource of its own (the backends are shared).

Needs ``pip install 'treegym[ldp]'`` (ldp and fhaviary).
"""

# No `from __future__ import annotations`: aviary's Tool.from_function reads the tool's annotations as types.

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from treegym.envs import base_env, make, public_info
from treegym.envs import fork as fork_env
from treegym.errors import MissingPackageError

# aviary imports litellm, which fetches a price list from GitHub at import unless told not to:
# an env adapter makes no network call of its own.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
try:
    from aviary.core import Environment, Frame, Message, Messages, Tool, ToolCall, ToolRequestMessage
except ImportError:
    raise MissingPackageError("fhaviary", "treegym's aviary/ldp adapter", "pip install 'treegym[ldp]'") from None

ENDED = "The episode has ended."


@dataclass
class EpisodeState:
    """The episode an aviary env drives: the treegym env, its rewards so far, and how it ended."""

    env: gym.Env
    rewards: tuple[float, ...] = ()
    done: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return len(self.rewards)

    @property
    def episode_return(self) -> float:
        return sum(self.rewards)

    def fork(self) -> "EpisodeState":
        return dataclasses.replace(self, env=fork_env(self.env), info=dict(self.info))


def step(action: str, state: EpisodeState) -> str:
    """Take one turn in the environment and return what it shows next.

    Args:
        action: your whole turn, written as the task's instructions ask, e.g. a search or an answer in their tags, or a household command.
    """
    if state.done:
        return ENDED
    obs, reward, terminated, truncated, info = state.env.step(action)
    state.rewards += (float(reward),)
    state.done, state.truncated = bool(terminated or truncated), bool(truncated)
    state.info = public_info(state.env, info)
    return obs


STEP_TOOL = Tool.from_function(step)  # one value, shared by every env and clone


class TreegymEnvironment(Environment[EpisodeState]):
    """One treegym episode as an aviary ``Environment``; ``fork()`` (or this module's ``fork``)
    is ldp's clone function for it."""

    def __init__(self, env: gym.Env, task_id: str | None = None, seed: int | None = None) -> None:
        base_env(env)  # a NotForkableError now, not at the first clone
        self.task_id, self.seed = task_id, seed
        self.tools = [STEP_TOOL]
        self.state = EpisodeState(env=env)

    @classmethod
    def from_id(cls, env_id: str, split: str | None = None, *, task_id: str | None = None, seed: int | None = None,
                **env_kwargs: Any) -> "TreegymEnvironment":
        """An aviary env over ``treegym.envs.make(env_id, split, **env_kwargs)`` on one task or seed."""
        return cls(make(env_id, split, **env_kwargs), task_id=task_id, seed=seed)

    async def reset(self) -> tuple[Messages, list[Tool]]:
        options = None if self.task_id is None else {"task_id": self.task_id}
        obs, info = self.state.env.reset(seed=self.seed, options=options)
        self.state = EpisodeState(env=self.state.env, info=public_info(self.state.env, info))
        return [Message(content=obs)], self.tools

    async def step(self, action: Message) -> tuple[Messages, float, bool, bool]:
        if not isinstance(action, ToolRequestMessage):
            return self.default_no_tool_calls_response
        before = self.state.turns
        # In order: each call is a turn of one episode.
        responses = await self.exec_tool_calls(action, state=self.state, concurrency=False, handle_tool_exc=True)
        return list(responses), sum(self.state.rewards[before:]), self.state.done, self.state.truncated

    async def get_id(self) -> str:
        env_id = getattr(self.state.env.spec, "id", None) or type(base_env(self.state.env)).__name__
        return f"{env_id}:{self.task_id if self.task_id is not None else self.seed}"

    def export_frame(self) -> Frame:
        return Frame(state={"turns": self.state.turns, "return": self.state.episode_return, "done": self.state.done},
                     info=self.state.info)

    async def close(self) -> None:
        """Nothing to free; see the module docstring for why the env stays usable."""

    def fork(self) -> "TreegymEnvironment":
        """An independent env in this one's state: the treegym env forked, the tools shared."""
        new = object.__new__(type(self))
        new.__dict__ = {**self.__dict__, "state": self.state.fork()}
        return new


def step_call(completion: str, tools: list[dict] | None = None) -> ToolRequestMessage:
    """An lmi ``tool_parser`` for a model that answers in plain text (``treegym serve-model``, a model
    trained on treegym's own protocol): its whole reply is one ``step`` call, so ldp's ``SimpleAgent``
    drives the env with ``LLMConfig(models=[...], tool_parser=step_call)``."""
    return ToolRequestMessage(content=completion, tool_calls=[ToolCall.from_name("step", action=completion)])


def fork(env: TreegymEnvironment) -> TreegymEnvironment:
    """ldp's ``env_clone_fn`` for a treegym env: ``TreeSearchRollout(agent, n, env_clone_fn=fork)``."""
    return env.fork()


__all__ = ["ENDED", "EpisodeState", "TreegymEnvironment", "fork", "step", "step_call"]
