"""treegym envs under Gymnasium's own tools: its vector envs, make_vec, and the "module:EnvId" form.

Gymnasium 1.x batches text spaces as tuples of strings, in SyncVectorEnv and in AsyncVectorEnv
without shared memory. With shared memory (AsyncVectorEnv's default) it would return stale
text, so treegym's text space refuses it and AsyncVectorEnv says to turn it off.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import gymnasium as gym
import numpy as np
import pytest

import treegym  # noqa: F401  (registers the ids)
from treegym.envs import fork, restore, snapshot

KEYS = {"horizon": 2, "choices": 2}  # ProbeKeys: say the turn's key (A or B), 0.5 per right turn
NO_SHARED_MEMORY = {"shared_memory": False}


def keys() -> tuple[str, ...]:
    return gym.make("ProbeKeys-v0", **KEYS).unwrapped.fixed_keys


def wrong(key: str) -> str:
    return "B" if key == "A" else "A"


def test_sync_vector_env_resets_and_steps_with_text_observations() -> None:
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("ProbeKeys-v0", **KEYS)] * 3)
    assert venv.single_observation_space == gym.make("ProbeKeys-v0").observation_space
    obs, info = venv.reset(seed=0)
    assert obs == ("go", "go", "go") and obs in venv.observation_space
    k = keys()
    obs, reward, terminated, truncated, info = venv.step((k[0], wrong(k[0]), "ü €"))
    assert obs == ("ok", "no", "no") and reward.tolist() == [0.5, 0.0, 0.0]
    assert not terminated.any() and not truncated.any()
    assert info["invalid_action"].tolist() == [False, False, True]
    obs, reward, terminated, _, info = venv.step((k[1], k[1], k[1]))
    assert terminated.all() and reward.tolist() == [0.5, 0.5, 0.5]
    assert info["success"].tolist() == [1.0, 0.0, 0.0] and info["_success"].all()
    # Gymnasium's next-step autoreset: the step after the end is a reset, whatever the action.
    obs, reward, terminated, *_ = venv.step(("A", "A", "A"))
    assert obs == ("go", "go", "go") and reward.tolist() == [0.0] * 3 and not terminated.any()


def test_the_sub_envs_of_a_vector_env_fork() -> None:
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("ProbeKeys-v0", **KEYS)] * 2)
    venv.reset(seed=0)
    k = keys()
    venv.step((k[0], k[0]))
    branch = fork(venv.envs[0])
    assert branch.step(k[1])[1:3] == (0.5, True)
    assert venv.step((wrong(k[1]), k[1]))[1].tolist() == [0.0, 0.5]  # the original never saw the branch


def test_make_vec_makes_a_vector_env_of_a_treegym_id() -> None:
    venv = gym.make_vec("ProbeKeys-v0", num_envs=2, **KEYS)
    assert isinstance(venv, gym.vector.SyncVectorEnv) and venv.num_envs == 2
    assert venv.reset(seed=0)[0] == ("go", "go")
    assert venv.step(("A", "B"))[1].tolist() in ([0.5, 0.0], [0.0, 0.5])


def test_async_vector_env_steps_text_envs_in_worker_processes() -> None:
    venv = gym.vector.AsyncVectorEnv([lambda: gym.make("TextHousehold-v0")] * 2, shared_memory=False)
    try:
        obs, info = venv.reset(seed=0)
        assert len(obs) == 2 and all(o.startswith("You are in a household") for o in obs)
        obs, reward, terminated, truncated, info = venv.step(("look", "<action>look</action> ü"))
        assert all(o.startswith("You are in the middle of a room") for o in obs)
        assert reward.dtype == np.float64 and not terminated.any()
    finally:
        venv.close()


def test_make_vec_async_works_without_shared_memory() -> None:
    venv = gym.make_vec("ProbeKeys-v0", num_envs=2, vectorization_mode="async", vector_kwargs=NO_SHARED_MEMORY, **KEYS)
    try:
        assert isinstance(venv, gym.vector.AsyncVectorEnv)
        assert venv.reset(seed=0)[0] == ("go", "go")
        k = keys()
        assert venv.step((k[0], wrong(k[0])))[0] == ("ok", "no")
    finally:
        venv.close()


def test_async_vector_env_with_shared_memory_refuses_text_instead_of_returning_stale_text() -> None:
    with pytest.raises(ValueError, match="shared_memory=False") as caught:
        gym.vector.AsyncVectorEnv([lambda: gym.make("ProbeKeys-v0")] * 2)
    assert "cannot go through shared memory" in str(caught.value.__cause__)


def test_gym_make_with_the_module_prefix_needs_no_import_of_treegym() -> None:
    code = textwrap.dedent("""
        import sys
        import gymnasium as gym
        assert "treegym" not in sys.modules
        env = gym.make("treegym:TreeSearchQA-v0", index="bm25", corpus_limit=200)
        obs, info = env.reset(seed=0)
        assert "treegym" in sys.modules and "<search>" in obs, obs
        obs, *_ = env.step("<search>Albert Einstein</search>")
        assert obs.strip().startswith("<information>"), obs
        venv = gym.make_vec("treegym:ProbeKeys-v0", num_envs=2)
        assert venv.reset(seed=0)[0] == ("go", "go")
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# ---- snapshot and restore carry the wrappers' state, as fork does ----------------------------


def test_restore_through_time_limit_puts_its_step_count_back() -> None:
    env = gym.make("ProbeKeys-v0", horizon=8, max_episode_steps=4)
    env.reset(seed=0)
    env.step("A")
    snap = snapshot(env)
    for _ in range(2):
        env.step("A")
    assert env.get_wrapper_attr("_elapsed_steps") == 3
    restore(env, snap)
    assert env.get_wrapper_attr("_elapsed_steps") == 1
    truncations = [env.step("A")[3] for _ in range(3)]
    assert truncations == [False, False, True]  # steps 2, 3, 4 of 4: the restored episode ends on time
    restore(env, snap)  # a snapshot is a value: it restores the same state twice
    assert env.get_wrapper_attr("_elapsed_steps") == 1


def test_restore_through_record_episode_statistics_puts_its_counters_back() -> None:
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("ProbeKeys-v0", **KEYS))
    env.reset(seed=0)
    env.step(keys()[0])
    snap = snapshot(env)
    *_, info = env.step(keys()[1])
    assert info["episode"]["r"] == 1.0 and env.episode_count == 1 and len(env.return_queue) == 1
    restore(env, snap)
    assert (env.episode_count, env.episode_returns, env.episode_lengths, len(env.return_queue)) == (0, 0.5, 1, 0)
    *_, info = env.step(wrong(keys()[1]))
    assert info["episode"]["r"] == 0.5 and info["episode"]["l"] == 2 and list(env.return_queue) == [0.5]


def test_a_wrapped_snapshot_pickles_and_refuses_a_differently_wrapped_env() -> None:
    import pickle

    env = gym.make("ProbeKeys-v0", horizon=8, max_episode_steps=4)
    env.reset(seed=0)
    env.step("A")
    snap = pickle.loads(pickle.dumps(snapshot(env)))
    env.step("A")
    restore(env, snap)
    assert env.get_wrapper_attr("_elapsed_steps") == 1
    bare = gym.make("ProbeKeys-v0", horizon=8)
    bare.reset(seed=0)
    with pytest.raises(ValueError, match="cannot restore one wrapped in"):
        restore(bare, snap)
    restore(bare, bare.unwrapped.snapshot())  # an env's own snapshot restores under any wrappers


# ---- gymnasium's env checker passes on every registered id ----------------------------------

LIGHT = {"TreeSearchQA": {"index": "bm25", "corpus_limit": 200}, "WebSearchQA": {"cache": False}}


def registered_ids() -> list[str]:
    return sorted(i for i, spec in gym.registry.items()
                  if isinstance(spec.entry_point, str) and spec.entry_point.startswith("treegym."))


@pytest.mark.parametrize("env_id", registered_ids())
def test_check_env_passes_with_render_mode_on_every_registered_id(env_id: str) -> None:
    from gymnasium.utils.env_checker import check_env

    kwargs = next((v for k, v in LIGHT.items() if env_id.startswith(k)), {})
    env = gym.make(env_id, render_mode="ansi", **kwargs)
    assert env.render_mode == "ansi"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    assert isinstance(env.unwrapped.render(), str)
