"""Rollout samplers: GRPO chains and Tree-GRPO agent-step trees, token-level, batched.

Both samplers grow trees whose nodes are agent turns. A *branch* is a running episode: an env
(a fork), the node its next turn hangs from, and its token context. Every step of the loop
runs one ``policy.generate`` over all active branches of all prompts and one ``EnvPool.step``
over their envs (one batched call per shared tool), until every branch has finished.

- ``sample_chains``: G branches from each prompt's root, grown independently (GRPO).
- ``sample_trees``: Tree-GRPO (arXiv 2509.21240). m trees per prompt, each started with one
  chain; then l rounds, in each of which n nodes per tree are chosen, the env is forked at
  each chosen node (``fork`` + ``restore(snapshot)``, never a replay of tool calls) and a new
  branch continues from that node's context to a leaf; finally k leaves per tree are kept.

Which nodes a round expands is a *branching rule* (``branching.py``): a plain function from the
forest grown so far to the nodes to fork, registered by name; the reference's uniform choice is
one of them. ``distinct=d`` makes sibling branches begin differently: the first d tokens of a
branch's first turn are resampled (up to ``distinct_retries`` times) while they repeat those of
a sibling at the same node, then the turn is continued from them (LATR's forced diversity).
With ``distinct_exclude``, a beginning that still repeats is drawn once more from the policy
with its siblings' first tokens excluded (sampling without replacement), so siblings differ
even where the policy is nearly deterministic: a collapsed policy's branches try the other
move. Resampling and exclusion change the distribution the first tokens are drawn from; the
recorded log-probs stay the policy's own, as in LATR.

Leaves kept: when a tree has more than k leaves, k are drawn uniformly without replacement
(seeded), so no leaf is favoured for being the initial chain or a late expansion; when it has
k or fewer, all are kept.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import gymnasium as gym

from treegym.agents.policy import Policy, SamplingParams
from treegym.agents.rollout.branching import BranchRule, Forest, candidates, get_rule
from treegym.agents.rollout.context import Mode, TokenContext, make_context
from treegym.agents.rollout.distinct import distinct_action_turns, distinct_first_turns
from treegym.agents.rollout.types import Budget, Node, Prompt, Rollout, RolloutBatch, Tree, Turn, reset_args
from treegym.envs.core import ForkableEnv, Snapshot, base_env
from treegym.envs.pool import EnvPool
from treegym.errors import ConfigError

EnvSource = Union[Callable[[], gym.Env], gym.Env]


@dataclass
class _Branch:
    """A running episode: where its next turn attaches, its env and its context."""

    tree: Tree
    parent: int
    env: ForkableEnv
    context: list[int]
    reward: float  # sum of step rewards so far on this path


@dataclass
class _Root:
    """What a tree needs to fork from any of its nodes: an env and the reset snapshot."""

    env: ForkableEnv
    snapshot: Snapshot
    info: dict[str, Any]


class _Sampler:
    """The shared machinery: roots per prompt, the batched grow loop, rollouts, budget."""

    def __init__(self, policy: Policy, make_env: EnvSource, params: SamplingParams, max_turns: int | None,
                 mode: Mode | TokenContext, max_context_tokens: int | None, progress: Any = None) -> None:
        if max_turns is not None and max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
        self.policy = policy
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.ctx = make_context(policy.tokenizer, mode)
        base = make_env() if callable(make_env) and not isinstance(make_env, gym.Env) else make_env
        self.base = base_env(base, bare=True)
        self.params = params.with_stops(self.base.action_stops)  # the env's own turn delimiters end a turn too
        self.pool = EnvPool()
        self.progress = progress
        s = policy.stats
        self._start = (s.generated_tokens, s.prefill_tokens, s.reused_tokens)
        self._pool_start = (self.pool.stats.tool_calls, self.pool.stats.steps, self.pool.stats.tool_rounds)
        self.resampled = 0  # first-turn heads drawn again because a sibling began the same way

    def reset_prompt(self, prompt: Prompt) -> tuple[_Root, str, list[int]]:
        """Reset a fork of the base env on ``prompt``: its root env, prompt text and ids."""
        env = self.base.fork()
        seed, options = reset_args(prompt)
        obs, info = env.reset(seed=seed, options=options)
        return _Root(env, env.snapshot(), dict(info)), obs, self.ctx.prompt_ids(obs)

    def branch_from(self, tree: Tree, root: _Root, node_id: int) -> _Branch:
        """A new branch that continues from ``node_id``: env forked there, context rebuilt."""
        env = root.env.fork()
        context = list(tree.prompt_ids)
        reward = 0.0
        if node_id != 0:
            node = tree.nodes[node_id]
            assert node.turn is not None and node.turn.snapshot is not None
            env.restore(node.turn.snapshot)
            for nid in tree.path(node_id):
                turn = tree.nodes[nid].turn
                assert turn is not None
                context += turn.action_ids + turn.obs_ids
                reward += turn.reward
        return _Branch(tree, node_id, env, context, reward)

    def grow(self, branches: list[_Branch], round_index: int, distinct: int = 0, retries: int = 0,
             exclude: bool = False, actions: bool = False) -> None:
        """Run every branch to a leaf: one generate and one pool step per turn, for all.

        ``actions``: the first turn of each branch makes a move (``ForkableEnv.action_key``) that
        no sibling at its node made, where ``retries`` redraws allow (``distinct.py``).
        ``distinct``: the first turn of each branch begins with ``distinct`` tokens that no
        sibling at its node begins with (resampled up to ``retries`` times, then, with
        ``exclude``, drawn without the siblings' first tokens)."""
        active = list(branches)
        first = distinct > 0 or actions
        while active:
            keys = None
            if first and actions:
                gens, keys, redrawn = distinct_action_turns(self.policy, self.params, active, retries)
                self.resampled += redrawn
            elif first:
                gens, redrawn = distinct_first_turns(self.policy, self.params, active, distinct, retries, exclude)
                self.resampled += redrawn
            else:
                gens = self.policy.generate([b.context for b in active], self.params)
            first = False
            if len(gens) != len(active):
                raise RuntimeError(f"policy returned {len(gens)} generations for {len(active)} contexts")
            if keys is None:  # the move each turn makes, read in the state it is made in
                keys = [b.env.action_key(g.text) for b, g in zip(active, gens)]
            results = self.pool.step([b.env for b in active], [g.text for g in gens])
            still: list[_Branch] = []
            for i, (b, g) in enumerate(zip(active, gens)):
                obs, reward, terminated, truncated, info = results[i]
                parent = b.tree.nodes[b.parent]
                depth = parent.depth + 1
                action_ids = list(g.token_ids)
                capped = not (terminated or truncated) and (
                    (self.max_turns is not None and depth >= self.max_turns)
                    or (self.max_context_tokens is not None
                        and len(b.context) + len(action_ids) + self.params.max_new_tokens > self.max_context_tokens)
                )
                final = terminated or truncated or capped
                obs_ids = self.ctx.observation_ids(obs, action_ids, final=final)
                prev_calls = parent.turn.info.get("tool_calls", 0) if parent.turn else 0
                turn = Turn(
                    action_ids=action_ids,
                    action_logprobs=list(g.logprobs),
                    obs_ids=obs_ids,
                    action_text=g.text,
                    obs_text=obs,
                    snapshot=b.env.snapshot(),
                    invalid=bool(info.get("invalid_action", False)),
                    tool_calls=max(0, int(info.get("tool_calls", prev_calls)) - int(prev_calls)),
                    reward=float(reward),
                    terminated=bool(terminated),
                    truncated=bool(truncated or capped),
                    finish_reason=g.finish_reason,
                    info=dict(info),
                    action_key=keys[i],
                )
                node = Node(node_id=len(b.tree.nodes), parent=b.parent, depth=depth, turn=turn, round=round_index)
                b.tree.nodes.append(node)
                parent.children.append(node.node_id)
                b.parent = node.node_id
                b.reward += float(reward)
                b.context = b.context + action_ids + obs_ids
                if final:
                    node.terminal = True
                    node.reward = b.reward
                else:
                    still.append(b)
            if self.progress is not None:
                self.progress.update(len(active))
            active = still

    def rollouts(self, tree: Tree) -> list[Rollout]:
        return [to_rollout(tree, leaf) for leaf in tree.kept_leaves]

    def budget(self, trajectories: int) -> Budget:
        s = self.policy.stats
        return Budget(
            generated_tokens=s.generated_tokens - self._start[0],
            prefill_tokens=s.prefill_tokens - self._start[1],
            reused_tokens=s.reused_tokens - self._start[2],
            tool_calls=self.pool.stats.tool_calls - self._pool_start[0],
            trajectories=trajectories,
            env_steps=self.pool.stats.steps - self._pool_start[1],
            tool_rounds=self.pool.stats.tool_rounds - self._pool_start[2],
            resampled=self.resampled,
        )


def to_rollout(tree: Tree, leaf: int) -> Rollout:
    """Flatten the path to ``leaf`` into tokens: prompt, then action + observation per turn."""
    path = tree.path(leaf)
    tokens = list(tree.prompt_ids)
    mask = [0] * len(tokens)
    logprobs = [0.0] * len(tokens)
    turn_of_token = [-1] * len(tokens)
    for t, nid in enumerate(path):
        turn = tree.nodes[nid].turn
        assert turn is not None
        tokens += turn.action_ids + turn.obs_ids
        mask += [1] * len(turn.action_ids) + [0] * len(turn.obs_ids)
        logprobs += list(turn.action_logprobs) + [0.0] * len(turn.obs_ids)
        turn_of_token += [t] * len(turn.action_ids) + [-1] * len(turn.obs_ids)
    node = tree.nodes[leaf]
    last = node.turn
    info = dict(last.info) if last is not None else {}
    info["finish_reason"] = last.finish_reason if last is not None else "stop"
    info["truncated"] = last.truncated if last is not None else False
    return Rollout(
        prompt_index=tree.prompt_index,
        tree_index=tree.tree_index,
        leaf=leaf,
        node_path=path,
        token_ids=tokens,
        loss_mask=mask,
        behaviour_logprobs=logprobs,
        turn_of_token=turn_of_token,
        reward=float(node.reward or 0.0),
        info=info,
    )


def sample_chains(
    policy: Policy,
    make_env: EnvSource,
    prompts: Sequence[Prompt],
    group_size: int,
    params: SamplingParams = SamplingParams(),
    max_turns: int | None = None,
    mode: Mode | TokenContext = "chat",
    max_context_tokens: int | None = None,
    progress: Any = None,
) -> RolloutBatch:
    """GRPO sampling: ``group_size`` independent trajectories per prompt.

    Returns one Tree per prompt (its root has ``group_size`` children, one per chain) and one
    Rollout per chain, ordered by prompt then chain. ``make_env`` is called once; every
    prompt and chain runs in a fork of that env, so they share its tools (and their batches).
    """
    if group_size < 1:
        raise ConfigError(f"group_size must be at least 1, got {group_size}")
    sampler = _Sampler(policy, make_env, params, max_turns, mode, max_context_tokens, progress)
    trees, roots = _start_trees(sampler, prompts, 1)
    sampler.grow([sampler.branch_from(t, r, 0) for t, r in zip(trees, roots) for _ in range(group_size)], 0)
    for tree in trees:
        tree.kept_leaves = tree.leaves()
    rollouts = [r for tree in trees for r in sampler.rollouts(tree)]
    return RolloutBatch(rollouts, trees, sampler.budget(len(rollouts)))


def sample_trees(
    policy: Policy,
    make_env: EnvSource,
    prompts: Sequence[Prompt],
    m: int = 2,
    n: int = 2,
    l: int = 1,  # noqa: E741  (the paper's name)
    k: int = 3,
    params: SamplingParams = SamplingParams(),
    expansion: str | BranchRule = "with_replacement",
    max_turns: int | None = None,
    mode: Mode | TokenContext = "chat",
    max_context_tokens: int | None = None,
    seed: int | None = None,
    progress: Any = None,
    distinct: int = 0,
    distinct_retries: int = 4,
    distinct_exclude: bool = False,
    distinct_actions: bool = False,
) -> RolloutBatch:
    """Tree-GRPO's agent-step tree search (see the module docstring).

    Args:
        m: trees per prompt; each starts as one chain from the prompt.
        n: nodes expanded per tree per round, on average: a round may grow n x (trees) branches,
            spread over the forest as the branching rule decides.
        l: expansion rounds; nodes grown in a round are candidates in the next.
        k: leaves kept per tree (all if it has k or fewer; else k drawn uniformly).
        expansion: the branching rule, a name registered in ``branching.RULES``, a
            ``module:function`` spec, or the function itself. ``with_replacement`` draws n
            nodes per tree uniformly from the root plus every unfinished node (the reference
            code's behaviour: one node may be drawn twice and then grows two branches).
        seed: seeds node choice and leaf choice (sampling randomness is the policy's).
        distinct: sibling branches begin with different first ``distinct`` tokens (0 = off),
            resampling a repeated beginning up to ``distinct_retries`` times; with
            ``distinct_exclude``, one still repeated is drawn without its siblings' first tokens.
        distinct_actions: sibling branches make different moves (the env's parsed action, not
            their first token), a repeated first turn drawn again up to ``distinct_retries`` times.

    Returns the trees (all nodes, including leaves that were not kept) and one Rollout per
    kept leaf, ordered by prompt, tree, leaf id.
    """
    for name, value in (("m", m), ("n", n), ("k", k)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    if l < 0:
        raise ConfigError(f"l must be at least 0, got {l}")
    if distinct < 0 or distinct_retries < 0:
        raise ConfigError(f"distinct and distinct_retries must be at least 0, got {distinct}, {distinct_retries}")
    rule = get_rule(expansion)
    rng = random.Random(seed)
    sampler = _Sampler(policy, make_env, params, max_turns, mode, max_context_tokens, progress)
    trees, roots = _start_trees(sampler, prompts, m)
    sampler.grow([sampler.branch_from(t, r, 0) for t, r in zip(trees, roots)], 0)
    for round_index in range(1, l + 1):
        forest = Forest(trees, n, round_index, rng)
        branches = []
        for t, node_id in _checked(rule(forest), forest, expansion):
            trees[t].expanded.append(node_id)
            branches.append(sampler.branch_from(trees[t], roots[t], node_id))
        if branches:
            sampler.grow(branches, round_index, distinct, distinct_retries, distinct_exclude, distinct_actions)
    for tree in trees:
        leaves = tree.leaves()
        tree.kept_leaves = sorted(rng.sample(leaves, k)) if len(leaves) > k else leaves
    rollouts = [r for tree in trees for r in sampler.rollouts(tree)]
    return RolloutBatch(rollouts, trees, sampler.budget(len(rollouts)))


def _checked(picks: Sequence[tuple[int, int]], forest: Forest, rule: Any) -> list[tuple[int, int]]:
    """A rule's choice, refused when it overspends or names a node that cannot grow."""
    name = rule if isinstance(rule, str) else getattr(rule, "__name__", repr(rule))
    picks = list(picks)
    if len(picks) > forest.budget:
        raise ConfigError(f"branching rule {name!r} chose {len(picks)} nodes; this round's budget is {forest.budget}")
    for t, node_id in picks:
        if not 0 <= t < len(forest.trees) or node_id not in candidates(forest.trees[t]):
            raise ConfigError(f"branching rule {name!r} chose node {node_id} of tree {t}, which is not an "
                              "unfinished node of a tree in the forest")
    return picks


def _start_trees(sampler: _Sampler, prompts: Sequence[Prompt], per_prompt: int) -> tuple[list[Tree], list[_Root]]:
    """Reset one env per prompt and make ``per_prompt`` empty trees for it (sharing its root)."""
    if not prompts:
        raise ConfigError("no prompts to sample from")
    trees: list[Tree] = []
    roots: list[_Root] = []
    for p, prompt in enumerate(prompts):
        root, text, prompt_ids = sampler.reset_prompt(prompt)
        for t in range(per_prompt):
            root_node = Node(node_id=0, parent=None, depth=0, turn=None)
            trees.append(Tree(prompt_index=p, tree_index=t, prompt_ids=list(prompt_ids), nodes=[root_node],
                              prompt_text=text, info=dict(root.info)))
            roots.append(root)
    return trees, roots
