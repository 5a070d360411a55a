"""TextHousehold-v0(list_admissible=True): the observation lists the admissible commands in
verl-agent's layout, capped as documented, and the heuristic plays the same from that list."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest

import treegym  # noqa: F401  (registers the envs)
from treegym.agents.household import HouseholdHeuristic
from treegym.agents.rollout.episode import run_episode
from treegym.envs.core import success
from treegym.envs.household import listing
from treegym.envs.household.env import LIST_MAX_TOKENS, LIST_TOP_N, TextHouseholdEnv
from treegym.envs.household.tasks import make_task
from treegym.envs.registry import env_kwargs

pytest_plugins = ["model_fixtures"]  # the session-scoped `smollm2` fixture


def _walk(env: TextHouseholdEnv, task_id: str, steps: int, seed: int):
    """(observation, info) after reset and after each of ``steps`` random admissible commands."""
    rng = random.Random(seed)
    obs, info = env.reset(options={"task_id": task_id})
    yield obs, info
    for _ in range(steps):
        obs, _, terminated, truncated, info = env.step(rng.choice(info["admissible_commands"]))
        yield obs, info
        if terminated or truncated:
            return


@pytest.mark.parametrize(("split", "top_n", "max_tokens"), [("seen", LIST_TOP_N, LIST_MAX_TOKENS),
                                                         ("unseen", LIST_TOP_N, LIST_MAX_TOKENS), ("seen", 6, 120)])
def test_observation_lists_exactly_the_admissible_commands_or_their_documented_cap(split: str, top_n: int,
                                                                                    max_tokens: int) -> None:
    env = TextHouseholdEnv(split=split, list_admissible=True, list_top_n=top_n, list_max_tokens=max_tokens)
    cut = whole = 0
    for n, task_id in enumerate(env.task_ids()[:12]):
        goal = make_task(task_id).world.goal
        for obs, info in _walk(env, task_id, 12, seed=n):
            feedback, listed = listing.split_observation(obs)
            assert listed is not None and obs.endswith("].")
            admissible = [c for c in info["admissible_commands"] if c != "help"]
            ranked = listing.rank_commands(admissible, goal.task_type, goal.obj, goal.target)
            assert sorted(ranked) == sorted(admissible)
            if listing.estimated_tokens(listing.actions_line(ranked)) <= max_tokens:
                assert listed == ranked  # all of them, most relevant first
                whole += 1
            else:
                assert listed == ranked[:top_n]  # the N most relevant
                cut += 1
            assert feedback and feedback.strip()
    assert cut and (whole or max_tokens == LIST_MAX_TOKENS)  # the wider cap exercises both branches


def test_steps_follow_verl_agents_layout_task_then_feedback_then_the_list() -> None:
    env = TextHouseholdEnv(split="seen", list_admissible=True)
    obs, info = env.reset(options={"task_id": "seen-3"})
    task = make_task("seen-3").description
    assert obs.rsplit("\n", 2)[-2] == f"Your task is to: {task}."  # the opening prompt ends with the task, then the list
    assert obs.rsplit("\n", 1)[-1].startswith("Your admissible actions of the current situation are: [")
    cmd = next(c for c in info["admissible_commands"] if c.startswith("go to "))
    obs, *_ = env.step(cmd)
    lines = obs.split("\n")
    assert lines[0] == f"Your task is to: {task}."
    assert lines[1].startswith("You arrive at ")
    assert lines[2].startswith("Your admissible actions of the current situation are: [")


def test_the_cap_keeps_the_goal_objects_commands_first() -> None:
    ranked = listing.rank_commands(["go to cabinet 2", "look", "take mug 1 from countertop 1", "take cup 1 from countertop 1",
                                    "go to sinkbasin 1", "go to bed 1", "go to cabinet 1"],
                                   "pick_clean_then_place_in_recep", "mug", "coffeemachine")
    assert ranked == ["take mug 1 from countertop 1", "go to cabinet 1", "go to sinkbasin 1", "go to cabinet 2",
                      "go to bed 1", "look", "take cup 1 from countertop 1"]


def test_plain_env_keeps_alfworlds_text() -> None:
    plain, listed = TextHouseholdEnv(split="seen"), TextHouseholdEnv(split="seen", list_admissible=True)
    a, _ = plain.reset(options={"task_id": "seen-5"})
    b, _ = listed.reset(options={"task_id": "seen-5"})
    assert "admissible actions" not in a and b.startswith(a + "\n")
    assert listing.split_observation(a) == (a, None)


def test_training_variant_lists_the_commands_and_evaluation_success_is_unshaped() -> None:
    kwargs = env_kwargs("TextHousehold-Train-v0")
    assert kwargs["list_admissible"] is True
    assert (kwargs["list_top_n"], kwargs["list_max_tokens"]) == (LIST_TOP_N, LIST_MAX_TOKENS)  # the documented cap
    env = gym.make("TextHousehold-Train-v0", split="seen")
    obs, _ = env.reset(options={"task_id": "seen-0"})
    assert "Your admissible actions of the current situation are: [" in obs


def test_heuristic_success_is_unchanged_with_the_list_on() -> None:
    """It chooses from the listed commands; on these tasks the cap never hides its choice."""
    plain, listed = TextHouseholdEnv(split="seen"), TextHouseholdEnv(split="seen", list_admissible=True)
    agent = HouseholdHeuristic()
    for task_id in plain.task_ids()[:40]:
        a = run_episode(plain, agent, options={"task_id": task_id}, max_turns=10)
        b = run_episode(listed, agent, options={"task_id": task_id}, max_turns=10)
        assert success(a.info) == success(b.info), task_id
        assert [m["content"] for m in a.messages[1::2]] == [m["content"] for m in b.messages[1::2]], task_id


def test_warm_start_imitates_the_heuristic_choosing_from_the_listed_commands() -> None:
    from treegym.agents.experts import make_expert
    from treegym.envs.registry import family
    from treegym.trainers.config import load_config
    from treegym.trainers.prompts import make_env
    from treegym.trainers.sft_data import collect_episodes

    cfg = load_config(None, [("env", "TextHousehold-v0")])
    env = make_env(cfg, cfg.run.train_split)  # what the warm start collects on
    expert = make_expert(cfg.env, family(cfg.env).expert, cfg.sampler.max_turns)
    episodes = collect_episodes(env, expert, [{"task_id": f"train-{i}"} for i in range(6)], max_turns=cfg.sampler.max_turns)
    assert any(ep.success for ep in episodes)
    for ep in episodes:
        for k in range(1, len(ep.messages), 2):
            listed = listing.split_observation(ep.messages[k - 1]["content"])[1]
            assert listed is not None and ep.messages[k]["content"] in listed  # the model sees what it imitates


def test_action_ranker_scores_each_listed_command_by_its_log_likelihood_and_plays_one(smollm2) -> None:
    import torch

    from treegym.agents.ranking import ActionRanker

    model, tok = smollm2
    ranker = ActionRanker(model, tok)
    env = TextHouseholdEnv(split="seen", list_admissible=True)
    obs, _ = env.reset(options={"task_id": "seen-1"})
    obs, *_ = env.step(env.listed()[0])
    listed = listing.split_observation(obs)[1]
    got = ranker.scores(obs, listed[:3])
    # The shared-prefix batch gives what one plain forward pass per command gives.
    prefix = tok.encode(tok.apply_chat_template([{"role": "user", "content": obs}], tokenize=False,
                                                add_generation_prompt=True), add_special_tokens=False)
    for cmd, score in zip(listed[:3], got):
        ids = tok.encode(cmd, add_special_tokens=False)
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([prefix + ids])).logits[0].float(), -1)
        want = sum(float(logp[len(prefix) + k - 1, t]) for k, t in enumerate(ids)) / len(ids)
        assert score == pytest.approx(want, abs=1e-3)
    assert ranker.act([{"role": "user", "content": obs}]) in listed
