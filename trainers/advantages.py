"""Advantage estimators: pure tensor functions over rewards and tree structure, registered by name.

Two layers:

- the math, as small pure functions over flat tensors (``group_normalize``,
  ``tree_grpo_advantages``, ``backed_up_values``, ``turn_credit``), each unit-tested on
  hand-computed inputs;
- the adapters (``grpo``, ``tree_grpo``, ``treeopsd``; by name: ``algorithms.ALGORITHMS``), from
  a ``RolloutBatch`` to one advantage per action token of each rollout (what the loss consumes)
  and per-token weights (1.0 unless the estimator says otherwise: a loss counts a tree turn once).

Every estimator gives zero advantage, never NaN, to a group whose rewards are all equal.
A rollout that could not run (a tool it needed was unreachable: ``failed_to_run``) is left out
of every group's statistics and of the loss (``without_failed_runs``), as open-instruct masks
such episodes: its reward is not the agent's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from treegym.agents.rollout.types import Rollout
from treegym.envs.core import failed_to_run
from treegym.errors import ConfigError
from treegym.trainers.config import OPSD_ROOTS, PREFIX_CREDITS, TREE_MODES, AdvantageConfig

EPS = 1e-6
_DEFAULT = AdvantageConfig()  # keyword defaults: a direct call computes what a default run trains on


# ---- the math ---------------------------------------------------------------------------------


def group_stats(values: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """Per-element mean and unbiased std of the element's group.

    A group of one gets mean 0 and std 1 (the convention of the GRPO reference code), so its
    normalised value is the raw value.
    """
    values = values.to(torch.float64)
    _, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    n = counts.to(torch.float64)
    sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, values)
    means = sums / n
    sq = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, (values - means[inverse]) ** 2)
    # Unbiased (n - 1) std; a group of one has no spread to measure.
    stds = torch.sqrt(sq / (n - 1).clamp(min=1.0))
    single = counts == 1
    means = torch.where(single, torch.zeros_like(means), means)
    stds = torch.where(single, torch.ones_like(stds), stds)
    return means[inverse], stds[inverse]


def group_normalize(rewards: Tensor, group: Tensor, *, use_std: bool = True, eps: float = EPS) -> Tensor:
    """GRPO: (R - group mean) / (group std + eps); ``use_std=False`` is Dr. GRPO's R - mean."""
    mean, std = group_stats(rewards, group)
    centered = rewards.to(torch.float64) - mean
    out = centered / (std + eps) if use_std else centered
    return out.to(torch.float32)


def tree_grpo_advantages(
    rewards: Tensor, prompt: Tensor, tree: Tensor, *, mode: str = "inter+intra", eps: float = EPS
) -> Tensor:
    """Tree-GRPO's leaf advantage, as the reference code computes it.

    ``mode``:
      - ``"inter+intra"``: (R - mean_G)/(std_G + eps) + (R - mean_T)/(std_T + eps), where G is
        every kept leaf of the prompt and T the leaves of one tree;
      - ``"intra"``: the tree term only;
      - ``"prompt-then-tree"``: normalise within the prompt, then normalise those values
        again within the tree.
    ``tree`` ids only need to be unique within a prompt; they are combined with ``prompt``.
    """
    tree_key = prompt.to(torch.int64) * (int(tree.max().item()) + 1 if len(tree) else 1) + tree.to(torch.int64)
    if mode == "inter+intra":
        return group_normalize(rewards, prompt, eps=eps) + group_normalize(rewards, tree_key, eps=eps)
    if mode == "intra":
        return group_normalize(rewards, tree_key, eps=eps)
    if mode == "prompt-then-tree":
        return group_normalize(group_normalize(rewards, prompt, eps=eps), tree_key, eps=eps)
    raise ConfigError(f"tree-grpo mode {mode!r} is not one of: {', '.join(TREE_MODES)}")


def backed_up_values(parent: Tensor, leaf_reward: Tensor, is_leaf: Tensor) -> Tensor:
    """V(leaf) = R; V(node) = mean of V over its children. Nodes must be in topological order.

    ``parent[i]`` is the index of node i's parent, -1 for a root; parents come before children.
    Leaves are the nodes with ``is_leaf``; an inner node without children keeps V = 0.
    """
    n = len(parent)
    value = torch.where(is_leaf, leaf_reward.to(torch.float64), torch.zeros(n, dtype=torch.float64))
    total = torch.zeros(n, dtype=torch.float64)
    count = torch.zeros(n, dtype=torch.float64)
    # Children come after parents, so a reverse sweep finishes every child before its parent.
    for i in range(n - 1, -1, -1):
        if not is_leaf[i] and count[i] > 0:
            value[i] = total[i] / count[i]
        p = int(parent[i])
        if p >= 0:
            total[p] += value[i]
            count[p] += 1
    return value


def turn_credit(parent: Tensor, value: Tensor) -> Tensor:
    """A(c) = V(c) - V(parent(c)): the credit of the turn leading into node c; 0 at roots."""
    has_parent = parent >= 0
    parent_value = torch.where(has_parent, value[parent.clamp(min=0)], value)
    return (value - parent_value).to(torch.float32)


# ---- adapters: RolloutBatch -> per-token advantages --------------------------------------------


@dataclass(frozen=True)
class TokenAdvantages:
    """One float per token of each rollout (0 off the loss mask), plus per-token loss weights."""

    advantages: list[Tensor]
    weights: list[Tensor]
    per_rollout: Tensor  # a scalar summary per rollout (its leaf advantage, or mean turn credit)
    stats: dict[str, float] = field(default_factory=dict)  # the estimator's own diagnostics, logged by name


AdvantageFn = Callable[..., TokenAdvantages]


def without_failed_runs(advantage: AdvantageFn, rollouts: Sequence[Rollout],
                        **options: object) -> tuple[list[Rollout], TokenAdvantages]:
    """``advantage`` over the rollouts that ran, and the batch to train on: a rollout that could
    not run keeps its place (shapes stay as the loop expects) with no loss tokens, advantage 0
    and weight 0. A batch where every rollout ran is ``advantage``'s, unchanged."""
    ran = [i for i, r in enumerate(rollouts) if failed_to_run(r.info) is None]
    if len(ran) == len(rollouts):
        return list(rollouts), advantage(rollouts, **options)
    inner = advantage([rollouts[i] for i in ran], **options) if ran else None
    kept = {i: j for j, i in enumerate(ran)}
    advs, weights, out = [], [], []
    per_rollout = torch.zeros(len(rollouts))
    for i, r in enumerate(rollouts):
        if i in kept and inner is not None:
            j = kept[i]
            advs.append(inner.advantages[j])
            weights.append(inner.weights[j])
            per_rollout[i] = inner.per_rollout[j]
            out.append(r)
        else:
            advs.append(torch.zeros(len(r.loss_mask)))
            weights.append(torch.zeros(len(r.loss_mask)))
            out.append(replace(r, loss_mask=[0] * len(r.loss_mask)))
    return out, TokenAdvantages(advs, weights, per_rollout, dict(inner.stats) if inner is not None else {})


def _broadcast(rollouts: Sequence[Rollout], per_rollout: Tensor) -> TokenAdvantages:
    advs, weights = [], []
    for r, a in zip(rollouts, per_rollout.tolist()):
        mask = torch.tensor(r.loss_mask, dtype=torch.float32)
        advs.append(mask * a)
        weights.append(torch.ones_like(mask))
    return TokenAdvantages(advs, weights, per_rollout)


def _rewards(rollouts: Sequence[Rollout]) -> Tensor:
    return torch.tensor([r.reward for r in rollouts], dtype=torch.float32)


def _prompts(rollouts: Sequence[Rollout]) -> Tensor:
    return torch.tensor([r.prompt_index for r in rollouts], dtype=torch.int64)


def grpo(rollouts: Sequence[Rollout], *, use_std: bool = _DEFAULT.use_std) -> TokenAdvantages:
    """GRPO: every action token of a rollout gets its group-normalised reward (group = prompt)."""
    return _broadcast(rollouts, group_normalize(_rewards(rollouts), _prompts(rollouts), use_std=use_std))


def tree_grpo(rollouts: Sequence[Rollout], *, mode: str = _DEFAULT.tree_mode,
              prefix_credit: str = _DEFAULT.prefix_credit) -> TokenAdvantages:
    """Tree-GRPO: the leaf's advantage applies to every action token on its root-to-leaf path.

    ``prefix_credit``: ``per_leaf`` (the reference) trains a turn shared by j kept leaves j
    times, once in each; ``per_turn`` weights its tokens 1/j, so that the turn is trained once
    with the mean of those leaves' advantages (the weights TreeOPSD uses).
    """
    if prefix_credit not in PREFIX_CREDITS:
        raise ConfigError(f"prefix_credit {prefix_credit!r} is not one of: {', '.join(PREFIX_CREDITS)}")
    trees = torch.tensor([r.tree_index for r in rollouts], dtype=torch.int64)
    out = _broadcast(rollouts, tree_grpo_advantages(_rewards(rollouts), _prompts(rollouts), trees, mode=mode))
    if prefix_credit == "per_leaf":
        return out
    _, _, _, _, index = tree_structure(rollouts)
    return TokenAdvantages(out.advantages, _turn_weights(rollouts, index), out.per_rollout)


def _path(r: Rollout, index: dict[tuple[int, int, int], int]) -> list[int]:
    """The flat indices (``tree_structure``) of the nodes of ``r``'s turns, in order."""
    return [index[(r.prompt_index, r.tree_index, node)] for node in r.node_path]


def _per_token(r: Rollout, per_turn: Tensor, off: float) -> Tensor:
    """Each action token of ``r`` gets its turn's value; the other tokens get ``off``."""
    turn = torch.tensor(r.turn_of_token, dtype=torch.int64)
    on = torch.tensor(r.loss_mask, dtype=torch.bool) & (turn >= 0)
    out = torch.full((len(turn),), off)
    if on.any():
        out[on] = per_turn[turn[on]].to(torch.float32)
    return out


def _turn_weights(rollouts: Sequence[Rollout], index: dict[tuple[int, int, int], int]) -> list[Tensor]:
    """Per-token 1/multiplicity: a turn shared by j kept rollouts counts once in the loss."""
    multiplicity: dict[int, int] = {}
    for r in rollouts:
        for i in _path(r, index):
            multiplicity[i] = multiplicity.get(i, 0) + 1
    return [_per_token(r, 1.0 / torch.tensor([float(multiplicity[i]) for i in _path(r, index)]), 1.0) for r in rollouts]


def tree_structure(
    rollouts: Sequence[Rollout], *, prompt_root: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[tuple[int, int, int], int]]:
    """The subtree spanned by the kept rollouts, as flat tensors.

    Returns (parent, leaf_reward, is_leaf, prompt_of_node, index) where ``index`` maps
    (prompt, tree, node id) -> flat index; one virtual root per (prompt, tree), or with
    ``prompt_root`` one per prompt, shared by its m trees (keyed (prompt, -1, -1)). Only kept
    leaves are counted, so V backs up over exactly the trajectories that are trained on.
    """
    index: dict[tuple[int, int, int], int] = {}
    parent: list[int] = []
    reward: list[float] = []
    leaf: list[bool] = []
    prompt_of: list[int] = []

    def node_at(key: tuple[int, int, int], up: int) -> int:
        if key not in index:
            index[key] = len(parent)
            parent.append(up)
            reward.append(0.0)
            leaf.append(False)
            prompt_of.append(key[0])
        return index[key]

    for r in rollouts:
        prev = node_at((r.prompt_index, -1, -1) if prompt_root else (r.prompt_index, r.tree_index, -1), -1)
        for depth, node in enumerate(r.node_path):
            i = node_at((r.prompt_index, r.tree_index, node), prev)
            if depth == len(r.node_path) - 1:
                leaf[i] = True
                reward[i] = r.reward
            prev = i
    return (
        torch.tensor(parent, dtype=torch.int64),
        torch.tensor(reward, dtype=torch.float64),
        torch.tensor(leaf, dtype=torch.bool),
        torch.tensor(prompt_of, dtype=torch.int64),
        index,
    )


def treeopsd(
    rollouts: Sequence[Rollout],
    *,
    normalize_std: bool = _DEFAULT.normalize_std,
    root: str = _DEFAULT.opsd_root,
    fallback: bool = _DEFAULT.opsd_fallback,
    blend: float = _DEFAULT.opsd_lambda,
    eps: float = EPS,
) -> TokenAdvantages:
    """TreeOPSD turn credit: back rewards up the tree, credit each turn by V(child) - V(parent).

    Every action token of a turn gets that turn's credit. A turn shared by several kept
    trajectories appears once in each of them; its tokens are weighted 1/multiplicity so that
    every turn counts once in the loss. ``normalize_std`` divides credits by the std of the
    prompt group's rewards.

    The credit's shape:
      - ``root="tree"`` (the reading so far): each (prompt, tree) has its own virtual root,
        so a tree's first turn is credited against its own mean, which is 0 whenever the
        root was never expanded;
      - ``root="prompt"``: the m trees of a prompt hang from one root, valued like every other
        node by the mean of its children (the trees' first turns), so a tree's first turn is
        credited against its sibling trees;
      - ``fallback``: a turn whose parent has one child (nothing to compare it with) gets
        V(c) - V0 instead of 0, V0 being the mean reward of the prompt's kept leaves (the GRPO
        baseline, AgentOPSD's V0), so an unbranched chain trains like GRPO;
      - ``blend`` (λ): A = λ·credit + (1 - λ)·the rollout's prompt-level GRPO advantage. The
        default, λ = 0.5 (AgentOPSD's), is TreeOPSD blended with the outcome advantage; λ = 1 is
        the turn credit alone (the study's ``treeopsd/credit-only``). A turn whose parent has
        one child has credit exactly 0, so with λ = 1 it is not trained at all; the share of
        such turns is logged as ``single_child_frac``.
    """
    if not 0.0 <= blend <= 1.0:
        raise ConfigError(f"treeopsd blend λ must be in [0, 1], got {blend}")
    if root not in OPSD_ROOTS:
        raise ConfigError(f"treeopsd root {root!r} is not one of: {', '.join(OPSD_ROOTS)}")
    parent, reward, is_leaf, prompt_of, index = tree_structure(rollouts, prompt_root=root == "prompt")
    value = backed_up_values(parent, reward, is_leaf)
    rewards, prompts = _rewards(rollouts), _prompts(rollouts)
    v0 = {int(p): float(rewards[prompts == p].mean()) for p in prompts.unique()}
    prompt_value = torch.tensor([v0[int(p)] for p in prompt_of], dtype=torch.float64)
    credit = turn_credit(parent, value)
    children = torch.zeros(len(parent), dtype=torch.int64).index_add_(
        0, parent.clamp(min=0), (parent >= 0).to(torch.int64))
    only_child = (parent >= 0) & (children[parent.clamp(min=0)] == 1)
    edges = int((parent >= 0).sum())
    single_child = float(only_child.sum()) / edges if edges else 0.0
    if fallback:
        credit = torch.where(only_child, (value - prompt_value).to(torch.float32), credit)
    outcome = group_normalize(rewards, prompts, eps=eps)
    _, std = group_stats(rewards, prompts)  # per rollout: its prompt group's
    weights = _turn_weights(rollouts, index)
    advs, summary = [], []
    for j, r in enumerate(rollouts):
        flat = _path(r, index)
        per_turn = credit[flat] if flat else torch.zeros(0)
        if normalize_std:
            per_turn = per_turn / (float(std[j]) + eps)
        per_turn = blend * per_turn + (1.0 - blend) * outcome[j]
        advs.append(_per_token(r, per_turn, 0.0))
        summary.append(float(per_turn.mean()) if len(per_turn) else 0.0)
    return TokenAdvantages(advs, weights, torch.tensor(summary), {"single_child_frac": single_child})
