"""Expert episodes for supervised warm starts: collected from a scripted expert or read from traces.

An episode becomes one token sequence in exactly the RL trainer's context format
(``treegym.agents.rollout.context.TokenContext``): prompt ids, then per turn the action ids followed
by the observation ids. Only action ids carry a label; the prompt, the observations and the
chat glue around them are context, as they are in ``to_rollout``'s loss mask. Action ids are
``TokenContext.encode(action_text)``, the same text the env parsed, so a model trained on them
emits actions that stop at the policy's stop strings (``</search>``, ``</answer>``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from treegym.agents.base import Message
from treegym.agents.eval import progress_bar
from treegym.agents.rollout.context import TokenContext
from treegym.agents.rollout.episode import run_episode
from treegym.agents.rollout.types import reset_args
from treegym.envs.core import success
from treegym.errors import ConfigError, TreegymError


class TraceFormatError(TreegymError):
    """A trace file is missing, empty, or has a line that is not an episode."""


class ExpertError(ConfigError):
    """The expert is unknown, or the env has none."""


@dataclass(frozen=True)
class ExpertEpisode:
    """One expert episode as chat messages (user prompt, then assistant/user turns)."""

    episode_id: str
    messages: tuple[Message, ...]
    em: float


@dataclass(frozen=True)
class SFTExample:
    """One episode as token ids with a 0/1 label mask (1 = an action token, trained)."""

    episode_id: str
    token_ids: tuple[int, ...]
    label_mask: tuple[int, ...]
    action_spans: tuple[tuple[int, int], ...]  # [start, end) of each action in token_ids

    @property
    def n_labels(self) -> int:
        return sum(self.label_mask)


# ---- collecting ------------------------------------------------------------------------------


def make_expert(name: str, env_id: str, max_turns: int) -> Any:
    """The scripted ``name`` expert of ``env_id`` (one its family record lists), fitted to a
    budget of ``max_turns`` turns."""
    from treegym.agents.resolve import scripted_agent
    from treegym.envs.registry import family

    experts = family(env_id).experts
    if not experts:
        raise ExpertError(f"env {env_id!r} has no {name} expert (its family lists none); "
                          "pass --traces from `treegym eval --out`")
    if name not in experts:
        raise ExpertError(f"unknown expert {name!r} for {env_id}; choose one of: {', '.join(experts)}")
    agent = scripted_agent(name, env_id)
    from treegym.agents.scripted import HeuristicQAAgent

    if isinstance(agent, HeuristicQAAgent):
        # Searches beyond the budget would truncate the episode before the answer, and an
        # episode without an answer teaches nothing; keep one turn for it.
        agent.max_searches = max(1, min(agent.max_searches, max_turns - 1))
    return agent


def collect_episodes(env: gym.Env, expert: Any, prompts: Sequence[Any], progress: bool = False,
                     max_turns: int | None = None) -> list[ExpertEpisode]:
    """Run ``expert`` on each prompt (reset options or a seed) of ``env``, for at most
    ``max_turns`` actions (the policy's own budget: an episode that needs more is cut and counts
    as unsolved); episodes where the expert raised are skipped."""
    bar = progress_bar(len(prompts), "expert episodes", progress)
    out: list[ExpertEpisode] = []
    for prompt in prompts:
        seed, options = reset_args(prompt)
        ep = run_episode(env, expert, seed=seed, options=options, max_turns=max_turns)
        if bar is not None:
            bar.update(1)
        if ep.error is None:
            out.append(ExpertEpisode(ep.episode_id, tuple(ep.messages), success(ep.info)))
    if bar is not None:
        bar.close()
    return out


# ---- reading traces --------------------------------------------------------------------------


def read_traces(path: str | Path) -> list[ExpertEpisode]:
    """Episodes of a ``traces.jsonl`` written by ``treegym eval --out`` (errored ones skipped)."""
    p = Path(path)
    if p.is_dir():
        p = p / "traces.jsonl"
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise TraceFormatError(f"trace file {p} does not exist; write one with `treegym eval --out DIR`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"cannot read trace file {p}: {exc}") from None
    episodes: list[ExpertEpisode] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{p}, line {number}: not JSON ({exc.msg})") from None
        messages = _check_messages(record, f"{p}, line {number}")
        if record.get("error"):
            continue
        em = record.get("em", 0.0)
        episodes.append(ExpertEpisode(str(record.get("episode_id", number)), messages, float(em or 0.0)))
    if not episodes:
        raise TraceFormatError(f"trace file {p} holds no usable episode (it is empty, or every episode failed)")
    return episodes


def _check_messages(record: Any, where: str) -> tuple[Message, ...]:
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise TraceFormatError(f"{where}: an episode is a JSON object with a 'messages' list")
    messages = record["messages"]
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str):
            raise TraceFormatError(f"{where}: message {i} is not {{'role': 'user'|'assistant', 'content': str}}")
    if not messages or messages[0]["role"] != "user":
        raise TraceFormatError(f"{where}: the first message must be the env's prompt (role 'user')")
    for i in range(1, len(messages)):
        if messages[i]["role"] == messages[i - 1]["role"]:
            raise TraceFormatError(f"{where}: messages {i - 1} and {i} are both {messages[i]['role']!r}; turns must alternate")
    return tuple(dict(m) for m in messages)  # type: ignore[misc]


# ---- episodes to token ids -------------------------------------------------------------------


def episode_example(ctx: TokenContext, episode: ExpertEpisode) -> SFTExample:
    """``episode`` as the RL trainer would have laid it out in context, actions labelled."""
    msgs = episode.messages
    ids = list(ctx.prompt_ids(msgs[0]["content"]))
    mask = [0] * len(ids)
    spans: list[tuple[int, int]] = []
    assistant_at = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    for k, i in enumerate(assistant_at):
        action_ids = ctx.encode(msgs[i]["content"])
        final = k == len(assistant_at) - 1
        obs = msgs[i + 1]["content"] if i + 1 < len(msgs) else ""
        obs_ids = ctx.observation_ids(obs, action_ids, final=final)
        spans.append((len(ids), len(ids) + len(action_ids)))
        ids += action_ids + obs_ids
        mask += [1] * len(action_ids) + [0] * len(obs_ids)
    return SFTExample(episode.episode_id, tuple(ids), tuple(mask), tuple(spans))


def select_examples(
    ctx: TokenContext, episodes: Sequence[ExpertEpisode], only_correct: bool, max_action_tokens: int
) -> tuple[list[SFTExample], dict[str, int]]:
    """Examples worth imitating, and how many episodes were dropped for what.

    Dropped: episodes without an action, wrong answers (with ``only_correct``; imitating a
    wrong answer teaches the format but also the mistake), and episodes with an action longer
    than the sampler's ``max_new_tokens`` (the policy could never finish it).
    """
    kept: list[SFTExample] = []
    dropped = {"no_action": 0, "wrong": 0, "too_long": 0}
    for ep in episodes:
        if not any(m["role"] == "assistant" for m in ep.messages):
            dropped["no_action"] += 1
            continue
        if only_correct and ep.em < 1.0:
            dropped["wrong"] += 1
            continue
        ex = episode_example(ctx, ep)
        if any(end - start > max_action_tokens for start, end in ex.action_spans):
            dropped["too_long"] += 1
            continue
        kept.append(ex)
    return kept, dropped
