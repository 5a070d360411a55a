"""Distinct sibling branches on a real probe model: resampled beginnings, and exclusion (sampling
the first token without replacement) where the policy is deterministic."""

from __future__ import annotations

import pytest
import torch

from treegym.agents.policy import SamplingParams
from treegym.agents.rollout.distinct import distinct_action_share
from treegym.agents.rollout.samplers import sample_trees
from treegym.agents.sampling import sample_tokens
from treegym.envs.probe_model import build_probe_model
from treegym.envs.probes import ProbeMazeEnv

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True, stop=())


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from treegym.agents.hf_policy import HFPolicy

    folder = build_probe_model(ProbeMazeEnv(horizon=4, doors=3), turn_tokens=3,
                               folder=tmp_path_factory.mktemp("maze") / "m", steps=60)
    return HFPolicy.from_pretrained(str(folder), device="cpu")


def _grow(policy, exclude: bool, retries: int = 0):
    # Greedy stands in for a collapsed policy: every draw at a state is the same move.
    return sample_trees(policy, lambda: ProbeMazeEnv(horizon=4, doors=3), [0, 1], m=1, n=2, l=1, k=64,
                        params=GREEDY, expansion="with_replacement", max_turns=4, mode="raw", seed=0,
                        distinct=1, distinct_retries=retries, distinct_exclude=exclude)


def _sibling_heads(batch) -> list[list[int]]:
    return [[tree.nodes[c].turn.action_ids[0] for c in node.children]
            for tree in batch.trees for node in tree.nodes if len(node.children) > 1]


def test_exclusion_makes_a_deterministic_policys_siblings_begin_differently(policy) -> None:
    groups = _sibling_heads(_grow(policy, exclude=True))
    assert groups
    assert all(len(set(heads)) == len(heads) for heads in groups)


def test_resampling_alone_cannot_separate_a_deterministic_policys_siblings(policy) -> None:
    groups = _sibling_heads(_grow(policy, exclude=False, retries=4))
    assert any(len(set(heads)) < len(heads) for heads in groups)


def test_an_excluded_branch_records_the_policys_own_log_prob_and_a_whole_turn(policy) -> None:
    batch = _grow(policy, exclude=True)
    model = policy.model
    checked = 0
    for tree in batch.trees:
        for node in tree.nodes:
            if node.round != 1 or node.turn is None or tree.nodes[node.parent].round != 0:
                continue  # a branch's first turn
            context = list(tree.prompt_ids)
            for nid in tree.path(node.parent) if node.parent else []:
                context += tree.nodes[nid].turn.action_ids + tree.nodes[nid].turn.obs_ids
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([context])).logits[0, -1].float()
            first = node.turn.action_ids[0]
            assert node.turn.action_logprobs[0] == pytest.approx(torch.log_softmax(logits, -1)[first].item(), abs=1e-4)
            assert len(node.turn.action_ids) == GREEDY.max_new_tokens
            checked += 1
    assert checked


def test_sample_tokens_never_picks_an_excluded_token_and_reports_the_unmasked_log_prob() -> None:
    logits = torch.tensor([[4.0, 1.0, 0.0]]).repeat(300, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, lps = sample_tokens(logits, 1.0, 1.0, gen, exclude=(0,))
    assert set(tokens.tolist()) == {1, 2}
    full = torch.log_softmax(logits[0], -1)
    assert all(lp == pytest.approx(full[t].item()) for t, lp in zip(tokens.tolist(), lps.tolist()))
    greedy, _ = sample_tokens(logits[:1], 0.0, 1.0, None, exclude=(0,))
    assert greedy.item() == 1
    everything, _ = sample_tokens(logits[:1], 0.0, 1.0, None, exclude=(0, 1, 2))
    assert everything.item() == 0  # nothing left to pick: the exclusion is ignored


# ---- distinct moves (the env's parsed action), not distinct first tokens ---------------------

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=3, ignore_eos=True, stop=())


def _grow_moves(policy, actions: bool, seed: int):
    return sample_trees(policy, lambda: ProbeMazeEnv(horizon=4, doors=3), [0, 1, 2], m=1, n=3, l=1, k=64,
                        params=SAMPLED, expansion="with_replacement", max_turns=4, mode="raw", seed=seed,
                        distinct_actions=actions, distinct_retries=4)


def test_distinct_actions_make_siblings_differ_in_their_move_more_often(policy) -> None:
    on = [distinct_action_share(_grow_moves(policy, True, s).trees) for s in range(3)]
    off = [distinct_action_share(_grow_moves(policy, False, s).trees) for s in range(3)]
    assert sum(off) / 3 < 1.0  # without the option the trained policy repeats its move
    assert sum(on) / 3 > sum(off) / 3


def test_a_redrawn_move_records_the_policys_own_log_probs(policy) -> None:
    batch = _grow_moves(policy, True, 0)
    assert batch.budget.resampled > 0
    checked = 0
    for tree in batch.trees:
        for node in tree.nodes:
            if node.turn is None or node.round != 1 or tree.nodes[node.parent].round != 0:
                continue
            context = list(tree.prompt_ids)
            for nid in tree.path(node.parent) if node.parent else []:
                context += tree.nodes[nid].turn.action_ids + tree.nodes[nid].turn.obs_ids
            ids = context + node.turn.action_ids
            with torch.no_grad():
                logits = policy.model(input_ids=torch.tensor([ids])).logits[0].float()
            logp = torch.log_softmax(logits, -1)
            own = [logp[len(context) - 1 + j, t].item() for j, t in enumerate(node.turn.action_ids)]
            assert node.turn.action_logprobs == pytest.approx(own, abs=1e-4)
            checked += 1
    assert checked


def test_the_action_key_is_the_parsed_move_not_the_text() -> None:
    import gymnasium as gym

    import treegym  # noqa: F401  (registers the envs)
    from treegym.envs.core import base_env

    env = base_env(gym.make("TextHousehold-v0"), bare=True)
    _, info = env.reset(seed=0)
    go = sorted(c for c in info["admissible_commands"] if c.startswith("go to "))
    assert len(go) >= 2
    assert env.action_key(go[0]) == env.action_key(f"  {go[0].replace(' ', '   ')}\n")
    assert env.action_key(go[0]) == env.action_key(f"<think>first</think><action>{go[0]}</action>")
    assert env.action_key(go[0]) != env.action_key(go[1])
    # Every command that is not admissible does the same thing (nothing, and the penalty): one move.
    assert env.action_key("go to the moon") == env.action_key("fly") == env.action_key("") != env.action_key(go[0])
    maze = ProbeMazeEnv(horizon=4, doors=3)
    maze.reset(seed=0)
    assert maze.action_key("door1 x y") == maze.action_key("door1 z")
    assert maze.action_key("door1 x") != maze.action_key("door2 x")
