"""The parametric probe family: its rules, its generator, and the fork contract on every task it draws."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest

import treegym  # noqa: F401  (registers ProbeTask-v0)
from treegym.envs.checker import check_fork_contract
from treegym.envs.probe_family import (
    MAX_CHANCE,
    MIN_CHANCE,
    ProbeTaskEnv,
    ProbeTaskParams,
    chance,
    sample_task,
    sample_tasks,
)
from treegym.envs.probe_model import build_probe_model, random_episode
from treegym.errors import ConfigError


def _other(env: ProbeTaskEnv, key: str) -> str:
    return next(m for m in env.moves if m != key)


def contract_actions(params: ProbeTaskParams) -> list[str]:
    """An episode prefix that does not end on its first action (a look, or a move that does not end it)."""
    env = params.make()
    keys = env.fixed_keys
    first = "?" if params.tools else _other(env, keys[0]) if params.failure == "visible" else keys[0]
    moves = [first, f"{keys[0]} x", _other(env, keys[-1]), keys[-1], "A"]
    return [f"< {m}" if params.opening else m for m in moves]


@pytest.mark.parametrize("seed", range(48))
def test_every_sampled_task_keeps_the_fork_contract(seed: int) -> None:
    params = sample_task(seed)
    kwargs = params.env_kwargs()
    actions = contract_actions(params)
    check_fork_contract(lambda: gym.make("ProbeTask-v0", **kwargs), actions, alt_actions=actions[::-1][:3], seed=seed)


def test_the_generator_is_deterministic_by_seed_and_differs_across_seeds() -> None:
    assert sample_tasks(range(24)) == sample_tasks(range(24))
    assert len(set(sample_tasks(range(24)))) == 24


def test_sampled_tasks_span_every_parameter_and_stay_in_the_chance_range() -> None:
    tasks = sample_tasks(range(64))
    assert {t.failure for t in tasks} == {"sparse", "visible"}
    assert {t.prior for t in tasks} == {"random", "uniform", "uses_tools"}
    assert {t.opening for t in tasks} == {True, False} and {t.tools for t in tasks} == {True, False}
    assert min(t.horizon for t in tasks) >= 2 and max(t.horizon for t in tasks) <= 12
    assert min(t.turn_tokens for t in tasks) >= 1 and max(t.turn_tokens for t in tasks) <= 32
    assert {t.distractors for t in tasks} >= {0, 1, 2} and len({t.choices for t in tasks}) >= 2
    assert all(MIN_CHANCE <= chance(t) <= MAX_CHANCE for t in tasks)
    assert all(t.turn_tokens >= 2 for t in tasks if t.opening)  # room for the opening and the move
    assert all(not t.opening for t in tasks if t.prior == "random")


def test_a_chain_token_cap_bounds_every_task() -> None:
    assert all(t.horizon * t.turn_tokens <= 16 for t in sample_tasks(range(16), max_chain_tokens=16))


def test_chance_is_the_success_rate_of_uniform_legal_play() -> None:
    params = next(t for t in sample_tasks(range(64)) if t.tools and t.failure == "visible")
    env, rng, wins = params.make(), random.Random(0), 0.0
    for episode in range(3000):
        env.reset(seed=episode)
        done = False
        while not done:
            move = rng.choice(env.legal_moves(env.state))
            if params.prior == "uses_tools":
                move = env.prior_answer(env.state, None) or move
            _, _, done, _, info = env.step(f"< {move}" if params.opening else move)
        wins += info["success"]
    assert abs(wins / 3000 - chance(params)) < 0.03


def test_sparse_failure_is_never_shown_and_fails_at_the_end() -> None:
    env = ProbeTaskEnv(horizon=3, choices=2, failure="sparse", key_seed=1)
    k = env.fixed_keys
    env.reset(seed=0)
    obs, reward, done, _, info = env.step(_other(env, k[0]))
    assert obs == "2" and not done and not info["failed_step"] and reward == 0.0
    env.step(k[1])
    _, reward, done, _, info = env.step(k[2])
    assert done and reward == 0.0 and info["success"] == 0.0
    env.reset(seed=0)
    assert [env.step(m)[1] for m in k] == [0.0, 0.0, 1.0]


def test_visible_failure_blocks_says_so_and_costs_a_turn() -> None:
    env = ProbeTaskEnv(horizon=4, choices=2, failure="visible", slack=1, key_seed=2)
    k = env.fixed_keys
    assert len(k) == 3
    env.reset(seed=0)
    obs, _, _, _, info = env.step(_other(env, k[0]))
    assert obs == "no 1" and info["failed_step"]
    assert env.step(k[0])[0] == "ok 2"
    env.step(k[1])
    _, reward, done, _, info = env.step(k[2])
    assert done and reward == 1.0 and info["success"] == 1.0


def test_the_move_after_a_fixed_opening_word_counts_and_a_missing_opening_is_invalid() -> None:
    env = ProbeTaskEnv(horizon=2, choices=2, opening=True, key_seed=3)
    k = env.fixed_keys
    env.reset(seed=0)
    _, _, _, _, info = env.step(k[0])  # the move without its opening: not a move
    assert info["invalid_action"]
    env.reset(seed=0)
    env.step(f"< {k[0]} x")
    _, reward, done, _, info = env.step(f"< {k[1]}")
    assert done and reward == 1.0 and not info["invalid_action"]


def test_a_look_reveals_the_key_ahead_costs_a_turn_and_its_price_comes_off_the_reward() -> None:
    env = ProbeTaskEnv(horizon=3, choices=4, failure="sparse", slack=1, tools=True, tool_cost=0.2, key_seed=4)
    k = env.fixed_keys
    env.reset(seed=0)
    obs, _, done, _, info = env.step("? x")
    assert obs == k[0] and not done and info["tool_calls"] == 1 and not info["invalid_action"]
    env.step(k[0])
    _, reward, done, _, info = env.step(k[1])
    assert done and info["success"] == 1.0 and reward == pytest.approx(0.8) and info["tool_calls"] == 1


def test_distractor_words_are_fixed_by_the_episode_seed_and_say_nothing_about_the_keys() -> None:
    env = ProbeTaskEnv(horizon=6, choices=2, failure="visible", slack=2, distractors=2, key_seed=5)
    obs = []
    for seed in (0, 0, 1):
        env.reset(seed=seed)
        obs.append([env.step("A")[0] for _ in range(3)])
    assert obs[0] == obs[1] != obs[2]
    assert all(len(o.split()) == 4 for o in obs[0])


@pytest.mark.parametrize("kwargs", [{"failure": "loud"}, {"slack": 4}, {"distractors": 4}, {"tool_cost": 0.1}])
def test_bad_family_arguments_are_config_errors(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        ProbeTaskEnv(horizon=4, **kwargs)


def test_the_format_prior_opens_each_turn_and_copies_a_look_under_uses_tools() -> None:
    env = ProbeTaskEnv(horizon=3, choices=3, failure="visible", slack=1, opening=True, tools=True, key_seed=6)
    rng = random.Random(0)
    copied = 0
    for _ in range(50):
        words, mask = random_episode(env, 3, rng, prior="uses_tools")
        spans, start = [], 0  # alternate runs of observation (mask 0) and action (mask 1) words
        for i in range(1, len(words) + 1):
            if i == len(words) or mask[i] != mask[start]:
                spans.append(words[start:i])
                start = i
        turns, obs = spans[1::2], spans[2::2]
        assert all(t[0] == "<" and len(t) == 3 for t in turns)
        for i, t in enumerate(turns[:-1]):
            if t[1] == "?":  # the next turn plays what the look returned
                assert turns[i + 1][1] == obs[i][0]
                copied += 1
    assert copied > 5
    with pytest.raises(ValueError, match="opening"):
        random_episode(env, 1, rng)


def test_a_random_prior_model_is_built_untrained_with_the_family_vocabulary(tmp_path) -> None:
    from transformers import AutoTokenizer

    env = ProbeTaskEnv(horizon=2, choices=2, opening=True)
    folder = build_probe_model(env, 2, folder=tmp_path / "m", prior="random")
    assert "<" in AutoTokenizer.from_pretrained(folder).get_vocab()
