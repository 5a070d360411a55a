"""What a batch of trees gives a learner, beyond its size: distinct moves and independent samples.

A tree's siblings share their prefix, so k leaves of one tree are worth fewer than k chains; and
siblings that open with the same move teach a turn-level credit nothing. These read a batch's
kept trajectories; the loop logs them per step, and the study compares trees with chains on them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from treegym.agents.rollout.types import Tree, Turn


def move(turn: Turn) -> object:
    """A turn's move: the env's parsed move where its step info names it (``info["move"]``), else
    its first token (an instruct model's first token is a format token, not a move)."""
    return turn.info.get("move", tuple(turn.action_ids[:1]))


def distinct_first_moves(trees: Sequence[Tree]) -> float:
    """Mean over prompts of the number of distinct first moves among the kept trajectories."""
    groups: dict[int, set[object]] = {}
    for tree in trees:
        for leaf in tree.kept_leaves:
            path = tree.path(leaf)
            first = tree.nodes[path[0]].turn if path else None
            if first is not None:
                groups.setdefault(tree.prompt_index, set()).add(move(first))
    return sum(map(len, groups.values())) / len(groups) if groups else 0.0


def effective_trajectories(trees: Sequence[Tree]) -> float:
    """The kept trajectories counted as independent ones, summed over prompts.

    A group of n trajectories counts n² / Σ_ij ρ_ij, where ρ_ij is the action tokens i and j share
    over the geometric mean of their lengths (ρ_ii = 1): the design effect of correlated samples.
    Chains share nothing and count n; leaves of one tree count less the more prefix they share.
    """
    groups: dict[int, list[tuple[Tree, list[int]]]] = {}
    for tree in trees:
        for leaf in tree.kept_leaves:
            groups.setdefault(tree.prompt_index, []).append((tree, tree.path(leaf)))
    return sum(_group_effective(members) for members in groups.values())


def _group_effective(members: list[tuple[Tree, list[int]]]) -> float:
    def tokens(tree: Tree, nodes: Sequence[int]) -> int:
        return sum(len(t.action_ids) for t in (tree.nodes[i].turn for i in nodes) if t is not None)

    lengths = [max(tokens(tree, path), 1) for tree, path in members]
    overlap = 0.0
    for i, (tree_i, path_i) in enumerate(members):
        for j, (tree_j, path_j) in enumerate(members):
            if i == j:
                overlap += 1.0
            elif tree_i is tree_j:
                shared = 0
                while shared < min(len(path_i), len(path_j)) and path_i[shared] == path_j[shared]:
                    shared += 1
                overlap += tokens(tree_i, path_i[:shared]) / math.sqrt(lengths[i] * lengths[j])
    return len(members) ** 2 / overlap if overlap else 0.0
