"""One scoring path: every command scores a played episode as ``EpisodeScore`` and holds out the
same tasks, so ``treegym eval --n 32`` and a train run's 32 held-out prompts can be compared."""

from __future__ import annotations

import pytest

import treegym  # noqa: F401  (registers the envs)
import treegym.envs as envs
from treegym.agents.eval import _episode_of_tree, chosen_prompts, evaluate, score_episode
from treegym.agents.rollout.scoring import HELDOUT_SEED, EpisodeScore, HeldOut, chain_score, heldout_prompts
from treegym.agents.rollout.types import Node, Tree, Turn
from treegym.trainers.config import load_config
from treegym.trainers.prompts import make_env


def _turn(invalid: bool, tool_calls: int = 0, info: dict | None = None) -> Turn:
    return Turn([1], [0.0], [2], "a", "o", None, invalid=invalid, tool_calls=tool_calls, info=dict(info or {}))


def _chain(*turns: Turn) -> Tree:
    nodes = [Node(0, None, 0, None)]
    for i, turn in enumerate(turns, start=1):
        nodes.append(Node(i, i - 1, i, turn, terminal=i == len(turns), reward=0.0 if i == len(turns) else None))
        nodes[i - 1].children.append(i)
    return Tree(0, 0, [7], nodes, kept_leaves=[len(turns)], prompt_text="p")


def test_well_formed_is_the_mean_of_each_episodes_share_not_a_pool_of_turns() -> None:
    one_bad = _chain(_turn(True))
    three_good = _chain(_turn(False), _turn(False, 2), _turn(False, 1, {"success": 1.0}))
    held = HeldOut((chain_score(one_bad, 1), chain_score(three_good, 3)))
    assert held.scores[1] == EpisodeScore(success=1.0, well_formed=1.0, tool_calls=3, turns=3)
    assert held.mean("well_formed") == 0.5  # pooled over the 4 turns it would read 0.75


def test_eval_and_the_trainer_score_a_chain_alike() -> None:
    tree = _chain(_turn(False, 1), _turn(True, 0, {"success": 0.0}))
    assert score_episode(_episode_of_tree(tree, "0:t")).score == chain_score(tree, 2)


def test_heldout_prompts_are_the_first_tasks_of_the_split_or_fixed_seeds() -> None:
    assert heldout_prompts(["a", "b", "c"], 2) == [{"task_id": "a"}, {"task_id": "b"}]
    assert heldout_prompts(["a", "b"], 3) == [{"task_id": "a"}, {"task_id": "b"}, {"task_id": "a"}]
    assert heldout_prompts(None, 2) == [HELDOUT_SEED, HELDOUT_SEED + 1]


class _Finish:
    """Answers with an action the household env cannot parse: one turn, then the episode is cut."""

    def act(self, messages: list) -> str:
        return "?"


def test_eval_n_32_and_a_train_runs_32_heldout_prompts_are_the_same_tasks() -> None:
    cfg = load_config(overrides=[("env", "TextHousehold-v0")])
    assert cfg.run.eval_n == 32
    # the prompts a train run's held-out evaluation plays (trainers.heldout.evaluate_policy), on its own env
    trained_on = [p["task_id"] for p in chosen_prompts(make_env(cfg, cfg.run.eval_split), cfg.run.eval_n)]
    report = evaluate(_Finish(), "TextHousehold-v0", 32, max_turns=1, progress=False)
    evaluated = [s.episode_id.split(":", 1)[1] for s in report.scores]
    assert len(set(evaluated)) == 32 and evaluated == trained_on
    assert trained_on == [str(t) for t in envs.registry.task_ids(envs.make("TextHousehold-v0", "auto"))[:32]]
    assert report.well_formed.mean == pytest.approx(0.0)


def test_a_merged_evaluation_is_in_task_order_whatever_the_number_of_processes() -> None:
    scores = [EpisodeScore(float(i % 2), 1.0, i, 1) for i in range(5)]
    world = 2  # process r played tasks r, r + 2, ...
    parts = [HeldOut(tuple(scores[r::world])) for r in range(world)]
    assert HeldOut.merge(parts).scores == tuple(scores)
    assert HeldOut.merge([HeldOut(tuple(scores[:1])), None]).scores == tuple(scores[:1])
