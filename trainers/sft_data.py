"""Expert episodes for supervised warm starts: collected from a scripted expert here, or read
from ``treegym eval --out`` traces (``treegym.agents.eval.read_traces``).

An episode becomes one token sequence in exactly the RL trainer's context format
(``treegym.agents.rollout.context.TokenContext``): prompt ids, then per turn the action ids followed
by the observation ids. Only action ids carry a label; the prompt, the observations and the
chat glue around them are context, as they are in ``to_rollout``'s loss mask. Action ids are
what a policy emits for that turn: ``TokenContext.encode(action_text)``, the same text the env
parsed, and whatever ends the turn there (``turn_ids``), so a model trained on them stops after
its action: at a stop string it wrote (``</search>``, ``</answer>``), or at the end of turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from treegym.agents.eval import Transcript, play_episodes, progress_bar
from treegym.agents.policy import SamplingParams
from treegym.agents.rollout.context import TokenContext
from treegym.envs.core import success


@dataclass(frozen=True)
class SFTExample:
    """One episode as token ids with a 0/1 label mask (1 = an action token, trained)."""

    episode_id: str
    token_ids: tuple[int, ...]
    label_mask: tuple[int, ...]
    action_spans: tuple[tuple[int, int], ...]  # [start, end) of each action (its end of turn included)

    @property
    def n_labels(self) -> int:
        return sum(self.label_mask)


# ---- collecting ------------------------------------------------------------------------------


def collect_episodes(env: gym.Env, expert: Any, prompts: Sequence[Any], progress: bool = False,
                     max_turns: int | None = None) -> list[Transcript]:
    """Run ``expert`` on each prompt (reset options or a seed) of ``env``, for at most
    ``max_turns`` actions (the policy's own budget: an episode that needs more is cut and counts
    as unsolved); episodes where the expert raised are skipped."""
    with progress_bar(len(prompts), "expert episodes", progress) as bar:
        played = play_episodes(env, expert, prompts, max_turns, bar)
    return [Transcript(ep.episode_id, tuple(ep.messages), success(ep.info)) for ep in played if ep.error is None]


# ---- episodes to token ids -------------------------------------------------------------------


def turn_ids(ctx: TokenContext, action: str, params: SamplingParams) -> list[int]:
    """The ids a policy sampling with ``params`` emits to play ``action`` and stop there.

    An action that ends in one of ``params.stop`` (QA's ``</search>``) ends its turn itself.
    Any other (a household command) is followed by the tokenizer's EOS, which every backend
    stops on; in chat mode it is the template's end of turn (``<|im_end|>``), which
    ``observation_ids`` then leaves out of the glue, so the context is the one a rollout has.
    (With ``ignore_eos`` only a stop or the length ends a turn, and nothing is added.) Without
    this label SFT never taught the model to stop: a warm-started SmolLM2 ran on to a second
    command.
    """
    ids = ctx.encode(action)
    stops = tuple(s for s in params.stop if s)
    eos = getattr(ctx.tokenizer, "eos_token_id", None)
    if (stops and action.endswith(stops)) or params.ignore_eos or not isinstance(eos, int):
        return ids
    return [*ids, eos]


def episode_example(ctx: TokenContext, episode: Transcript, params: SamplingParams) -> SFTExample:
    """``episode`` as the RL trainer would have laid it out in context, each action and its end
    of turn labelled. ``params`` are the sampler's, with the env's stops (``with_stops``)."""
    msgs = episode.messages
    ids = list(ctx.prompt_ids(msgs[0]["content"]))
    mask = [0] * len(ids)
    spans: list[tuple[int, int]] = []
    assistant_at = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    for k, i in enumerate(assistant_at):
        action_ids = turn_ids(ctx, msgs[i]["content"], params)
        final = k == len(assistant_at) - 1
        obs = msgs[i + 1]["content"] if i + 1 < len(msgs) else ""
        obs_ids = ctx.observation_ids(obs, action_ids, final=final)
        spans.append((len(ids), len(ids) + len(action_ids)))
        ids += action_ids + obs_ids
        mask += [1] * len(action_ids) + [0] * len(obs_ids)
    return SFTExample(episode.episode_id, tuple(ids), tuple(mask), tuple(spans))


def select_examples(
    ctx: TokenContext, episodes: Sequence[Transcript], only_correct: bool, params: SamplingParams
) -> tuple[list[SFTExample], dict[str, int]]:
    """Examples worth imitating (labelled as ``params`` sample, see ``turn_ids``), and how many
    episodes were dropped for what.

    Dropped: episodes without an action, wrong answers (with ``only_correct``; imitating a
    wrong answer teaches the format but also the mistake), and episodes with an action and its
    end of turn longer than the sampler's ``max_new_tokens`` (the policy could never finish it).
    """
    kept: list[SFTExample] = []
    dropped = {"no_action": 0, "wrong": 0, "too_long": 0}
    for ep in episodes:
        if not any(m["role"] == "assistant" for m in ep.messages):
            dropped["no_action"] += 1
            continue
        if only_correct and ep.success < 1.0:
            dropped["wrong"] += 1
            continue
        ex = episode_example(ctx, ep, params)
        if any(end - start > params.max_new_tokens for start, end in ex.action_spans):
            dropped["too_long"] += 1
            continue
        kept.append(ex)
    return kept, dropped
