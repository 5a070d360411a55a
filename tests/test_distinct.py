"""Distinct sibling branches on a real probe model: resampled beginnings, and exclusion (sampling
the first token without replacement) where the policy is deterministic."""

from __future__ import annotations

import pytest
import torch

from treegym.agents.policy import SamplingParams
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
