"""A tool that cannot be reached is an infrastructure failure, never a wrong answer: the env
ends the episode with ``info["failed_to_run"]``, ``treegym eval`` stops with one line instead
of reporting EM 0, and training leaves such episodes out of its group statistics and its loss.
The dead retriever is a closed port on 127.0.0.1."""

from __future__ import annotations

import socket

import gymnasium as gym
import pytest
import torch

import treegym  # noqa: F401  (registers the ids)
from treegym.agents.rollout.types import Rollout
from treegym.cli import main
from treegym.envs.core import failed_to_run
from treegym.errors import ConfigError
from treegym.trainers.advantages import grpo, tree_grpo, treeopsd, without_failed_runs


def _closed_port() -> int:
    """A loopback port where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_dead_retriever_ends_the_episode_as_failed_to_run_not_as_a_wrong_answer():
    env = gym.make("TreeSearchQA-v0", retriever_url=f"http://127.0.0.1:{_closed_port()}")
    env.unwrapped.retriever.retries = 1  # the default's backoff only makes the test slower
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<think>x</think><search>anything</search>")
    assert truncated and not terminated and reward == 0.0
    assert "did not answer" in failed_to_run(info) and info["success"] == 0.0  # the contract keys stay


@pytest.mark.parametrize("url", ["http://127.0.0.1:PORT", "file:///etc/passwd"])
def test_eval_with_a_dead_or_wrong_retriever_stops_with_one_line_not_em_zero(url, capsys):
    url = url.replace("PORT", str(_closed_port()))
    code = main(["eval", "--agent", "heuristic", "--env", "TreeSearchQA-v0", "--n", "2", "--no-progress",
                 "--env-kwargs", f'{{"retriever_url": "{url}"}}'])
    out, err = capsys.readouterr()
    assert code == 2 and "EM" not in out  # no table: no figure measured the retriever instead of the agent
    assert err.count("\n") == 1 and "Traceback" not in err
    if url.startswith("file:"):
        assert "a retriever URL is http(s)://" in err
    else:
        assert "eval stopped: episode 0:" in err and "could not run" in err


def test_a_retriever_url_that_is_not_http_is_refused_when_the_env_is_made():
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/x", "127.0.0.1:8000", "http://"):
        with pytest.raises(ConfigError, match="a retriever URL is http"):
            gym.make("TreeSearchQA-v0", retriever_url=url)


def _rollout(prompt: int, tree: int, leaf: int, path: list[int], reward: float, failed: bool = False) -> Rollout:
    tokens = [9] * (1 + 2 * len(path))
    mask = [0] + [1, 0] * len(path)
    turn = [-1] + [t for i in range(len(path)) for t in (i, -1)]
    info = {"failed_to_run": "Search failed: retrieval server did not answer"} if failed else {}
    return Rollout(prompt, tree, leaf, path, tokens, mask, [0.0] * len(tokens), turn, reward, info)


@pytest.mark.parametrize("advantage", [grpo, tree_grpo, treeopsd], ids=["grpo", "tree_grpo", "treeopsd"])
def test_training_leaves_episodes_that_failed_to_run_out_of_group_statistics_and_the_loss(advantage):
    ran = [_rollout(0, 0, 1, [1], 1.0), _rollout(0, 0, 2, [2], 0.0), _rollout(0, 0, 4, [4], 1.0),
           _rollout(1, 0, 1, [1], 0.0), _rollout(1, 0, 2, [2], 1.0)]
    failed = [_rollout(0, 0, 3, [3], 0.0, failed=True), _rollout(1, 0, 3, [3], 0.0, failed=True)]
    batch = [ran[0], ran[1], failed[0], ran[2], ran[3], failed[1], ran[4]]
    trained, adv = without_failed_runs(advantage, batch)
    alone = advantage(ran)  # what the episodes that ran get among themselves
    at = {0: 0, 1: 1, 3: 2, 4: 3, 6: 4}
    for i, j in at.items():
        assert torch.equal(adv.advantages[i], alone.advantages[j]) and torch.equal(adv.weights[i], alone.weights[j])
        assert trained[i] is batch[i]
    for i in (2, 5):  # no signal, no weight, no loss tokens
        assert not adv.advantages[i].any() and not adv.weights[i].any() and not any(trained[i].loss_mask)
    assert len(trained) == len(batch)
    everyone = [_rollout(0, 0, i + 1, [i + 1], float(i % 2)) for i in range(4)]
    same, plain = without_failed_runs(advantage, everyone), advantage(everyone)
    assert same[0] == everyone and all(torch.equal(a, b) for a, b in zip(same[1].advantages, plain.advantages))
