"""The probe envs: their rules, the fork contract, and the format prior of their tiny models."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest

import treegym  # noqa: F401  (registers the probe ids)
from treegym.envs.checker import check_fork_contract
from treegym.envs.probe_model import build_probe_model, random_episode
from treegym.envs.probes import PROBE_IDS, ProbeKeysEnv, ProbeLockEnv, ProbeLookupEnv
from treegym.errors import ConfigError, TreegymError


def play(env: gym.Env, actions: list[str], seed: int = 0) -> list[tuple]:
    env.reset(seed=seed)
    return [env.step(a) for a in actions]


@pytest.mark.parametrize("env_id", list(PROBE_IDS))
def test_probe_envs_keep_the_fork_contract(env_id: str) -> None:
    check_fork_contract(lambda: gym.make(env_id, horizon=4), ["? A", "A x", "B", "A"], alt_actions=["B", "B", "B"])


@pytest.mark.parametrize("env_id", list(PROBE_IDS))
def test_terminal_step_reports_success_and_em(env_id: str) -> None:
    env = gym.make(env_id, horizon=3)
    steps = play(env, ["A", "B", "A"])
    *_, (obs, _, terminated, _, info) = steps
    assert terminated and info["success"] == info["em"] and info["success"] in (0.0, 1.0)
    assert all("success" not in s[4] for s in steps[:-1])
    with pytest.raises(TreegymError, match="after the episode ended"):
        env.step("A")


def test_lock_pays_only_at_the_end_for_the_whole_sequence() -> None:
    env = ProbeLockEnv(horizon=4, choices=2, key_seed=3)
    keys = list(env.fixed_keys)
    steps = play(env, keys)
    assert [s[1] for s in steps] == [0.0, 0.0, 0.0, 1.0]
    assert [s[0] for s in steps[:-1]] == ["2", "3", "4"]  # where it is, not whether it was right
    wrong = keys[:3] + [next(m for m in env.moves if m != keys[3])]
    assert [s[1] for s in play(env, wrong)] == [0.0] * 4


def test_keys_pays_each_correct_turn() -> None:
    env = ProbeKeysEnv(horizon=4, choices=4)
    keys = list(env.fixed_keys)
    steps = play(env, [keys[0], "x", keys[2] + " A A", keys[3]])
    assert [s[1] for s in steps] == [0.25, 0.0, 0.25, 0.25]
    assert [s[0] for s in steps[:3]] == ["ok", "no", "ok"]
    assert steps[1][4]["invalid_action"]  # "x" is not a legal move


def test_lookup_reveals_the_key_through_a_tool_call() -> None:
    env = ProbeLookupEnv(horizon=2, choices=4)
    env.reset(seed=11)
    obs, reward, *_ , info = env.step("? x x")
    assert obs in env.moves and reward == 0.0 and info["tool_calls"] == 1
    *_, terminated, _, info = env.step(obs)
    assert terminated and info["success"] == 1.0
    # Without looking, the answer is a guess: right for about 1 in `choices` keys.
    hits = []
    for seed in range(200):
        env.reset(seed=seed)
        env.step("A")
        hits.append(env.step("A")[4]["success"])
    assert 0.15 < sum(hits) / len(hits) < 0.35


def test_lookup_draws_keys_from_the_task_seed() -> None:
    env = ProbeLookupEnv(horizon=2, choices=4)
    keys = set()
    for seed in range(40):
        env.reset(seed=seed)
        keys.add(env.state.keys[0])
    assert keys == set(env.moves)


@pytest.mark.parametrize("kwargs", [{"horizon": 0}, {"horizon": 17}, {"choices": 1}, {"choices": 7}])
def test_bad_probe_shape_is_a_config_error(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        ProbeLockEnv(**kwargs)


def test_random_episode_follows_the_rules_and_the_turn_length() -> None:
    env = ProbeLockEnv(horizon=3, choices=2)
    words, mask = random_episode(env, turn_tokens=5, rng=random.Random(0))
    assert len(words) == 1 + 3 * 5 + 2  # prompt, 3 turns, 2 observations (none after the last)
    assert sum(mask) == 15
    assert words[1] in env.moves and words[7] in env.moves


def test_probe_model_learns_the_format_but_not_the_answer(tmp_path) -> None:
    """After the prior, the first word of a turn is a legal move, each about equally likely."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    env = ProbeLockEnv(horizon=2, choices=2)
    folder = build_probe_model(env, turn_tokens=2, folder=tmp_path / "m", steps=100)
    model, tok = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    ids = tok.convert_tokens_to_ids(["go"])
    with torch.no_grad():
        probs = model(input_ids=torch.tensor([ids])).logits[0, -1].softmax(-1)
    legal = probs[tok.convert_tokens_to_ids(list(env.moves))]
    assert float(legal.sum()) > 0.8
    assert float(legal.min() / legal.max()) > 0.5


def test_maze_blocks_a_wrong_move_says_so_and_pays_only_past_the_last_door() -> None:
    env = gym.make("ProbeMaze-v0", horizon=5, doors=3).unwrapped
    keys = list(env.fixed_keys)
    wrong = "B" if keys[0] == "A" else "A"
    env.reset(seed=0)
    obs, reward, term, _, info = env.step(f"{wrong} x x")
    assert obs == "no 1" and info["failed_step"] and not info["invalid_action"] and reward == 0.0 and not term
    obs, _, _, _, info = env.step(keys[0])
    assert obs == "ok 2" and not info["failed_step"] and info["doors_passed"] == 1
    env.step(keys[1])
    obs, reward, term, _, info = env.step(keys[2])  # the last door, at turn 4 of 5: the episode ends
    assert term and reward == 1.0 and info["success"] == 1.0 and obs == ""


def test_maze_that_runs_out_of_turns_pays_nothing_and_flags_garbage_as_invalid() -> None:
    env = gym.make("ProbeMaze-v0", horizon=3, doors=2).unwrapped
    env.reset(seed=0)
    _, _, _, _, info = env.step("%%%")
    assert info["invalid_action"] and info["failed_step"]
    wrong = "B" if env.fixed_keys[0] == "A" else "A"
    env.step(wrong)
    _, reward, term, _, info = env.step(env.fixed_keys[0])
    assert term and reward == 0.0 and info["success"] == 0.0


def test_maze_needs_doors_within_its_turns() -> None:
    with pytest.raises(ConfigError, match="doors"):
        gym.make("ProbeMaze-v0", horizon=4, doors=5)


def test_maze_format_prior_pads_episodes_that_end_early(tmp_path) -> None:
    env = gym.make("ProbeMaze-v0", horizon=4, doors=2).unwrapped
    folder = build_probe_model(env, 2, folder=tmp_path / "m", steps=3)
    assert (folder / "model.safetensors").exists()


def test_a_uses_tools_prior_answers_with_the_looked_up_key_and_looks_at_the_format_rate() -> None:
    env = ProbeLookupEnv(horizon=2, choices=3)
    rng = random.Random(0)
    looked = right = 0
    for _ in range(300):
        words, _ = random_episode(env, 2, rng, prior="uses_tools")
        # go | ? w | KEY | answer w   (a look)   or   go | A w | go | answer w
        if words[1] == "?":
            looked += 1
            right += words[4] == words[3]
    assert 50 < looked < 100  # 1 in 4 first turns, as under the uniform prior
    assert right == looked  # every look is followed by its result as the answer


def test_the_uniform_prior_does_not_use_the_result() -> None:
    env = ProbeLookupEnv(horizon=2, choices=3)
    rng = random.Random(0)
    looks = [w for w in (random_episode(env, 2, rng)[0] for _ in range(300)) if w[1] == "?"]
    assert 0.15 < sum(w[4] == w[3] for w in looks) / len(looks) < 0.55  # about 1 in 3


def test_a_probe_models_cache_folder_names_a_non_default_prior() -> None:
    from treegym.envs.probe_model import probe_model_folder

    env = ProbeLookupEnv(horizon=2, choices=3)
    assert probe_model_folder(env, 4) != probe_model_folder(env, 4, prior="uses_tools")
    with pytest.raises(ValueError, match="prior"):
        build_probe_model(env, 4, prior="clairvoyant")
