"""run_episode and treegym eval: scripted agents end to end, failing agents, intervals."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from toy_env import ToyEnv

import treegym  # noqa: F401
from treegym.agents.eval import evaluate
from treegym.agents.resolve import resolve_agent
from treegym.agents.rollout.episode import run_episode
from treegym.cli import main
from treegym.errors import ConfigError
from treegym.stats import bootstrap_interval, t_interval, wilson_interval

QA_KWARGS = {"corpus_limit": 300}


def exploding_agent(messages):
    raise RuntimeError("model server fell over")


class FailsOnSecondEpisode:
    """Answers at once, except in its second episode, where it raises."""

    def __init__(self) -> None:
        self.episodes = 0

    def begin(self, info):
        self.episodes += 1

    def act(self, messages):
        if self.episodes == 2:
            raise ValueError("bad luck")
        return "<answer>nobody</answer>"


def test_run_episode_reports_a_raising_agent_with_its_episode_id():
    ep = run_episode(ToyEnv(), exploding_agent, seed=0, options={"target": 4}, episode_id="toy-7")
    assert ep.error is not None and "toy-7" in ep.error and "model server fell over" in ep.error
    assert ep.turns == 0 and ep.messages[0] == {"role": "user", "content": "reach 4"}


def test_run_episode_plays_to_the_end_and_counts_tool_calls():
    ep = run_episode(ToyEnv(), lambda messages: "2", options={"target": 8})
    assert ep.error is None and ep.reward == 1.0 and ep.terminated
    assert ep.turns == 2 and ep.tool_calls == 2
    assert [m["role"] for m in ep.messages] == ["user", "assistant", "user", "assistant", "user"]


def test_run_episode_counts_invalid_actions_as_turns_without_tool_calls():
    ep = run_episode(ToyEnv(max_turns=2), lambda messages: "two")
    assert ep.truncated and ep.turns == 2 and ep.tool_calls == 0 and ep.reward == 0.0


def test_run_episode_rejects_a_non_text_action_as_an_error():
    ep = run_episode(ToyEnv(), lambda messages: 3, options={"target": 9})
    assert ep.error is not None and "int" in ep.error


def test_eval_continues_after_an_agent_raises():
    report = evaluate(FailsOnSecondEpisode(), "TreeSearchQA-v0", 3, env_kwargs=QA_KWARGS, progress=False)
    assert report.n == 3 and len(report.errors) == 1
    failed = [s for s in report.scores if s.error]
    assert failed[0].episode_id.startswith("1:") and failed[0].episode_id in failed[0].error


def test_eval_cli_runs_the_heuristic_agent_end_to_end(tmp_path, capsys):
    rc = main(["eval", "--agent", "heuristic", "--env", "TreeSearchQA-v0", "--n", "3", "--seed", "1",
               "--env-kwargs", json.dumps(QA_KWARGS), "--out", str(tmp_path), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    for metric in ("EM", "F1", "success", "turns", "tool calls"):
        assert metric in out
    lines = (tmp_path / "traces.jsonl").read_text().splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    assert len({r["episode_id"] for r in records}) == 3
    assert all(r["messages"][0]["role"] == "user" and r["turns"] >= 1 for r in records)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["n"] == 3 and 0.0 <= report["em"]["low"] <= report["em"]["mean"] <= report["em"]["high"] <= 1.0
    # the heuristic searches before it answers
    assert sum(r["tool_calls"] for r in records) >= 3


def test_eval_cli_reports_an_unknown_agent_without_a_traceback(capsys):
    rc = main(["eval", "--agent", "psychic", "--env", "TreeSearchQA-v0", "--n", "1", "--no-progress",
               "--env-kwargs", json.dumps(QA_KWARGS)])
    assert rc == 2
    assert "unknown agent 'psychic'" in capsys.readouterr().err


def test_module_callable_agents_resolve_and_classes_are_instantiated():
    assert resolve_agent("test_eval:exploding_agent", "TreeSearchQA-v0").obj is exploding_agent
    assert isinstance(resolve_agent("test_eval:FailsOnSecondEpisode", "TreeSearchQA-v0").obj, FailsOnSecondEpisode)
    with pytest.raises(ConfigError, match="no attribute"):
        resolve_agent("test_eval:nothing_here", "TreeSearchQA-v0")


def test_household_oracle_is_wired_to_the_expert_walkthrough():
    if "TextHousehold-v0" not in gym.registry:
        pytest.skip("TextHousehold-v0 not registered")
    try:
        agent = resolve_agent("oracle", "TextHousehold-v0").obj
    except ConfigError:
        pytest.skip("the household package has no oracle yet")
    assert hasattr(agent, "act") and hasattr(agent, "begin")


def test_household_report_shows_success_and_no_em_row():
    agent = resolve_agent("oracle", "TextHousehold-v0").obj
    report = evaluate(agent, "TextHousehold-v0", 2, split="unseen", progress=False)
    table = report.table()
    assert report.success.mean == 1.0 and "success" in table
    assert "\nEM " not in table and "\nF1 " not in table
    qa = evaluate(FailsOnSecondEpisode(), "TreeSearchQA-v0", 1, env_kwargs=QA_KWARGS, progress=False)
    assert "\nEM " in qa.table() and "\nF1 " in qa.table()


def test_wilson_interval_stays_in_the_unit_interval_and_brackets_the_rate():
    iv = wilson_interval([1, 1, 1])
    assert iv.mean == 1.0 and 0.4 < iv.low < 1.0 and iv.high == 1.0
    iv = wilson_interval([0, 1, 0, 1])
    assert iv.low < 0.5 < iv.high and iv.mean == 0.5


def test_bootstrap_interval_brackets_the_mean_and_collapses_for_constants():
    iv = bootstrap_interval([2.0, 2.0, 2.0])
    assert (iv.mean, iv.low, iv.high) == (2.0, 2.0, 2.0)
    iv = bootstrap_interval([0.0, 1.0, 0.5, 0.25])
    assert iv.low <= iv.mean <= iv.high and iv.low < iv.high


def test_t_interval_over_seeds_uses_students_t():
    iv = t_interval([0.1, 0.2, 0.3])  # mean 0.2, sd 0.1, n 3: t(2) = 4.303
    assert iv.mean == pytest.approx(0.2) and iv.high - iv.mean == pytest.approx(4.303 * 0.1 / 3**0.5, rel=1e-6)
    assert iv.low == pytest.approx(2 * 0.2 - iv.high)
    assert t_interval([0.2] * 40).high == pytest.approx(0.2)  # past 30 degrees of freedom: the normal's quantile
    one = t_interval([0.5])
    assert one.mean == 0.5 and one.low != one.low  # one seed has no interval (nan)


def test_eval_refuses_zero_turns_and_an_out_path_that_is_a_file(tmp_path, capsys):
    common = ["eval", "--agent", "heuristic", "--env", "TreeSearchQA-v0", "--n", "1", "--no-progress",
              "--env-kwargs", json.dumps(QA_KWARGS)]
    assert main([*common, "--max-turns", "0"]) == 2
    assert "max_turns must be at least 1, got 0" in capsys.readouterr().err
    taken = tmp_path / "report.txt"
    taken.write_text("not a folder")
    assert main([*common, "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert "is a file; pass a folder" in err and "Traceback" not in err


def test_eval_exits_nonzero_when_every_episode_failed(capsys):
    rc = main(["eval", "--agent", "test_eval:exploding_agent", "--env", "TreeSearchQA-v0", "--n", "2",
               "--no-progress", "--env-kwargs", json.dumps(QA_KWARGS)])
    assert rc == 1
    assert "every episode failed (2 of 2)" in capsys.readouterr().err
