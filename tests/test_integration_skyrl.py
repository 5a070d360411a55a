"""treegym envs under SkyRL-gym: made by ``skyrl_gym.make`` and played with SkyRL's own
``init``/``step`` loop (the generator's: init once with the row's prompt, then step each model
turn until ``done``, appending the returned observations to the chat), for every family and probe.

The "model" is treegym's scripted expert (QA and household) or a fixed move (probes); each episode
is checked against the same actions played on the plain gymnasium env.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest

import treegym  # noqa: F401  (registers the ids)

skyrl_gym = pytest.importorskip("skyrl_gym", reason="needs pip install 'treegym[skyrl]'")

from treegym.envs.probes import PROBE_IDS  # noqa: E402
from treegym.integrations.skyrl import TreegymTextEnv, register_envs  # noqa: E402

FAMILY_IDS = ("TreeSearchQA-v0", "WebSearchQA-v0", "TextHousehold-v0")
QA_KW = {"index": "bm25", "corpus_limit": 300}  # BM25 over a 300-passage slice
KWARGS = {"TreeSearchQA-v0": QA_KW}
ROW_PROMPT = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": ""}]


def policy(env_id: str):
    """The scripted "model": messages -> one turn."""
    from treegym.agents.household import HouseholdHeuristic
    from treegym.agents.scripted import HeuristicQAAgent

    if env_id == "TextHousehold-v0":
        return HouseholdHeuristic().act
    if env_id in FAMILY_IDS:
        return HeuristicQAAgent().act
    return lambda messages: "A"


def row(env_id: str) -> dict:
    """A SkyRL dataset row's extras: the task (first task id, or seed 3) in ``extra_info``, as SkyRL's data scripts write it."""
    ids = gym.make(env_id, **KWARGS.get(env_id, {})).unwrapped.task_ids()
    task = {"task_id": ids[0]} if ids else {"seed": 3}
    return {"reward_spec": {"method": "rule"}, "extra_info": task}


def skyrl_episode(env, act, prompt) -> tuple[list[dict], list[str], list[float], dict]:
    """SkyRL's generator loop over one env: the chat, the actions, the rewards, the last metadata."""
    chat, _ = env.init(prompt)
    actions, rewards, done, metadata = [], [], False, {}
    while not done:
        action = act(chat)
        out = env.step(action)
        chat += [{"role": "assistant", "content": action}, *out["observations"]]
        actions.append(action)
        rewards.append(out["reward"])
        done, metadata = out["done"], out["metadata"]
        assert len(actions) <= 60, "the env must end its own episodes"
    return chat, actions, rewards, metadata


@pytest.mark.parametrize("env_id", [*FAMILY_IDS, *PROBE_IDS])
def test_every_env_plays_through_skyrl_gyms_make_and_step_loop_as_on_gymnasium(env_id: str) -> None:
    register_envs()
    extras = row(env_id)
    env = skyrl_gym.make(env_id, env_config={"env_kwargs": KWARGS.get(env_id, {})}, extras=extras)
    assert isinstance(env, TreegymTextEnv) and env.spec.id == env_id
    chat, actions, rewards, metadata = skyrl_episode(env, policy(env_id), ROW_PROMPT)

    # The same actions on the plain env give the same text, rewards and ending.
    plain = gym.make(env_id, **KWARGS.get(env_id, {}))
    task = extras["extra_info"]
    first, _ = plain.reset(seed=task.get("seed"), options={"task_id": task["task_id"]} if "task_id" in task else None)
    assert chat[:2] == [ROW_PROMPT[0], {"role": "user", "content": first}]  # the row's empty message is dropped
    expected = []
    for action in actions:
        obs, reward, terminated, truncated, info = plain.step(action)
        expected.append(reward)
    assert rewards == expected and (terminated or truncated)
    assert "success" in metadata and metadata["success"] == info["success"]
    assert env.get_metrics()["return"] == pytest.approx(sum(expected))
    # Labels stay in the env: what SkyRL logs carries no gold answers.
    assert "answers" not in metadata and "supporting_ids" not in metadata
    # SkyRL aggregates the metrics itself.
    assert TreegymTextEnv.aggregate_metrics([env.get_metrics()])["turns"] == len(actions)


def test_a_fork_mid_episode_is_an_independent_branch() -> None:
    register_envs(["TextHousehold-v0"])
    env = skyrl_gym.make("TextHousehold-v0", extras={"task_id": row("TextHousehold-v0")["extra_info"]["task_id"]})
    chat, _ = env.init([])
    admissible = env.last_info["admissible_commands"]
    env.step("look")
    branch = env.fork()
    deep = copy.deepcopy(env)

    a = branch.step(admissible[0])  # "go to cabinet 1"
    b = env.step(admissible[-1])  # "look"
    assert a["observations"] != b["observations"]
    assert branch.turns == env.turns == 2 and deep.turns == 1
    # The deepcopy is a third branch at the fork point: it sees neither step.
    c = deep.step(admissible[-1])
    assert c["observations"] == b["observations"] and c["metadata"] == b["metadata"]
    # And each branch goes on from its own state.
    assert branch.step("look")["observations"] != env.step("look")["observations"]


def test_samples_of_one_env_share_its_template_and_a_step_after_the_end_changes_nothing() -> None:
    register_envs(["ProbeKeys-v0"])
    a = skyrl_gym.make("ProbeKeys-v0", extras={"seed": 0})
    b = skyrl_gym.make("ProbeKeys-v0", extras={"seed": 0})
    assert a.env is not b.env and a.env.unwrapped.fixed_keys == b.env.unwrapped.fixed_keys
    a.init([])
    while not a.step("A")["done"]:
        pass
    after = a.step("A")
    assert after["done"] and after["reward"] == 0.0 and after["observations"] == []


def test_every_family_and_probe_is_registered_by_default() -> None:
    assert set(register_envs()) == {*FAMILY_IDS, *PROBE_IDS} <= set(skyrl_gym.registry)


def test_registering_refuses_an_id_skyrl_gym_already_uses_for_another_env() -> None:
    from treegym.errors import ConfigError

    with pytest.raises(ConfigError, match="not treegym's"):
        register_envs(["gsm8k"])
    assert register_envs(["ProbeKeys-v0"]) == register_envs(["ProbeKeys-v0"])  # idempotent
