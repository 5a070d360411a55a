"""Trees against chains on what a batch gives a learner: distinct first moves, independent samples."""

from __future__ import annotations

import pytest

from treegym.agents.rollout.diagnostics import distinct_first_moves, effective_trajectories
from treegym.agents.rollout.types import Node, Tree, Turn


def turn(first: int, n_tokens: int = 4, move: str | None = None) -> Turn:
    info = {} if move is None else {"move": move}
    return Turn([first] + [9] * (n_tokens - 1), [0.0] * n_tokens, [], "", "", None, info=info)


def tree(edges: list[tuple[int, Turn]], leaves: list[int], prompt: int = 0, index: int = 0) -> Tree:
    """Nodes 1.. in order, each (parent, its turn); ``leaves`` are kept."""
    nodes = [Node(0, None, 0, None)]
    for parent, t in edges:
        node = Node(len(nodes), parent, nodes[parent].depth + 1, t)
        nodes[parent].children.append(node.node_id)
        nodes.append(node)
    for leaf in leaves:
        nodes[leaf].terminal = True
    return Tree(prompt, index, [1], nodes, kept_leaves=leaves)


def test_chains_count_as_independent_and_a_trees_leaves_count_less_the_more_they_share() -> None:
    chains = [tree([(0, turn(2)), (1, turn(3))], [2], index=i) for i in range(4)]
    assert effective_trajectories(chains) == pytest.approx(4.0)
    # One tree: a shared first turn (4 tokens), then 4 different second turns (4 tokens each).
    shared = tree([(0, turn(2)), *[(1, turn(3 + k)) for k in range(4)]], [2, 3, 4, 5])
    # rho between siblings = 4 / 8 = 0.5: n_eff = 16 / (4 + 12 * 0.5) = 1.6
    assert effective_trajectories([shared]) == pytest.approx(1.6)
    assert 1.0 < effective_trajectories([shared]) < effective_trajectories(chains)


def test_groups_of_different_prompts_add_up() -> None:
    a = tree([(0, turn(2))], [1], prompt=0)
    b = tree([(0, turn(2))], [1], prompt=1)
    assert effective_trajectories([a, b]) == pytest.approx(2.0)


def test_distinct_first_moves_read_the_envs_move_not_the_format_token() -> None:
    # Every turn opens with token 7 ('<'); the moves differ after it.
    heads = [tree([(0, turn(7, move=m))], [1], index=i) for i, m in enumerate("ABAB")]
    assert distinct_first_moves(heads) == 2.0
    no_move = [tree([(0, turn(7))], [1], index=i) for i in range(4)]  # without info["move"]: the first token
    assert distinct_first_moves(no_move) == 1.0
    two_prompts = heads + [tree([(0, turn(7, move="C"))], [1], prompt=1)]
    assert distinct_first_moves(two_prompts) == pytest.approx((2 + 1) / 2)
