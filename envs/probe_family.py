"""A parametric probe family, large enough to hold tasks out of a study.

The four fixed probes (``probes.py``) each isolate one property; a method chosen on them is
chosen on the tasks it is reported on. ``ProbeTask-v0`` spans the properties instead, one
argument each, and ``sample_task(seed)`` draws a task's whole parameter set from a seed, so a
study can choose its methods on some tasks and report on others drawn from the same family.

``ProbeTaskEnv`` is a row of ``horizon - slack`` positions, each opened by one of ``choices``
symbols (fixed by ``key_seed``), in ``horizon`` turns:

- ``failure="sparse"``: every move passes on to the next position; a wrong one is never shown
  (the observation is the next turn's number) and fails the episode at the end (a lock).
- ``failure="visible"``: a wrong move is blocked and said so ("no N", N the position ahead),
  and costs a turn; ``slack`` turns may be lost that way (a maze).
- ``opening=True``: a turn's first word must be ``<`` and its move is the second word, as an
  instruct LLM's turns all open with the same token; otherwise the move is the first word.
- ``tools=True``: ``?`` calls the lookup tool, whose result (the key of the position ahead) is
  the observation; a look costs a turn and ``tool_cost`` off the terminal reward.
- ``distractors``: words appended to each observation, drawn per episode and turn from the
  symbols and the filler, which say nothing about the keys.

Reward: at the end only, 1 if every position was passed with its key, less ``tool_cost`` per
tool call; ``success`` and ``em`` are the 0/1 outcome. A turn's length and the model's prior
(random init, the format only, or a format that uses a tool's result) are the study's side of a
task: ``ProbeTaskParams`` holds them with the env's arguments.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from treegym.envs.core import Plan, StepResult, ToolCall, require_running
from treegym.envs.probes import FILLER, LOOK, TURN_MARKS, VOCAB, LookupTool, ProbeEnv, ProbeState
from treegym.errors import ConfigError

OPEN = "<"
FAMILY_VOCAB = (*VOCAB, OPEN)
FAILURES = ("sparse", "visible")


@dataclass(frozen=True)
class TaskState(ProbeState):
    """``correct``: positions passed with their key; ``pos``: positions played (sparse) or passed
    (visible); ``calls``: tool calls; ``revealed``: the key of the position ahead was looked up;
    ``salt``: draws the episode's distractor words."""

    pos: int = 0
    calls: int = 0
    revealed: bool = False
    salt: int = 0


class ProbeTaskEnv(ProbeEnv):
    """One task of the parametric probe family (see the module doc for the rules).

    Args:
        horizon: turns per episode (the turn budget).
        choices: legal moves per position.
        failure: ``"sparse"`` (never shown) or ``"visible"`` (a blocked move, shown, costs a turn).
        slack: turns beyond the positions (``horizon - slack`` positions, at least 1).
        opening: every turn opens with ``<``, and the move is the second word.
        tools: ``?`` looks up the key of the position ahead.
        tool_cost: taken off the terminal reward per tool call.
        distractors: uninformative words appended to each observation (0 to 3).
        key_seed: seeds the fixed keys.
    """

    vocab = FAMILY_VOCAB

    def __init__(self, horizon: int = 4, choices: int = 2, failure: str = "sparse", slack: int = 0,
                 opening: bool = False, tools: bool = False, tool_cost: float = 0.0, distractors: int = 0,
                 key_seed: int = 0, render_mode: str | None = None) -> None:
        super().__init__(horizon, choices, key_seed, render_mode)
        if failure not in FAILURES:
            raise ConfigError(f"ProbeTaskEnv: failure must be one of {FAILURES}, got {failure!r}")
        if not 0 <= slack < horizon:
            raise ConfigError(f"ProbeTaskEnv: slack must be in 0..horizon-1 ({horizon - 1}), got {slack}")
        if not 0 <= distractors <= 3:
            raise ConfigError(f"ProbeTaskEnv: distractors must be in 0..3, got {distractors}")
        if tool_cost < 0 or (tool_cost and not tools):
            raise ConfigError(f"ProbeTaskEnv: tool_cost must be >= 0, and 0 without tools (got {tool_cost})")
        self.failure, self.slack, self.tools_on, self.tool_cost = failure, slack, tools, float(tool_cost)
        self.distractors = distractors
        self.opening = OPEN if opening else None
        self.positions = horizon - slack
        self.fixed_keys = self.fixed_keys[: self.positions]
        self.obs_words = (2 if failure == "visible" else 1) + distractors
        if tools:
            self.tools = {"lookup": LookupTool()}

    def shape(self) -> dict[str, Any]:
        return {"failure": self.failure, "slack": self.slack, "opening": self.opening is not None,
                "tools": self.tools_on, "tool_cost": self.tool_cost, "distractors": self.distractors}

    def legal_moves(self, state: ProbeState) -> tuple[str, ...]:
        return (*self.moves, LOOK) if self.tools_on else self.moves

    def prior_answer(self, state: ProbeState, looked: str | None) -> str | None:
        # A prior that uses tools plays the key it has just looked up.
        assert isinstance(state, TaskState)
        return state.keys[state.pos] if state.revealed else None

    def _reset_state(self, options: dict[str, Any]) -> tuple[ProbeState, str, dict[str, Any]]:
        unknown = set(options) - {"task_id"}
        if unknown:
            raise ConfigError(f"ProbeTaskEnv.reset: unknown options {sorted(unknown)}")
        state = TaskState(keys=self.fixed_keys, salt=int(self.np_random.integers(2**31)))
        return state, "go", {"horizon": self.horizon, "choices": self.choices, "positions": self.positions}

    def parse(self, action: str) -> str:
        """The turn's move: its first word, or the word after the opening (``""`` if it is missing)."""
        words = str(action).split()
        if self.opening is None:
            return words[0] if words else ""
        return words[1] if len(words) >= 2 and words[0] == self.opening else ""

    def plan(self, action: str) -> Plan:
        s = self.state
        require_running(s, s is not None and s.done)
        assert isinstance(s, TaskState)
        move = self.parse(action)
        calls = [ToolCall("lookup", s.keys[s.pos])] if self.tools_on and move == LOOK else []
        return self.make_plan(calls, move)

    def resolve(self, plan: Plan, results: Sequence[Any]) -> StepResult:
        self.check_plan(plan)
        s = self.state
        assert isinstance(s, TaskState)
        move, looked = plan.parsed, bool(results)
        legal = looked or move in self.moves
        hit = legal and not looked and move == s.keys[s.pos]
        advance = 0 if looked else 1 if self.failure == "sparse" else int(hit)
        s = replace(s, turn=s.turn + 1, pos=s.pos + advance, correct=s.correct + int(hit), calls=s.calls + looked,
                    revealed=(s.revealed or looked) and not advance, looked=s.looked or looked)
        won = s.correct == self.positions
        done = s.pos == self.positions or s.turn >= self.horizon
        self.state = s = replace(s, done=done)
        info: dict[str, Any] = {"turn": s.turn, "invalid_action": not legal, "tool_calls": s.calls,
                                "failed_step": self.failure == "visible" and not looked and not hit,
                                "positions_passed": s.correct, "move": move}
        reward = 0.0
        if done:
            info["success"] = info["em"] = float(won)
            reward = float(won) - self.tool_cost * s.calls
        return self.observation(s, results, hit), reward, done, False, info

    def observation(self, s: TaskState, results: Sequence[Any], hit: bool) -> str:
        if s.done:
            return ""
        if results:
            words = [str(results[0])]
        elif self.failure == "visible":
            words = ["ok" if hit else "no", TURN_MARKS[s.pos]]
        else:
            words = [TURN_MARKS[s.turn]]
        rng = random.Random(f"{s.salt}:{s.turn}")
        noise = (*self.moves, *FILLER)
        return " ".join(words + [rng.choice(noise) for _ in range(self.distractors)])

    def render(self) -> str:
        s = self.state
        return "(not reset)" if s is None else f"turn {s.turn}/{self.horizon}, {s.correct} of {self.positions} right"


# ---- the generator ------------------------------------------------------------------------------

PRIOR_NAMES = {"random": "random", "uniform": "format-only", "uses_tools": "uses_tools"}
TURN_TOKENS = (1, 2, 4, 8, 16, 32)
# A task whose format-level chance of success is outside this range is redrawn: below it no
# method sees a reward at a study's budgets, above it there is little to learn.
MIN_CHANCE, MAX_CHANCE = 1 / 64, 0.5


@dataclass(frozen=True)
class ProbeTaskParams:
    """One task of the family: the env's arguments, a turn's length and the model's prior."""

    seed: int
    horizon: int
    choices: int
    failure: str
    slack: int
    turn_tokens: int
    opening: bool
    tools: bool
    tool_cost: float
    distractors: int
    prior: str  # a probe model prior (envs.probe_model.PRIORS)
    key_seed: int
    max_chain_tokens: int | None = None  # the cap it was drawn under (a capped draw is another task)

    @property
    def name(self) -> str:
        return f"p{self.seed:03d}" + (f"c{self.max_chain_tokens}" if self.max_chain_tokens is not None else "")

    def env_kwargs(self) -> dict[str, Any]:
        """``ProbeTaskEnv``'s arguments (the env id is ``ProbeTask-v0``)."""
        return {k: v for k, v in asdict(self).items() if k not in ("seed", "turn_tokens", "prior", "max_chain_tokens")}

    def make(self) -> ProbeTaskEnv:
        return ProbeTaskEnv(**self.env_kwargs())

    def describe(self) -> str:
        """One line a report can print: every property that sets the task apart."""
        parts = [f"H={self.horizon}", f"{self.choices} moves", f"{self.failure} failure"]
        parts += [f"slack {self.slack}"] * bool(self.slack)
        parts += [f"{self.turn_tokens}-token turns", "move after `<`" if self.opening else "move first"]
        parts += [f"tool (cost {self.tool_cost:g})"] * self.tools
        parts += [f"{self.distractors} distractor(s)"] * bool(self.distractors)
        return ", ".join([*parts, f"prior {PRIOR_NAMES[self.prior]}"])


def _draw(rng: random.Random, seed: int, max_chain_tokens: int | None) -> ProbeTaskParams:
    horizon = rng.randint(2, 12)
    failure = rng.choice(FAILURES)
    choices = rng.choice((2, 2, 3, 4))
    tools = rng.random() < 1 / 3
    if failure == "visible" or tools:  # sparse failure without a tool has no use for spare turns
        slack = rng.randint(int(tools), min(3, horizon - 1))
    else:
        slack = 0
    opening = rng.random() < 1 / 3
    turn_tokens = rng.choice(TURN_TOKENS[1:] if opening else TURN_TOKENS)
    priors = ["uniform", "uniform"] + ["uses_tools"] * (2 * tools) + ["random"] * (not opening)
    return ProbeTaskParams(
        seed=seed, horizon=horizon, choices=choices, failure=failure, slack=slack, turn_tokens=turn_tokens,
        opening=opening, tools=tools, tool_cost=rng.choice((0.0, 0.05, 0.2)) if tools else 0.0,
        distractors=rng.choice((0, 0, 1, 2)), prior=rng.choice(priors), key_seed=rng.randrange(1000),
        max_chain_tokens=max_chain_tokens,
    )  # fmt: skip


def chance(params: ProbeTaskParams) -> float:
    """Exact success rate of the format-level policy: uniform legal moves (a look among them, with
    a tool), except that a ``uses_tools`` prior plays the key it has just looked up."""
    env = params.make()
    n_legal = len(env.legal_moves(ProbeState(keys=())))
    p_hit, p_look = 1 / n_legal, float(params.tools) / n_legal
    p_miss = 1 - p_hit - p_look
    copies = params.prior == "uses_tools"

    @functools.cache
    def win(pos: int, turn: int, revealed: bool) -> float:
        if pos == env.positions:
            return 1.0
        if turn == env.horizon:
            return 0.0
        if revealed and copies:
            return win(pos + 1, turn + 1, False)
        blocked = win(pos, turn + 1, revealed) if params.failure == "visible" else 0.0
        return p_hit * win(pos + 1, turn + 1, False) + p_look * win(pos, turn + 1, True) + p_miss * blocked

    return win(0, 0, False)


def sample_task(seed: int, max_chain_tokens: int | None = None) -> ProbeTaskParams:
    """The family's task number ``seed``: the same parameters for the same seed, on any machine.

    Draws are redrawn until the format-level chance of success is in [MIN_CHANCE, MAX_CHANCE]
    and, if ``max_chain_tokens`` is given, a chain (horizon x turn length) fits in it.
    """
    rng = random.Random(f"treegym-probe-task:{seed}")
    for _ in range(1000):
        params = _draw(rng, seed, max_chain_tokens)
        if max_chain_tokens is not None and params.horizon * params.turn_tokens > max_chain_tokens:
            continue
        if MIN_CHANCE <= chance(params) <= MAX_CHANCE:
            return params
    raise ConfigError(f"no probe task within the chance range after 1000 draws (seed {seed})")


def sample_tasks(seeds: Sequence[int], max_chain_tokens: int | None = None) -> tuple[ProbeTaskParams, ...]:
    """The tasks of ``seeds``, in order."""
    return tuple(sample_task(s, max_chain_tokens) for s in seeds)
