"""Branching rules on hand-built forests, and a user's own rule plugged into the sampler and the trainer."""

from __future__ import annotations

import random
import sys
import types

import pytest

from treegym.agents.rollout.branching import (
    RULES,
    Forest,
    branching_rule,
    candidates,
    get_rule,
    restart_points,
    step_failed,
    success_estimate,
    tool_points,
)
from treegym.agents.rollout.types import Node, Tree, Turn
from treegym.errors import ConfigError


def _turn(failed: bool = False, invalid: bool = False) -> Turn:
    return Turn([5], [-0.5], [], "A", "ok", None, invalid=invalid, info={"failed_step": failed})


def _tree(prompt: int, shape: dict[int, tuple[int | None, float | None, bool]], index: int = 0) -> Tree:
    """``shape``: node id -> (parent, leaf reward or None for an inner node, failed step)."""
    nodes = []
    for nid, (parent, reward, failed) in sorted(shape.items()):
        depth = 0 if parent is None else nodes[parent].depth + 1
        node = Node(nid, parent, depth, None if parent is None else _turn(failed), terminal=reward is not None,
                    reward=reward)
        nodes.append(node)
        if parent is not None:
            nodes[parent].children.append(nid)
    return Tree(prompt, index, [1], nodes)


def _chain(prompt: int, reward: float, failed_at: int | None = None, turns: int = 3, index: int = 0) -> Tree:
    shape: dict[int, tuple[int | None, float | None, bool]] = {0: (None, None, False)}
    for i in range(1, turns + 1):
        shape[i] = (i - 1, reward if i == turns else None, i == failed_at)
    return _tree(prompt, shape, index)


def test_pivot_never_branches_under_uniform_subtrees_while_a_mixed_one_exists() -> None:
    # Tree 0: node 1 has a winning and a losing leaf below it (mixed); tree 1 (another prompt) all 0.
    mixed = _tree(0, {0: (None, None, False), 1: (0, None, False), 2: (1, 1.0, False), 3: (1, 0.0, False)})
    flat = _chain(1, 0.0)
    picks = get_rule("pivot")(Forest([mixed, flat], 2, 1, random.Random(0)))
    assert len(picks) == 4  # the whole budget of both trees ...
    assert {p for p in picks} <= {(0, 0), (0, 1)}  # ... spent on the nodes above mixed outcomes


def test_pivot_spends_nothing_on_a_forest_that_cannot_teach() -> None:
    trees = [_chain(0, 0.0), _chain(0, 0.0, index=1), _chain(1, 1.0), _chain(1, 1.0, index=1)]
    forest = Forest(trees, 2, 1, random.Random(0))
    assert get_rule("pivot")(forest) == []


def test_pivot_moves_a_uniform_prompts_share_to_a_prompt_whose_trees_differ() -> None:
    # Prompt 0's two trees disagree (one won, one lost); prompt 1's agree. No node is mixed yet.
    trees = [_chain(0, 1.0), _chain(0, 0.0, index=1), _chain(1, 0.0), _chain(1, 0.0, index=1)]
    picks = get_rule("pivot")(Forest(trees, 1, 1, random.Random(0)))
    assert len(picks) == 4 and {t for t, _ in picks} <= {0, 1}


def test_success_estimate_shrinks_a_lone_leaf_toward_the_prompt_mean() -> None:
    tree = _chain(0, 1.0)
    assert success_estimate(tree, 0, prior=0.5, lo=0.0, hi=1.0) == pytest.approx(0.75)
    two = _tree(0, {0: (None, None, False), 1: (0, 1.0, False), 2: (0, 1.0, False)})
    assert success_estimate(two, 0, prior=0.5, lo=0.0, hi=1.0) == pytest.approx(2.5 / 3)


def test_restart_forks_the_state_just_before_each_flagged_step() -> None:
    tree = _chain(0, 0.0, failed_at=2, turns=4)  # turn 2 (node 2) was blocked: fork at node 1
    assert restart_points(tree) == [1]
    picks = get_rule("restart")(Forest([tree], 2, 1, random.Random(0)))
    assert picks[0] == (0, 1) and len(picks) == 2 and picks[1][1] in candidates(tree)


def test_restart_reads_invalid_actions_through_the_same_contract() -> None:
    assert step_failed(_turn(invalid=True)) and step_failed(_turn(failed=True)) and not step_failed(_turn())
    assert not step_failed(None)


def test_restart_without_flags_is_the_reference_choice() -> None:
    tree = _chain(0, 0.0)
    a = get_rule("restart")(Forest([tree], 3, 1, random.Random(7)))
    b = get_rule("with_replacement")(Forest([tree], 3, 1, random.Random(7)))
    assert a == b


def test_pivot_restart_restarts_in_uniform_prompts_and_pivots_in_mixed_ones() -> None:
    uniform = _chain(1, 0.0, failed_at=3, turns=3)
    mixed = _tree(0, {0: (None, None, False), 1: (0, None, False), 2: (1, 1.0, False), 3: (1, 0.0, False)})
    picks = get_rule("pivot+restart")(Forest([mixed, uniform], 1, 1, random.Random(0)))
    assert (1, 2) in picks and len(picks) == 2
    assert [p for p in picks if p[0] == 0][0][1] in (0, 1)


def test_unknown_rule_names_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="pivot"):
        get_rule("best_first")
    with pytest.raises(ConfigError, match="cannot import"):
        get_rule("no_such_module_xyz:rule")


def _deepest(forest: Forest) -> list[tuple[int, int]]:
    """A user's rule: fork every tree at its deepest unfinished node."""
    return [(t, max(candidates(tree), key=lambda i: tree.nodes[i].depth))
            for t, tree in enumerate(forest.trees) for _ in range(forest.per_tree)]


def test_a_custom_rule_trains_through_the_config_without_touching_the_loop(tmp_path, monkeypatch) -> None:
    from treegym.study.grid import Method, RunSpec, Task
    from treegym.study.run import run_one

    module = types.ModuleType("my_rules")
    module.deepest = _deepest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_rules", module)
    task = Task("lock-tiny", "ProbeLock-v0", horizon=2, choices=2, turn_tokens=1, chains=24)
    spec = RunSpec("test", task, Method("custom", "tree-grpo", (("sampler.expansion", "my_rules:deepest"),)),
                   budget=2, seed=0, setting=(("optim.lr", 1e-3),), eval_n=4, evals=0)
    record = run_one(spec, str(tmp_path))
    assert "error" not in record, record.get("trace")
    assert record["steps"] >= 1 and record["trajectories"] > 0

    branching_rule("test-deepest")(_deepest)
    try:
        spec = RunSpec("test", task, Method("named", "tree-grpo", (("sampler.expansion", "test-deepest"),)),
                       budget=2, seed=0, setting=(("optim.lr", 1e-3),), eval_n=4, evals=0)
        assert "error" not in run_one(spec, str(tmp_path))
    finally:
        RULES.pop("test-deepest")


def test_a_rule_that_overspends_is_refused(tmp_path) -> None:
    from treegym.agents.rollout.samplers import _checked

    tree = _chain(0, 0.0)
    forest = Forest([tree], 1, 1, random.Random(0))
    with pytest.raises(ConfigError, match="budget"):
        _checked([(0, 0), (0, 1)], forest, "greedy")
    with pytest.raises(ConfigError, match="not an unfinished node"):
        _checked([(0, 3)], forest, "greedy")  # node 3 is the leaf


def test_pivot_judges_a_lone_chain_against_the_forest_and_favours_the_one_that_won() -> None:
    # B=2: one tree of one chain per prompt. Prompt 0 won, prompts 1-3 lost.
    trees = [_chain(0, 1.0), _chain(1, 0.0), _chain(2, 0.0), _chain(3, 0.0)]
    picks = get_rule("pivot")(Forest(trees, 2, 1, random.Random(0)))
    assert len(picks) == 8
    assert sum(t == 0 for t, _ in picks) > 8 / 4  # more than an even share goes to the winning chain


def _looked(prompt: int, reward: float, index: int = 0) -> Tree:
    """A 2-turn chain whose first turn called the tool (node 1 holds its result)."""
    tree = _chain(prompt, reward, turns=2, index=index)
    tree.nodes[1].turn.tool_calls = 1
    return tree


def test_after_tool_forks_the_states_where_a_tool_result_arrived() -> None:
    looked, guessed = _looked(0, 0.0), _chain(0, 1.0, turns=2, index=1)
    assert tool_points(looked) == [1] and tool_points(guessed) == []
    picks = get_rule("after_tool")(Forest([looked, guessed], 2, 1, random.Random(0)))
    # The post-tool state gets its tree's share (n = 2 branches that reuse the call) ...
    assert picks.count((0, 1)) >= 2
    # ... and the rest of the budget goes where pivot+restart sends it.
    assert len(picks) <= 4 and all(p in {(0, 0), (0, 1), (1, 0), (1, 1)} for p in picks)


def test_after_tool_without_tool_calls_is_pivot_restart() -> None:
    trees = [_chain(0, 1.0), _chain(0, 0.0, failed_at=2, index=1), _chain(1, 0.0, failed_at=1), _chain(1, 0.0, index=1)]
    a = get_rule("after_tool")(Forest(trees, 2, 1, random.Random(3)))
    b = get_rule("pivot+restart")(Forest(trees, 2, 1, random.Random(3)))
    assert a == b and a


def test_after_tool_never_forks_a_finished_episode() -> None:
    tree = _tree(0, {0: (None, None, False), 1: (0, 1.0, False)})
    tree.nodes[1].turn.tool_calls = 1  # the call ended the episode: nothing to branch after it
    assert tool_points(tree) == []


def test_adaptive_branches_where_outcomes_differ_and_draws_fresh_chains_where_they_agree() -> None:
    # Prompt 0: its two trees disagree (a win and a loss); prompt 1: both lost.
    trees = [_chain(0, 1.0), _chain(0, 0.0, index=1), _chain(1, 0.0), _chain(1, 0.0, index=1)]
    picks = get_rule("adaptive")(Forest(trees, 2, 1, random.Random(0)))
    assert len(picks) == 8  # the whole budget, as the reference spends it
    assert sorted(p for p in picks if p[0] in (2, 3)) == [(2, 0), (2, 0), (3, 0), (3, 0)]  # fresh chains only
    assert all(t in (0, 1) for t, _ in picks[:4]) and any(node != 0 for t, node in picks if t in (0, 1))


def test_adaptive_on_a_forest_that_cannot_teach_is_grpo_shaped() -> None:
    trees = [_chain(0, 0.0), _chain(0, 0.0, index=1)]
    assert get_rule("adaptive")(Forest(trees, 2, 1, random.Random(0))) == [(0, 0), (1, 0), (0, 0), (1, 0)]
