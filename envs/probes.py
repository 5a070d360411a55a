"""Probe environments: tiny, forkable tasks that isolate one property of multi-turn RL.

Each probe is a unit benchmark for a training algorithm, the way CartPole is for a policy
gradient: small enough that a run trains to convergence on a CPU in seconds, and shaped so
that one mechanism (credit over turns, exploration under a sparse reward, using what an
earlier turn observed) decides whether it learns. ``treegym study`` runs algorithms on them at
equal budgets; ``treegym.envs.probe_model.build_probe_model`` makes the matching tiny model.

All probes share one word vocabulary (``VOCAB``) and read a turn the same way: the turn's
*first word* is its move; every later word is free text that the env ignores. Run them with a
fixed turn length (``sampler.max_new_tokens = L`` and ``sampler.ignore_eos = true``) to model
LLM turns of L tokens, of which only a few decide the outcome. A first word that is not a
legal move is an invalid action (``info["invalid_action"]``) and counts as wrong.

- ``ProbeKeys-v0`` (dense): say the turn's key, ``horizon`` turns. Reward 1/horizon per
  correct turn, feedback "ok"/"no" after each.
- ``ProbeLock-v0`` (sparse, terminal only): ``horizon`` turns (2 to 8), each a choice among
  ``choices`` symbols; reward 1 at the end only if every turn was right, no feedback on the
  way (the observation is the next turn's number). A uniform policy over the legal moves earns it with probability choices^-horizon.
- ``ProbeLookup-v0`` (information gathering): a hidden key (one of ``choices`` symbols,
  drawn per episode). ``?`` on the first turn calls the lookup tool, whose result (the key)
  is the observation; the last turn must name the key (one of the symbols). Reward 1 at the
  end if it does. A policy that never looks is right 1/choices of the time; look-then-copy is
  always right. Under the format prior looking does not pay until copying is learned, and
  copying is learned only in the episodes that looked: the chicken-and-egg of tool use.

- ``ProbeMaze-v0`` (deep horizon, visible failure, terminal reward): a corridor of ``doors``
  doors, each opened by one of ``choices`` symbols (fixed by ``key_seed``), and ``horizon``
  turns (at least ``doors``). A right move opens the door and the agent walks on; a wrong one
  is blocked and costs the turn. Each observation says which ("ok"/"no") and the number of
  the door now ahead; a blocked move sets ``info["failed_step"]``. Reward 1 only at the end,
  if every door was passed within the turns (the episode ends at the last door or when the
  turns run out). Agent tasks look like this: many turns, failures you can see, a payoff
  only on success.

``ProbeTask-v0`` (``probe_family.py``) spans these properties as arguments of one env, with a
generator that draws a task's parameters from a seed, so that a study can hold tasks out.

The terminal step's info holds ``success`` and ``em`` (equal: 1.0 or 0.0). A step after the
episode ended raises ``TreegymError``, as the QA envs do.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from treegym.envs.core import ForkableEnv, Plan, StepResult, ToolCall, require_running
from treegym.envs.registry import Family, register_family
from treegym.errors import ConfigError

TURN_MARKS = tuple(str(i) for i in range(1, 17))  # Lock's observation: the number of the next turn
VOCAB = ("[PAD]", "[EOS]", "A", "B", "C", "D", "E", "F", "?", "x", "go", "ok", "no", *TURN_MARKS)
SYMBOLS = ("A", "B", "C", "D", "E", "F")
LOOK = "?"
FILLER = ("x",)  # free-text words, besides any other word
PROMPT = "go"


@dataclass(frozen=True)
class ProbeState:
    """One episode: the turn index, the keys it must say, and what it has done so far."""

    keys: tuple[str, ...]  # the right move of each turn (Lookup: the hidden key alone)
    turn: int = 0
    correct: int = 0
    looked: bool = False
    done: bool = False


class LookupTool:
    """The Lookup probe's one tool: the payload is the hidden key; the result reveals it.

    A real tool would read it from somewhere; the point is that the key only reaches the
    context through a tool call, which the pool batches and counts like any other.
    """

    batch_key = ("probe-lookup",)

    def call_batch(self, payloads: Sequence[Any]) -> list[Any]:
        return [str(p) for p in payloads]


class ProbeEnv(ForkableEnv[ProbeState]):
    """Shared machinery of the probes; subclasses set the keys and the reward rule.

    Args:
        horizon: turns per episode.
        choices: legal moves per turn (the first ``choices`` of ``SYMBOLS``).
        key_seed: seeds the fixed key sequence (Keys, Lock); task seeds draw Lookup's key.
        render_mode: None or ``"ansi"`` (``render()`` returns the turn and the right count).
    """

    dense = False
    obs_words = 1  # words per observation (the probe model's context length is sized by it)
    vocab = VOCAB  # the probe model's words
    opening: str | None = None  # a fixed word every turn opens with, before its move (None: the move is first)

    def __init__(self, horizon: int = 4, choices: int = 2, key_seed: int = 0, render_mode: str | None = None) -> None:
        super().__init__(max_obs_chars=16, max_action_chars=4096, render_mode=render_mode)
        if not 1 <= horizon <= 16:
            raise ConfigError(f"{type(self).__name__}: horizon must be in 1..16, got {horizon}")
        if not 2 <= choices <= len(SYMBOLS):
            raise ConfigError(f"{type(self).__name__}: choices must be in 2..{len(SYMBOLS)}, got {choices}")
        self.horizon = horizon
        self.choices = choices
        self.key_seed = key_seed
        self.moves = SYMBOLS[:choices]
        rng = random.Random(f"{type(self).__name__}:{key_seed}")
        self.fixed_keys = tuple(rng.choice(self.moves) for _ in range(horizon))

    # -- what each probe defines --------------------------------------------------------------

    def legal_moves(self, state: ProbeState) -> tuple[str, ...]:
        return self.moves

    def draw_keys(self) -> tuple[str, ...]:
        return self.fixed_keys

    def right(self, state: ProbeState, move: str) -> bool:
        return move == state.keys[state.turn]

    def feedback(self, state: ProbeState, hit: bool) -> str:
        return "ok" if hit else "no"

    def key_count(self) -> int:
        """How many keys a state of this probe holds."""
        return len(self.fixed_keys)

    def state_problem(self, state: ProbeState) -> str | None:
        if len(state.keys) != self.key_count() or not set(state.keys) <= set(self.moves):
            return f"state.keys holds {len(state.keys)} keys, not {self.key_count()} of {''.join(self.moves)}"
        if not 0 <= state.correct <= state.turn <= self.horizon:
            return f"state.turn ({state.turn}) and state.correct ({state.correct}) are not 0 <= correct <= turn " \
                   f"<= {self.horizon}"
        return None
    def prior_answer(self, state: ProbeState, looked: str | None) -> str | None:
        """The move a ``uses_tools`` format prior plays here, given the last looked-up result
        (None: a uniform legal move): the answer turn copies the result."""
        return looked if looked in self.legal_moves(state) and state.turn == self.horizon - 1 else None

    def shape(self) -> dict[str, Any]:
        """Arguments beyond horizon, choices and key seed that change the task (the model cache's key)."""
        return {}

    # -- the step -------------------------------------------------------------------------------

    def _reset_state(self, options: dict[str, Any]) -> tuple[ProbeState, str, dict[str, Any]]:
        unknown = set(options) - {"task_id"}
        if unknown:
            raise ConfigError(f"{type(self).__name__}.reset: unknown options {sorted(unknown)}")
        return ProbeState(keys=self.draw_keys()), PROMPT, {"horizon": self.horizon, "choices": self.choices}

    def plan(self, action: str) -> Plan:
        s = self.state
        require_running(s, s is not None and s.done)
        assert s is not None
        words = str(action).split()
        move = words[0] if words else ""
        calls = [ToolCall("lookup", s.keys[-1])] if self._calls_lookup(s, move) else []
        return self.make_plan(calls, move)

    def _calls_lookup(self, state: ProbeState, move: str) -> bool:
        return False

    def resolve(self, plan: Plan, results: Sequence[Any]) -> StepResult:
        self.check_plan(plan)
        move, s = plan.parsed, self.state
        legal = move in self.legal_moves(s)
        hit = legal and self.right(s, move)
        looked = s.looked or bool(results)
        s = replace(s, turn=s.turn + 1, correct=s.correct + int(hit), looked=looked)
        done = s.turn >= self.horizon
        s = replace(s, done=done)
        self.state = s
        info: dict[str, Any] = {"turn": s.turn, "invalid_action": not legal, "tool_calls": int(s.looked)}
        if results:
            obs = str(results[0])
        else:
            obs = "" if done else self.feedback(s, hit)
        if self.dense:
            reward = hit / self.horizon
        else:
            reward = float(done and s.correct == self.horizon)
        if done:
            info["success"] = info["em"] = float(s.correct == self.horizon)
        return obs, reward, done, False, info

    def render(self) -> str:
        s = self.state
        return "(not reset)" if s is None else f"turn {s.turn}/{self.horizon}, {s.correct} right"


class ProbeKeysEnv(ProbeEnv):
    """Dense reward: say the turn's key (fixed by ``key_seed``) on each of ``horizon`` turns."""

    dense = True

    def __init__(self, horizon: int = 4, choices: int = 4, key_seed: int = 0, render_mode: str | None = None) -> None:
        super().__init__(horizon, choices, key_seed, render_mode)


class ProbeLockEnv(ProbeEnv):
    """Terminal-only reward: the whole key sequence right, or nothing; no feedback.

    The observation after turn t is the number of the next turn ("2", "3", ...): where the
    agent is, never whether it was right.
    """

    def feedback(self, state: ProbeState, hit: bool) -> str:
        return TURN_MARKS[state.turn]


class ProbeLookupEnv(ProbeEnv):
    """Information gathering: look the hidden key up (``?``) first, name it on the last turn.

    Only the last turn is graded. With ``horizon`` > 2, the turns in between accept any legal
    move: the key has to be carried across them in the context.
    """

    def __init__(self, horizon: int = 2, choices: int = 4, key_seed: int = 0, render_mode: str | None = None) -> None:
        super().__init__(horizon, choices, key_seed, render_mode)
        if self.horizon < 2:
            raise ConfigError("ProbeLookupEnv: horizon must be at least 2 (look, then answer)")
        self.tools = {"lookup": LookupTool()}

    def draw_keys(self) -> tuple[str, ...]:
        return (self.moves[int(self.np_random.integers(len(self.moves)))],)

    def key_count(self) -> int:
        return 1

    def legal_moves(self, state: ProbeState) -> tuple[str, ...]:
        # The answer is one of the symbols; before it, looking is one of the moves.
        return self.moves if state.turn == self.horizon - 1 else (LOOK, *self.moves)

    def right(self, state: ProbeState, move: str) -> bool:
        # Only the answer is graded: looking is not rewarded, it is what makes the answer known.
        return move == state.keys[0] if state.turn == self.horizon - 1 else True

    def _calls_lookup(self, state: ProbeState, move: str) -> bool:
        return state.turn == 0 and move == LOOK

    def feedback(self, state: ProbeState, hit: bool) -> str:
        return "go"


class ProbeMazeEnv(ProbeEnv):
    """A corridor of ``doors`` doors in ``horizon`` turns; a blocked move is seen, and costs a turn.

    The state's ``correct`` counts the doors passed; ``keys`` holds each door's symbol.
    """

    obs_words = 2

    def __init__(self, horizon: int = 8, doors: int | None = None, choices: int = 2, key_seed: int = 0,
                 render_mode: str | None = None) -> None:
        super().__init__(horizon, choices, key_seed, render_mode)
        doors = horizon if doors is None else doors  # no slack: a lock that says when a move is wrong
        if not 1 <= doors <= horizon:
            raise ConfigError(f"ProbeMazeEnv: doors must be in 1..horizon ({horizon}), got {doors}")
        self.doors = doors
        self.fixed_keys = self.fixed_keys[:doors]

    def right(self, state: ProbeState, move: str) -> bool:
        return move == state.keys[state.correct]

    def resolve(self, plan: Plan, results: Sequence[Any]) -> StepResult:
        self.check_plan(plan)
        move, s = plan.parsed, self.state
        legal = move in self.moves
        hit = legal and self.right(s, move)
        s = replace(s, turn=s.turn + 1, correct=s.correct + int(hit))
        won = s.correct == self.doors
        done = won or s.turn >= self.horizon
        self.state = s = replace(s, done=done)
        info: dict[str, Any] = {"turn": s.turn, "invalid_action": not legal, "failed_step": not hit, "tool_calls": 0,
                                "doors_passed": s.correct}
        if done:
            info["success"] = info["em"] = float(won)
        obs = "" if done else f"{'ok' if hit else 'no'} {TURN_MARKS[s.correct]}"
        return obs, float(won), done, False, info

    def render(self) -> str:
        s = self.state
        return "(not reset)" if s is None else f"turn {s.turn}/{self.horizon}, door {s.correct + 1} of {self.doors}"


# Each probe is a family of its own, with no training defaults and no expert: the study sets its
# shape (horizon, choices) per task (``treegym.study.grid``); ProbeTask-v0 is the parametric family.
PROBE_IDS: dict[str, str] = {
    "ProbeKeys-v0": "treegym.envs.probes:ProbeKeysEnv",
    "ProbeLock-v0": "treegym.envs.probes:ProbeLockEnv",
    "ProbeLookup-v0": "treegym.envs.probes:ProbeLookupEnv",
    "ProbeMaze-v0": "treegym.envs.probes:ProbeMazeEnv",
    "ProbeTask-v0": "treegym.envs.probe_family:ProbeTaskEnv",  # the parametric family (probe_family.py)
}
for _id, _entry in PROBE_IDS.items():
    register_family(Family(id=_id, entry_point=_entry))
