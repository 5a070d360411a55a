"""TreeSearchQA-v0 against a real FAISS index over a slice of the built-in Wikipedia corpus."""

from __future__ import annotations

import io
import pickle
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treegym
from treegym.envs import EnvPool, fork
from treegym.envs.checker import check_fork_contract
from treegym.envs.cli_play import play
from treegym.envs.react import INVALID_ACTION_MESSAGE, parse_action
from treegym.envs.tree_search_qa import TreeSearchQAEnv
from treegym.errors import ConfigError

SLICE = {"corpus_limit": 300, "split": "train"}


@pytest.fixture(scope="module")
def env() -> gym.Env:
    return gym.make("TreeSearchQA-v0", **SLICE)


class CountingRetriever:
    """Wraps the real retriever and records every batch it is asked for."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.batches: list[list[str]] = []

    def search(self, queries, k):
        self.batches.append(list(queries))
        return self.inner.search(queries, k)


def test_reset_gives_search_r1_prompt_with_question(env):
    obs, info = env.reset(seed=3)
    assert obs.startswith("Answer the given question.") and "Question: " in obs
    assert info["answers"] and info["supporting_ids"] and info["turn"] == 0
    assert obs.rstrip().endswith(env.unwrapped.state.item.question)


def test_search_returns_information_block_with_supporting_passage(env):
    _, info = env.reset(seed=1)
    title = info["supporting_titles"][0]
    obs, reward, terminated, truncated, info = env.step(f"<think>look it up</think><search>{title}</search>")
    assert obs.strip().startswith("<information>Doc 1(Title: ") and obs.strip().endswith("</information>")
    assert obs.count("Doc ") == 3
    assert info["supporting_ids"][0] in info["retrieved_ids"]
    assert (reward, terminated, truncated, info["invalid_action"]) == (0.0, False, False, False)


def test_correct_answer_earns_exact_match_reward(env):
    _, info = env.reset(seed=5)
    answer = info["answers"][0]
    _, reward, terminated, _, info = env.step(f"<answer> {answer.upper()} </answer>")
    assert terminated and reward == 1.0 and info["em"] == 1.0


def test_wrong_answer_earns_nothing_and_f1_gives_partial_credit():
    e = gym.make("TreeSearchQA-v0", reward="f1", **SLICE)
    _, info = e.reset(seed=0, options={})
    gold = info["answers"][0]
    _, reward, *_ = e.step("<answer>definitely not it</answer>")
    assert reward == 0.0
    e.reset(seed=0)
    _, reward, *_ = e.step(f"<answer>{gold} and more words here</answer>")
    assert 0.0 < reward < 1.0


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        (["<think>x</think><answer>{gold}</answer>"], 1.0),
        (["oops", "<think>x</think><answer>{gold}</answer>"], 0.8),
        (["<think>x</think><answer>wrong</answer>"], 0.2),
        (["oops", "<answer>wrong</answer>"], 0.1),
        (["<think>a</think><search>q</search>"] * 2, 0.2),
        (["oops", "oops"], 0.0),
    ],
)
def test_format_score_follows_tree_grpo_table(turns, expected):
    e = gym.make("TreeSearchQA-v0", format_score=True, max_turns=2, **SLICE)
    _, info = e.reset(seed=2)
    reward = None
    for t in turns:
        _, reward, terminated, truncated, _ = e.step(t.format(gold=info["answers"][0]))
    assert terminated or truncated
    assert reward == pytest.approx(expected)


def test_turn_budget_truncates_without_answer(env):
    env.reset(seed=0)
    for _ in range(env.unwrapped.max_turns - 1):
        assert env.step("<search>history</search>")[3] is False
    obs, reward, terminated, truncated, info = env.step("<search>history</search>")
    assert truncated and not terminated and reward == 0.0 and info["turn"] == env.unwrapped.max_turns


@pytest.mark.parametrize(
    "action",
    ["", "   ", "no tags at all", "<search>unclosed", "<search></search>", "<search><search>x</search></search>",
     "<answer><search>q</search></answer>", "x" * (1 << 20), "\ud800\udfff<search>\x00</search>", "<SEARCH>x</SEARCH>"],
    ids=["empty", "blank", "untagged", "unclosed", "empty-tag", "nested", "nested-mixed", "1MB", "surrogates", "uppercase"],
)
def test_bad_actions_are_invalid_observations_and_env_stays_usable(env, action):
    env.reset(seed=4)
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == INVALID_ACTION_MESSAGE and info["invalid_action"] and reward == 0.0 and not terminated
    assert "error" in info
    obs, *_ = env.step("<search>Paris</search>")
    assert "<information>" in obs


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=st.text(max_size=300) | st.builds(lambda a, b: f"<search>{a}</search>{b}", st.text(max_size=40), st.text(max_size=40)))
def test_any_text_action_gives_text_observation_never_exception(env, action):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(obs, str) and env.observation_space.contains(obs)
    assert isinstance(info["invalid_action"], bool)


def test_parse_action_rules():
    assert parse_action("<think>r</think><search> q </search>").well_formed
    assert not parse_action("<search>q</search>").well_formed
    assert not parse_action("<think>r</think><search>a</search><search>b</search>").well_formed
    assert parse_action("<answer>a</answer><search>b</search>").kind == "answer"
    assert parse_action(42).kind == "invalid"


def test_env_passes_gymnasium_env_checker_without_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = gym.make("TreeSearchQA-v0", **SLICE)
        check_env(e.unwrapped, skip_render_check=True)
        e.reset(seed=0)
        e.step("<search>x</search>")
    assert [str(w.message) for w in caught] == []


def test_fork_contract_holds():
    actions = [
        "<think>a</think><search>Albert Einstein</search>",
        "<search>ancient history</search>",
        "not an action",
        "<search>music</search>",
        "<answer>Paris</answer>",
    ]
    check_fork_contract(lambda: gym.make("TreeSearchQA-v0", **SLICE), actions)


def test_fork_through_wrappers_does_not_share_history(env):
    env.reset(seed=7)
    env.step("<search>Rome</search>")
    child = fork(env)
    child.step("<search>Egypt</search>")
    assert len(child.unwrapped.state.retrieved_ids) == 6
    assert len(env.unwrapped.state.retrieved_ids) == 3
    assert child.unwrapped.retriever is env.unwrapped.retriever
    snap = treegym.envs.snapshot(child)
    assert pickle.loads(pickle.dumps(snap)) == snap


def test_pool_runs_all_pending_searches_as_one_retriever_call(env):
    counting = CountingRetriever(env.unwrapped.retriever)
    envs = [TreeSearchQAEnv(retriever=counting, items=env.unwrapped.items, corpus_limit=300) for _ in range(4)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    pool = EnvPool()
    out = pool.step(envs, ["<search>Rome</search>", "<answer>x</answer>", "<search>Nile</search>", "<search>Moon</search>"])
    assert counting.batches == [["Rome", "Nile", "Moon"]]
    assert out[1][2] is True and "<information>" in out[3][0]


def test_pinned_task_and_seeded_reset_are_deterministic(env):
    items = env.unwrapped.items
    obs, info = env.reset(options={"task_id": items[1].id})
    assert info["task_id"] == items[1].id
    assert env.reset(seed=11)[0] == env.reset(seed=11)[0]
    with pytest.raises(ConfigError, match="unknown task_id"):
        env.reset(options={"task_id": "nope"})


def test_wrong_config_is_a_clear_error():
    with pytest.raises(ConfigError, match="topk"):
        gym.make("TreeSearchQA-v0", topk=0, **SLICE)


def test_play_reads_turns_and_supports_snapshot_restore(env):
    stdin = io.StringIO(":snap\n<search>Rome</search>\n:back\n:state\n<answer>x</answer>\n:quit\n")
    out = io.StringIO()
    finished = play(env, seed=0, stdin=stdin, stdout=out)
    text = out.getvalue()
    assert finished == 1
    assert "[snapshot 0 saved]" in text and "[restored snapshot 0]" in text and "turn 0/" in text
    assert "<information>" in text and "episode terminated" in text


def test_synthetic_world_serves_questions_of_the_asked_hop_count():
    e = gym.make("TreeSearchQA-v0", corpus="synthetic", hops=3, index="bm25", split="dev")
    assert {it.hops for it in e.unwrapped.items} == {3}
    _, info = e.reset(seed=0)
    assert len(info["supporting_ids"]) >= 3 and all(info["supporting_titles"])
    obs, *_ = e.step(f"<search>{info['supporting_titles'][0]}</search>")
    assert f"(Title: {info['supporting_titles'][0]})" in obs


def test_render_mode_ansi_is_accepted_and_passes_the_render_check():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = gym.make("TreeSearchQA-v0", render_mode="ansi", **SLICE)
        check_env(e.unwrapped)
    assert [str(w.message) for w in caught] == []
    e.reset(seed=0)
    assert isinstance(e.render(), str)
    with pytest.raises(ValueError, match="render_mode"):
        TreeSearchQAEnv(render_mode="human", **SLICE)
