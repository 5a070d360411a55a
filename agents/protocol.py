"""One evaluation protocol: a frozen record of how a held-out figure is measured, and the one
function that measures a policy with it.

A training run scores its phases (the untrained model, the warm start, the end of RL) with the
protocol its config gives (``treegym.trainers.heldout.run_protocol``: the family's training
variant, its turns and tokens, the run's context format, held-out split, n and temperature) and
writes it to its folder (``protocol.json``). ``treegym eval --agent RUN/final`` reads it back and
plays the same prompts the same way, so it reproduces the run's "after RL" figure; ``treegym
eval`` on a base id keeps its own documented default.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

import treegym.envs as envs
from treegym.agents.policy import Policy, SamplingParams
from treegym.agents.rollout.context import resolve_mode
from treegym.agents.rollout.samplers import sample_chains
from treegym.agents.rollout.scoring import heldout_prompts
from treegym.agents.rollout.types import Prompt, RolloutBatch
from treegym.errors import ConfigError

PROTOCOL_FILE = "protocol.json"


@dataclass(frozen=True)
class Protocol:
    """How a held-out figure is measured: which env (``variant``, with ``env_kwargs``) on which
    ``split``, its first ``n`` tasks, one chain each of at most ``max_turns`` turns of
    ``max_new_tokens`` tokens, in context ``mode`` (``auto``, ``chat``, ``raw``), at ``temperature``."""

    variant: str
    split: str
    n: int
    max_turns: int | None
    max_new_tokens: int
    mode: str
    temperature: float
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_context_tokens: int | None = None
    ignore_eos: bool = False

    def params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=1.0, max_new_tokens=self.max_new_tokens,
                              ignore_eos=self.ignore_eos)

    def make_env(self) -> gym.Env:
        return envs.make(self.variant, self.split, max_turns=self.max_turns, **self.env_kwargs)

    def prompts(self, env: gym.Env) -> list[Prompt]:
        """The held-out tasks: the split's first ``n`` (``treegym.agents.rollout.scoring.heldout_prompts``)."""
        return heldout_prompts(envs.registry.task_ids(env), self.n)

    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / PROTOCOL_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        return path


def read_protocol(folder: str | Path) -> Protocol | None:
    """The protocol a run folder holds (``RUN/protocol.json``; ``RUN/final`` finds its run's), or None."""
    for where in (Path(folder), Path(folder).parent):
        path = where / PROTOCOL_FILE
        if path.is_file():
            try:
                return Protocol(**json.loads(path.read_text(encoding="utf-8")))
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{path} is not an evaluation protocol: {exc}") from None
    return None


def play_protocol(policy: Policy, env: gym.Env, prompts: list[Prompt], protocol: Protocol,
                  progress: Any = None) -> RolloutBatch:
    """``policy`` on ``prompts`` of ``env`` as ``protocol`` says: one chain each, all in one batch.
    Training's held-out phases and ``treegym eval`` of a run's model both call this."""
    mode = resolve_mode(protocol.mode, policy.tokenizer)
    return sample_chains(policy, env, prompts, 1, protocol.params(), max_turns=protocol.max_turns,
                         mode=mode, max_context_tokens=protocol.max_context_tokens, progress=progress)  # type: ignore[arg-type]
