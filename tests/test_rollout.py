"""Chain and tree samplers on real sampling: SmolLM2-135M over TreeSearchQA-v0 (a 300-doc slice)."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest

import treegym  # noqa: F401
from treegym.agents.policy import SamplingParams
from treegym.agents.rollout.branching import Forest, get_rule
from treegym.agents.rollout.context import TokenContext
from treegym.agents.rollout.samplers import sample_chains, sample_trees, to_rollout
from treegym.agents.rollout.types import Budget, Node, Tree, Turn
from treegym.agents.tree_html import tree_html
from treegym.envs import fork
from treegym.errors import ConfigError

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=6, seed=1)


@pytest.fixture(scope="module")
def policy():
    from treegym.agents.hf_policy import HFPolicy

    return HFPolicy.from_pretrained("smollm2", device="cpu")


@pytest.fixture(scope="module")
def env():
    return gym.make("TreeSearchQA-v0", corpus_limit=300)


@pytest.fixture(scope="module")
def prompts(env):
    return [{"task_id": it.id} for it in env.unwrapped.items[:2]]


@pytest.fixture(scope="module")
def tree_batch(policy, env, prompts):
    return sample_trees(policy, env, prompts[:1], m=2, n=2, l=1, k=3, params=PARAMS, max_turns=2, seed=0)


def _all_turn_nodes(trees):
    return [node for tree in trees for node in tree.nodes if node.turn is not None]


def test_tree_sampler_grows_m_trees_per_prompt_with_k_leaves_kept(tree_batch):
    assert [(t.prompt_index, t.tree_index) for t in tree_batch.trees] == [(0, 0), (0, 1)]
    for tree in tree_batch.trees:
        # one initial chain plus one new leaf per expanded node (l=1 round of n=2)
        assert len(tree.expanded) == 2
        assert len(tree.leaves()) == 3
        assert len(tree.kept_leaves) == 3
        assert all(tree.nodes[i].terminal and tree.nodes[i].reward is not None for i in tree.kept_leaves)
    assert len(tree_batch.rollouts) == 2 * 3
    assert tree_batch.budget.trajectories == 6


def test_every_leaf_path_is_the_prompt_followed_by_its_turns(tree_batch):
    for r in tree_batch.rollouts:
        tree = tree_batch.trees[2 * r.prompt_index + r.tree_index]
        expected = list(tree.prompt_ids)
        for nid in r.node_path:
            turn = tree.nodes[nid].turn
            expected += turn.action_ids + turn.obs_ids
        assert r.token_ids == expected
        assert r.node_path == tree.path(r.leaf)
        assert len(r.loss_mask) == len(r.behaviour_logprobs) == len(r.turn_of_token) == len(r.token_ids)


def test_loss_mask_covers_exactly_the_sampled_action_tokens(tree_batch):
    for r in tree_batch.rollouts:
        tree = tree_batch.trees[2 * r.prompt_index + r.tree_index]
        turns = [tree.nodes[nid].turn for nid in r.node_path]
        masked = [tok for tok, m in zip(r.token_ids, r.loss_mask) if m]
        assert masked == [tok for t in turns for tok in t.action_ids]
        assert [lp for lp, m in zip(r.behaviour_logprobs, r.loss_mask) if m] == [lp for t in turns for lp in t.action_logprobs]
        assert all(lp == 0.0 for lp, m in zip(r.behaviour_logprobs, r.loss_mask) if not m)
        assert r.loss_mask[: len(tree.prompt_ids)] == [0] * len(tree.prompt_ids)
        for t, turn in enumerate(turns):
            assert sum(1 for x in r.turn_of_token if x == t) == len(turn.action_ids)
            assert len(turn.action_logprobs) == len(turn.action_ids) > 0


def test_forked_branches_share_their_ancestors_tokens(tree_batch):
    shared = 0
    for tree in tree_batch.trees:
        by_leaf = {r.leaf: r for r in tree_batch.rollouts if (r.prompt_index, r.tree_index) == (tree.prompt_index, tree.tree_index)}
        for a in by_leaf.values():
            for b in by_leaf.values():
                if a.leaf >= b.leaf:
                    continue
                common = 0
                while common < min(len(a.node_path), len(b.node_path)) and a.node_path[common] == b.node_path[common]:
                    common += 1
                prefix = len(tree.prompt_ids) + sum(
                    len(tree.nodes[n].turn.action_ids) + len(tree.nodes[n].turn.obs_ids) for n in a.node_path[:common]
                )
                assert a.token_ids[:prefix] == b.token_ids[:prefix]
                shared += common
        # a branch grown in round 1 hangs under an expanded node (the root or a turn)
        for node in tree.nodes:
            if node.round == 1 and tree.nodes[node.parent].round == 0:
                assert node.parent in tree.expanded
    assert shared >= 0


def test_budget_counts_each_unique_node_once(tree_batch):
    nodes = _all_turn_nodes(tree_batch.trees)
    budget = tree_batch.budget
    assert budget.generated_tokens == sum(len(n.turn.action_ids) for n in nodes)
    assert budget.env_steps == len(nodes)
    assert budget.tool_calls == sum(n.turn.tool_calls for n in nodes)
    assert budget.prefill_tokens > 0
    # re-prefilling every node's full context would cost at least this much
    full = sum(len(t.prompt_ids) for t in tree_batch.trees)
    assert budget.prefill_tokens + budget.reused_tokens >= full


def test_budgets_add_counter_by_counter():
    one = Budget(generated_tokens=3, prefill_tokens=10, tool_calls=1, trajectories=2, env_steps=4, resampled=1)
    two = Budget(generated_tokens=5, reused_tokens=7, trajectories=1, env_steps=2, tool_rounds=1)
    assert one + two == Budget(generated_tokens=8, prefill_tokens=10, reused_tokens=7, tool_calls=1, trajectories=3,
                               env_steps=6, tool_rounds=1, resampled=1)
    assert Budget() + one == one


def test_every_turn_keeps_an_env_snapshot_that_restores_its_state(tree_batch, env):
    for tree in tree_batch.trees:
        for node in tree.nodes[1:]:
            assert node.turn.snapshot is not None
            assert node.turn.snapshot.state.turn == node.depth
    node = tree_batch.trees[0].nodes[1]
    probe = fork(env)
    treegym.envs.restore(probe, node.turn.snapshot)
    assert probe.unwrapped.state == node.turn.snapshot.state


def test_expansion_without_replacement_never_picks_a_node_twice(policy, env, prompts):
    batch = sample_trees(policy, env, prompts[:1], m=1, n=2, l=2, k=10, params=PARAMS, max_turns=2,
                         expansion="without_replacement", seed=3)
    tree = batch.trees[0]
    assert len(tree.expanded) == len(set(tree.expanded)) >= 2
    assert batch.budget.generated_tokens == sum(len(n.turn.action_ids) for n in tree.nodes[1:])


def test_choose_nodes_without_replacement_exhausts_candidates_then_stops():
    nodes = [Node(0, None, 0, None, children=[1]), Node(1, 0, 1, _turn(), children=[2]), Node(2, 1, 2, _turn(), terminal=True)]
    tree = Tree(0, 0, [1], nodes)
    rng = random.Random(0)
    picked = []
    for _ in range(3):
        chosen = [node for _, node in get_rule("without_replacement")(Forest([tree], 2, 1, rng))]
        tree.expanded += chosen
        picked += chosen
    assert sorted(picked) == [0, 1]  # the root and the unfinished turn; never the leaf, never twice
    with_repl = get_rule("with_replacement")(Forest([tree], 50, 1, rng))
    assert {node for _, node in with_repl} == {0, 1}


def test_chain_sampler_gives_group_size_independent_chains(policy, env, prompts):
    batch = sample_chains(policy, env, prompts, group_size=2, params=PARAMS, max_turns=2, mode="raw")
    assert len(batch.trees) == 2 and len(batch.rollouts) == 4
    for tree in batch.trees:
        assert len(tree.nodes[0].children) == 2
        assert all(len(n.children) <= 1 for n in tree.nodes[1:])  # no branching below the root
        paths = [set(tree.path(leaf)) for leaf in tree.kept_leaves]
        assert len(paths) == 2 and not paths[0] & paths[1]
    assert [r.prompt_index for r in batch.rollouts] == [0, 0, 1, 1]
    nodes = _all_turn_nodes(batch.trees)
    assert batch.budget.generated_tokens == sum(len(n.turn.action_ids) for n in nodes)


def test_unclosed_tag_is_cut_at_max_new_tokens_and_is_an_invalid_action(policy, env, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=2, seed=5)
    batch = sample_chains(policy, env, prompts[:1], group_size=2, params=params, max_turns=1)
    for node in _all_turn_nodes(batch.trees):
        assert node.turn.finish_reason == "length" and len(node.turn.action_ids) == 2
        assert node.turn.invalid
        assert node.terminal and node.turn.truncated  # the sampler's max_turns ends it


def test_chat_context_matches_the_chat_template_token_for_token(policy):
    tok = policy.tokenizer
    ctx = TokenContext(tok, "chat")
    action = "<think>x</think><search>Paris</search>"
    obs = "\n\n<information>Doc 1(Title: Paris) Paris is a city.</information>\n\n"
    ids = ctx.prompt_ids("Question?") + ctx.encode(action) + ctx.observation_ids(obs, ctx.encode(action))
    msgs = [{"role": "user", "content": "Question?"}, {"role": "assistant", "content": action}, {"role": "user", "content": obs}]
    assert ids == ctx.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))


def test_raw_context_inlines_the_observation_text(policy):
    ctx = TokenContext(policy.tokenizer, "raw")
    assert ctx.observation_ids("<information>x</information>", [1, 2]) == ctx.encode("<information>x</information>")
    with pytest.raises(ConfigError):
        TokenContext(policy.tokenizer, "jsonl")  # type: ignore[arg-type]


def test_sampler_rejects_bad_tree_shapes(policy, env, prompts):
    with pytest.raises(ConfigError):
        sample_trees(policy, env, prompts, m=0)
    with pytest.raises(ConfigError):
        sample_trees(policy, env, prompts, expansion="best_first")  # type: ignore[arg-type]


def test_tree_html_shows_turns_rewards_and_split_points(tree_batch):
    page = tree_html(tree_batch.trees, title="t")
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert page.count("reward ") >= 6
    split = any(len(n.children) > 1 for t in tree_batch.trees for n in t.nodes[1:])
    assert ("splits into" in page) == split
    assert "&lt;information&gt;" in page or "invalid" in page


def test_to_rollout_of_a_hand_built_tree():
    nodes = [Node(0, None, 0, None, children=[1]), Node(1, 0, 1, _turn(), terminal=True, reward=1.0)]
    r = to_rollout(Tree(0, 0, [7, 8], nodes), 1)
    assert r.token_ids == [7, 8, 10, 11, 20] and r.loss_mask == [0, 0, 1, 1, 0]
    assert r.behaviour_logprobs == [0.0, 0.0, -0.5, -0.25, 0.0] and r.turn_of_token == [-1, -1, 0, 0, -1]


def _turn() -> Turn:
    return Turn([10, 11], [-0.5, -0.25], [20], "a", "o", None)
