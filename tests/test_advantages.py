"""Advantage estimators on small hand-computed inputs."""

from __future__ import annotations

import math

import pytest
import torch

from treegym.agents.rollout.types import Rollout
from treegym.errors import ConfigError
from treegym.trainers.advantages import (
    backed_up_values,
    group_normalize,
    grpo,
    tree_grpo_advantages,
    treeopsd,
    turn_credit,
)


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


def ids(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def test_grpo_normalizes_by_group_mean_and_unbiased_std() -> None:
    # group 0: [1, 0, 0, 1] mean 0.5, unbiased std sqrt(1/3); group 1: [1, 1] -> 0
    adv = group_normalize(t(1, 0, 0, 1, 1, 1), ids(0, 0, 0, 0, 1, 1))
    s = math.sqrt(1 / 3)
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)


def test_dr_grpo_only_centers() -> None:
    adv = group_normalize(t(1, 0, 0, 0), ids(0, 0, 0, 0), use_std=False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_equal_rewards_give_zero_advantage_never_nan() -> None:
    for use_std in (True, False):
        adv = group_normalize(t(0.2, 0.2, 0.2), ids(3, 3, 3), use_std=use_std)
        assert torch.isfinite(adv).all() and adv.abs().max() == 0
    adv = tree_grpo_advantages(t(1, 1, 1, 1), ids(0, 0, 0, 0), ids(0, 0, 1, 1))
    assert torch.isfinite(adv).all() and adv.abs().max() == 0


def test_group_of_one_has_mean_zero_and_std_one() -> None:
    assert group_normalize(t(0.7), ids(0)).tolist() == pytest.approx([0.7 / (1 + 1e-6)])


def test_tree_grpo_sums_prompt_and_tree_normalisation() -> None:
    # One prompt, two trees of two leaves: tree 0 = [1, 0], tree 1 = [0, 0].
    r, p, tr = t(1, 0, 0, 0), ids(0, 0, 0, 0), ids(0, 0, 1, 1)
    prompt_std = math.sqrt(((0.75**2) + 3 * 0.25**2) / 3)
    tree_std = math.sqrt(0.5)  # [1, 0]: mean 0.5, unbiased var 0.5
    inter = [0.75 / prompt_std, -0.25 / prompt_std, -0.25 / prompt_std, -0.25 / prompt_std]
    intra = [0.5 / tree_std, -0.5 / tree_std, 0.0, 0.0]
    got = tree_grpo_advantages(r, p, tr)
    assert got.tolist() == pytest.approx([a + b for a, b in zip(inter, intra)], rel=1e-5)
    assert tree_grpo_advantages(r, p, tr, mode="intra").tolist() == pytest.approx(intra, rel=1e-5)
    # prompt-then-tree: normalise [0.75,-.25,-.25,-.25]/s by tree: tree 0 -> ±1/sqrt(.5)·.5, tree 1 -> 0
    got = tree_grpo_advantages(r, p, tr, mode="prompt-then-tree")
    assert got.tolist() == pytest.approx([0.5 / tree_std, -0.5 / tree_std, 0.0, 0.0], rel=1e-4)


def test_tree_ids_are_scoped_by_prompt() -> None:
    # Tree 0 of prompt 0 and tree 0 of prompt 1 are different trees.
    got = tree_grpo_advantages(t(1, 0, 1, 1), ids(0, 0, 1, 1), ids(0, 0, 0, 0), mode="intra")
    assert got[2:].abs().max() == 0 and got[0] > 0


def test_backed_up_values_average_children_and_credit_is_child_minus_parent() -> None:
    #        0
    #      /   \
    #     1     2 (leaf R=1)
    #    / \
    #   3   4      leaves R=1, R=0
    parent = ids(-1, 0, 0, 1, 1)
    is_leaf = torch.tensor([False, False, True, True, True])
    v = backed_up_values(parent, t(0, 0, 1, 1, 0), is_leaf)
    assert v.tolist() == pytest.approx([0.75, 0.5, 1.0, 1.0, 0.0])
    a = turn_credit(parent, v)
    assert a.tolist() == pytest.approx([0.0, -0.25, 0.25, 0.5, -0.5])


def _rollout(prompt: int, tree: int, path: list[int], reward: float) -> Rollout:
    # Two prompt tokens, then for each turn one action token and one observation token.
    tokens, mask, turn = [7, 7], [0, 0], [-1, -1]
    for i, _ in enumerate(path):
        tokens += [1, 2]
        mask += [1, 0]
        turn += [i, -1]
    return Rollout(prompt, tree, path[-1], path, tokens, mask, [0.0] * len(tokens), turn, reward)


def test_treeopsd_gives_each_turn_its_credit_and_counts_shared_turns_once() -> None:
    # Tree: root -> 1 -> {2 (R=1), 3 (R=0)}; root -> 4 (R=1)
    rs = [_rollout(0, 0, [1, 2], 1.0), _rollout(0, 0, [1, 3], 0.0), _rollout(0, 0, [4], 1.0)]
    out = treeopsd(rs, blend=1.0)
    # V(1) = .5, V(root) = .75 -> A(1) = -.25, A(2) = .5, A(3) = -.5, A(4) = .25
    assert out.advantages[0].tolist() == pytest.approx([0, 0, -0.25, 0, 0.5, 0])
    assert out.advantages[1].tolist() == pytest.approx([0, 0, -0.25, 0, -0.5, 0])
    assert out.advantages[2].tolist() == pytest.approx([0, 0, 0.25, 0])
    # Node 1 lies on two kept paths: its tokens weigh 1/2 in each.
    assert out.weights[0].tolist() == pytest.approx([1, 1, 0.5, 1, 1, 1])


def test_treeopsd_prompt_root_is_valued_at_its_childrens_mean_like_every_node() -> None:
    # Tree 0: root -> 1 -> {2 (R=1), 3 (R=0)}; tree 1: root -> 4 (R=1); one root for the prompt.
    rs = [_rollout(0, 0, [1, 2], 1.0), _rollout(0, 0, [1, 3], 0.0), _rollout(0, 1, [4], 1.0)]
    out = treeopsd(rs, root="prompt", blend=1.0)
    # V(1) = .5, V(4) = 1, V(root) = their mean .75 (not the leaf mean 2/3): A(1) = -.25, A(4) = .25
    assert out.advantages[0].tolist() == pytest.approx([0, 0, -0.25, 0, 0.5, 0])
    assert out.advantages[2].tolist() == pytest.approx([0, 0, 0.25, 0])


def test_adapter_keyword_defaults_are_the_configs() -> None:
    import inspect

    from treegym.trainers.advantages import tree_grpo
    from treegym.trainers.algorithms import ALGORITHMS
    from treegym.trainers.config import TrainConfig

    cfg = TrainConfig()
    for fn, algo in ((grpo, "grpo"), (tree_grpo, "tree-grpo"), (treeopsd, "treeopsd")):
        params = inspect.signature(fn).parameters
        for name, value in ALGORITHMS[algo].advantage_options(cfg).items():
            assert params[name].default == value, (algo, name)


def test_treeopsd_equal_rewards_give_zero_credit_with_std_normalisation() -> None:
    rs = [_rollout(0, 0, [1, 2], 1.0), _rollout(0, 0, [1, 3], 1.0)]
    out = treeopsd(rs, normalize_std=True)
    assert all(torch.isfinite(a).all() and a.abs().max() == 0 for a in out.advantages)


def test_grpo_adapter_puts_advantage_on_action_tokens_only() -> None:
    rs = [_rollout(0, 0, [1], 1.0), _rollout(0, 1, [2], 0.0)]
    out = grpo(rs)
    a = 0.5 / math.sqrt(0.5)
    assert out.advantages[0].tolist() == pytest.approx([0, 0, a, 0], rel=1e-5)
    assert out.advantages[1].tolist() == pytest.approx([0, 0, -a, 0], rel=1e-5)


def test_treeopsd_blend_mixes_turn_credit_with_the_prompt_advantage() -> None:
    from treegym.agents.rollout.types import Rollout
    from treegym.trainers.advantages import grpo, treeopsd

    def roll(leaf: int, path: list[int], reward: float) -> Rollout:
        return Rollout(0, 0, leaf, path, [9] * (1 + len(path)), [0] + [1] * len(path), [0.0] * (1 + len(path)),
                       [-1] + list(range(len(path))), reward)

    # One shared first turn (node 1), then two siblings: one wins, one loses.
    rs = [roll(2, [1, 2], 1.0), roll(3, [1, 3], 0.0)]
    credit = treeopsd(rs, blend=1.0)
    outcome = grpo(rs)
    mixed = treeopsd(rs, blend=0.5)
    for c, o, m in zip(credit.advantages, outcome.advantages, mixed.advantages):
        assert torch.allclose(m, 0.5 * c + 0.5 * o)
    # The shared turn has one child of the root: its credit is 0 (the single-child share is logged).
    assert credit.advantages[0][1] == 0.0 and credit.stats["single_child_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ConfigError):
        treeopsd(rs, blend=1.5)
