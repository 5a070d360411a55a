"""Rollouts: a policy or a text agent acting in forked envs. No gradients live here, so eval, the
tree view, SFT and every trainer share it.

- ``types``: ``Tree``/``Node``/``Turn``/``Rollout``, plain dataclasses;
- ``context``: the token context a policy continues from (chat or plain);
- ``samplers``: the chain sampler (GRPO) and the tree sampler (Tree-GRPO's m, n, l, k, the
  branching rule and distinct sibling branches), which grow trees by forking envs at nodes;
- ``branching``: branching rules, plain functions from the forest grown so far to the nodes to
  fork next, registered by name (the reference, pivot, restart at failure, ...);
- ``episode``: ``run_episode``, a text agent driven through the env's own step.
"""

from treegym.agents.rollout.episode import Episode, run_episode
from treegym.agents.rollout.samplers import sample_chains, sample_trees, to_rollout
from treegym.agents.rollout.types import Budget, Node, Prompt, Rollout, RolloutBatch, Tree, Turn, reset_args

__all__ = ["Budget", "Episode", "Node", "Prompt", "Rollout", "RolloutBatch", "Tree", "Turn",
           "reset_args", "run_episode", "sample_chains", "sample_trees", "to_rollout"]
