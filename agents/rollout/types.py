"""What samplers hand to trainers: token-level trajectories, and the trees they came from."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Union

from treegym.envs.core import Snapshot
from treegym.errors import ConfigError

# What a rollout starts from: reset options (``{"task_id": ..., "seed": ...}``), a seed, or None.
Prompt = Union[dict[str, Any], int, None]


def reset_args(prompt: Prompt) -> tuple[int | None, dict[str, Any] | None]:
    """A prompt as ``env.reset``'s (seed, options): the one place a prompt is read."""
    if prompt is None:
        return None, None
    if isinstance(prompt, bool) or not isinstance(prompt, (int, dict)):
        raise ConfigError(f"a prompt is reset options (dict), a seed (int) or None; got {type(prompt).__name__}")
    if isinstance(prompt, int):
        return prompt, None
    options = dict(prompt)
    seed = options.pop("seed", None)
    return seed, options


@dataclass
class Turn:
    """One agent turn: the action the model sampled and the observation the env returned."""

    action_ids: list[int]
    action_logprobs: list[float]  # behaviour log-probs, one per action token
    obs_ids: list[int]  # masked out of every loss
    action_text: str
    obs_text: str
    snapshot: Snapshot | None  # env state after this turn (where a branch may fork)
    invalid: bool = False
    tool_calls: int = 0
    reward: float = 0.0  # the env's reward for this step
    terminated: bool = False
    truncated: bool = False  # by the env's turn budget, or the sampler's max_turns / context cap
    finish_reason: str = "stop"  # the Generation's: "stop", or "length" (cut at max_new_tokens)
    info: dict[str, Any] = field(default_factory=dict)  # the env's step info
    action_key: str = ""  # the env's key of the move (``ForkableEnv.action_key``): siblings differ by it


@dataclass
class Node:
    """A node of a rollout tree. The root (turn None) is the prompt; every other node is a turn."""

    node_id: int
    parent: int | None
    depth: int
    turn: Turn | None
    terminal: bool = False
    reward: float | None = None  # set on terminal nodes: sum of step rewards on its path
    children: list[int] = field(default_factory=list)
    round: int = 0  # 0: the initial chains; r: grown by expansion round r


@dataclass
class Tree:
    """One rollout tree for one prompt. A chain (GRPO) is a tree whose root has G children."""

    prompt_index: int
    tree_index: int
    prompt_ids: list[int]
    nodes: list[Node]
    kept_leaves: list[int] = field(default_factory=list)  # leaves turned into Rollouts
    expanded: list[int] = field(default_factory=list)  # nodes chosen for expansion, in order
    prompt_text: str = ""  # the env's opening observation
    info: dict[str, Any] = field(default_factory=dict)  # the env's reset info

    def leaves(self) -> list[int]:
        """Node ids of every finished node (terminal or truncated), kept or not."""
        return [n.node_id for n in self.nodes if n.terminal]

    def path(self, leaf: int) -> list[int]:
        """Node ids from the root's first child down to ``leaf``."""
        out = []
        node = self.nodes[leaf]
        while node.parent is not None:
            out.append(node.node_id)
            node = self.nodes[node.parent]
        return out[::-1]


@dataclass
class Rollout:
    """One root-to-leaf trajectory, flattened into tokens for the loss."""

    prompt_index: int
    tree_index: int
    leaf: int  # node id of the leaf in its tree
    node_path: list[int]  # node ids of its turns, in order
    token_ids: list[int]  # prompt + (action + observation) per turn
    loss_mask: list[int]  # 1 on action tokens, 0 on prompt and observation tokens
    behaviour_logprobs: list[float]  # per token; 0.0 where loss_mask is 0
    turn_of_token: list[int]  # index into node_path for action tokens, -1 elsewhere
    reward: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Budget:
    """What one sampling batch cost."""

    generated_tokens: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0
    tool_calls: int = 0
    trajectories: int = 0
    env_steps: int = 0
    tool_rounds: int = 0  # pool steps that made at least one tool call (their calls run concurrently)
    resampled: int = 0  # first turns (or beginnings) drawn again to differ from a sibling's (``distinct*``)

    def __add__(self, other: Budget) -> Budget:
        """What both batches cost together: each counter summed."""
        return Budget(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


@dataclass
class RolloutBatch:
    """A sampler's output: the kept trajectories, their trees, and the cost."""

    rollouts: list[Rollout]
    trees: list[Tree]
    budget: Budget
