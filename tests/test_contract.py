"""The env contract machinery: fork, snapshot, pool batching, and the checker itself."""

from __future__ import annotations

import pickle

import gymnasium as gym
import pytest
from toy_env import LeakyToyEnv, SquareTool, ToyEnv

import treegym
from treegym.envs import EnvPool, Snapshot, UnicodeText
from treegym.envs.checker import ForkContractError, check_fork_contract

ACTIONS = ["1", "2", "3", "x", "4"]


def _toy(*actions: str, **options: int) -> ToyEnv:
    """A ToyEnv reset with seed 0 and ``options``, then stepped through ``actions``."""
    env = ToyEnv()
    env.reset(seed=0, options=options)
    for action in actions:
        env.step(action)
    return env


def test_checker_passes_a_correct_env():
    check_fork_contract(ToyEnv, ACTIONS)


def test_checker_catches_state_shared_between_forks():
    with pytest.raises(ForkContractError, match="fork|original"):
        check_fork_contract(LeakyToyEnv, ACTIONS)


def test_fork_does_not_share_state():
    env = _toy("3", target=100)
    child = env.fork()
    child.step("5")
    assert env.state.total == 9 and child.state.total == 34
    assert child.tools is env.tools  # backends are shared


def test_snapshot_is_picklable_and_restores_exactly():
    env = _toy("2", target=100)
    snap = env.snapshot()
    env.step("7")
    env.restore(pickle.loads(pickle.dumps(snap)))
    assert env.state == snap.state
    assert env.step("1")[0] == "total 5"


def test_restore_rejects_a_snapshot_of_another_env_class():
    env = _toy()
    with pytest.raises(ValueError, match="cannot restore"):
        env.restore(Snapshot("SomethingElse", env.state))


def test_pool_batches_calls_of_shared_tool_into_one_call():
    tool = SquareTool()
    envs = [ToyEnv(tool) for _ in range(5)]
    for e in envs:
        e.reset(seed=0, options={"target": 1000})
    pool = EnvPool()
    out = pool.step(envs, ["1", "2", "bad", "3", "4"])
    assert tool.batches == [4]
    assert [out[i][0] for i in range(5)] == ["total 1", "total 4", "invalid", "total 9", "total 16"]
    assert pool.stats.tool_calls == 4 and pool.stats.batches == 1


def test_unicode_text_space_accepts_any_string_up_to_its_length():
    space = UnicodeText(5)
    assert space.contains("héllo") and space.contains("")
    assert not space.contains("toolong") and not space.contains(3)


def test_fork_of_a_non_treegym_env_is_a_clear_error():
    env = gym.make("CartPole-v1")
    with pytest.raises(TypeError, match="not a treegym env"):
        treegym.fork(env)


def test_fork_continues_the_parent_rng_stream_independently():
    env = _toy()
    child = env.fork()
    parent_draws = [env.reset()[0] for _ in range(3)]
    child_draws = [child.reset()[0] for _ in range(3)]
    assert parent_draws == child_draws
    assert len(set(parent_draws)) > 1


def test_restore_rejects_a_hand_made_snapshot_with_a_wrong_state_type():
    env = _toy()
    with pytest.raises(TypeError, match="snapshot state must be a ToyState"):
        env.restore(Snapshot("ToyEnv", ("not", "a", "state")))
    assert env.step("1")[0] == "total 1"  # the env still holds its own state
