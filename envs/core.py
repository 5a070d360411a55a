"""The contract every treegym environment keeps: text in, text out, snapshot and fork.

A treegym environment is a ``gymnasium.Env[str, str]`` whose whole episode state is one
immutable value (``self.state``). Everything else on the instance is either configuration or
a shared, read-only backend (an index, an HTTP session, world templates). That split is what
makes the two operations this project exists for cheap:

- ``snapshot()`` returns the state value itself, wrapped: no copying, no tool calls.
- ``fork()`` makes a new instance that shares every backend and points at the same state
  value. Since the state is never mutated in place (a step builds a new one), the fork and
  the original evolve independently from there.

A step is two phases, so that a pool of envs can batch tool calls across envs:

1. ``plan(action) -> Plan``: parse the action and say which tool calls it needs. A ``Plan`` is a
   frozen value; the env's state is untouched and nothing is kept on the env.
2. ``resolve(plan, results) -> (obs, reward, terminated, truncated, info)``: apply the results.

``step(action)`` runs both, executing the calls on the env's own tools in between. Since no
scratch state lives on the env between the phases, a fork or snapshot at any moment is
harmless; ``resolve`` refuses a plan made in another state (e.g. after a step in between).

A step's info may flag it as failed, for rules that branch before a failure (restart at
failure): ``info["invalid_action"]`` (the action could not be parsed or done) or
``info["failed_step"]`` (a valid action that had no effect: a blocked move, an empty search).

An episode ends when a step returns ``terminated`` or ``truncated``. Every env then refuses
the next step the same way, from ``plan``: ``TreegymError("step() after the episode ended:
call env.reset()")`` (and ``"step() before reset()"`` before the first reset). ``restore``
takes only a ``Snapshot`` of the same env class whose state is the class's declared state
type (``ForkableEnv[ItsState]``), every field of the declared type (``state_check``) and within
the env's own rules (``state_problem``), so a hand-made or tampered snapshot fails there with a
``SnapshotError``, not in a later step.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.error import CustomSpaceError
from gymnasium.vector.utils import create_shared_memory

from treegym.envs.state_check import shape_problem
from treegym.errors import SnapshotError, TreegymError

StateT = TypeVar("StateT")

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class UnicodeText(spaces.Text):
    """A text space that holds any Unicode string of at most ``max_length`` characters.

    gymnasium's ``Text`` only admits a fixed charset; an LLM's turn can hold any character,
    so membership here checks type and length only. Sampling still draws from the default
    alphanumeric charset, which is a subset.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )


@create_shared_memory.register(UnicodeText)
def _no_shared_memory_for_text(space: UnicodeText, n: int = 1, ctx: Any = None) -> Any:
    # gymnasium 1.x's AsyncVectorEnv reads a Text buffer once, at construction, so with
    # shared_memory=True every later observation comes back stale ("000..."); and the buffer
    # encodes only Text's alphanumeric charset. Refusing makes AsyncVectorEnv say so.
    raise CustomSpaceError(f"{space} cannot go through shared memory: use AsyncVectorEnv(..., shared_memory=False)")


@dataclass(frozen=True)
class ToolCall:
    """One call an action needs: which of the env's tools, and its argument."""

    tool: str
    payload: Any


@runtime_checkable
class Tool(Protocol):
    """A backend that serves many calls at once (one FAISS search, concurrent HTTP requests).

    ``call_batch`` must return one result per payload, in order. A failure of one call is a
    result (e.g. an error string or object), never an exception that loses the others.
    A tool may define ``batch_key``: tools with equal keys are interchangeable, and a pool
    sends all their calls to one of them in one batch.
    """

    def call_batch(self, payloads: Sequence[Any]) -> list[Any]: ...


@dataclass(frozen=True)
class ToolError:
    """A failed tool call, returned in place of its result so that the batch's other calls
    survive; ``message`` is what the agent reads.

    ``unreachable``: the tool itself could not run (its server is down, its backend broken), as
    opposed to a call that ran and failed (a page that does not exist). No action could have
    done better, so the episode is not the agent's to score: the env ends it with
    ``info["failed_to_run"]`` (the message), and eval and training leave it out of their figures.
    """

    message: str
    unreachable: bool = False


@dataclass(frozen=True)
class Snapshot(Generic[StateT]):
    """An env's state at one moment. Immutable and picklable; restoring it is exact.

    ``wrappers`` holds the state of the wrappers above the env, outermost first, as
    ``(wrapper class name, ((attribute, value), ...))``; ``treegym.envs.snapshot`` fills it for
    an env made by ``gym.make`` (a TimeLimit's step count, RecordEpisodeStatistics' counters),
    and ``treegym.envs.restore`` puts it back. An env's own ``snapshot()`` leaves it empty.
    """

    env_class: str
    state: StateT
    wrappers: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()


@dataclass(frozen=True)
class Plan:
    """Phase one of a step, as a value: the tool calls an action needs and what the env made of
    the action (for its ``resolve``). ``state`` is the state it was planned in."""

    calls: tuple[ToolCall, ...] = ()
    parsed: Any = None
    state: Any = field(default=None, compare=False, repr=False)


class ForkableEnv(gym.Env[str, str], Generic[StateT]):
    """Base class of every treegym environment.

    Subclasses implement ``_reset_state``, ``plan`` and ``resolve``;
    they keep all episode state in ``self.state`` (an immutable value, typically a frozen
    dataclass of tuples and scalars) and never mutate it in place.

    Attributes:
        tools: name -> Tool. Shared by every fork; must be safe to call from any fork.
        state: the current episode state, or ``None`` before the first reset.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}

    tools: dict[str, Tool]
    state: StateT | None = None
    # Text that ends an agent's turn in this env's protocol: its closing tags (``</search>``), or a
    # household command's end of line. The family record reads it (``Family.action_stops``) and
    # the samplers add it to their stops; no table elsewhere lists an env's stops.
    action_stops: tuple[str, ...] = ()
    # The info keys that hold the task's labels (gold answers, supporting ids): for the env's
    # own scoring and in-process helpers only; ``treegym.envs.public_info`` drops them from
    # whatever crosses a wire (serve-env, the TRL adapter).
    label_keys: frozenset[str] = frozenset()

    def __init__(self, *, max_obs_chars: int = 1 << 20, max_action_chars: int = 1 << 20,
                 render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata.get("render_modes", ()):
            raise ValueError(f"render_mode must be None or one of {self.metadata.get('render_modes')}, got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = UnicodeText(max_obs_chars)
        self.action_space = UnicodeText(max_action_chars)
        self.tools = {}
        self.state = None
        self._rng_state: dict[str, Any] | None = None

    # ---- subclass hooks -------------------------------------------------------------------

    def _reset_state(self, options: dict[str, Any]) -> tuple[StateT, str, dict[str, Any]]:
        """Draw a task with ``self.np_random`` and return (state, opening prompt, info)."""
        raise NotImplementedError

    def plan(self, action: str) -> Plan:
        """Phase one of a step: parse ``action`` into a ``Plan`` (see ``make_plan``).

        Must not change ``self.state`` or keep anything on the env.
        """
        raise NotImplementedError

    def resolve(self, plan: Plan, results: Sequence[Any]) -> StepResult:
        """Phase two of a step: apply the results of ``plan.calls`` (in order), advance the state.
        Implementations start with ``self.check_plan(plan)``."""
        raise NotImplementedError

    def action_key(self, action: str) -> str:
        """What ``action`` would do in the current state, as a string: two actions with the same
        key are the same move (the same tool calls and the same parsed action: query, answer,
        command) however their text differs. Samplers make sibling branches distinct by it.
        An env whose ``plan`` parses nothing keys an action by its whitespace-normalised text."""
        plan = self.plan(action)
        if not plan.calls and plan.parsed is None:
            return " ".join(str(action).split())
        return repr((plan.calls, plan.parsed))

    # ---- gymnasium API --------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if seed is not None:
            self._rng_state = None
        super().reset(seed=seed)
        self.state, obs, info = self._reset_state(dict(options or {}))
        return obs, info

    def step(self, action: str) -> StepResult:
        plan = self.plan(action)
        return self.resolve(plan, execute_calls(self.tools, plan.calls))

    def render(self) -> str:
        return repr(self.state)

    def task_ids(self) -> list[str] | None:
        """The ids of this env's tasks (its split), each a valid ``reset(options={"task_id": id})``;
        None when tasks are drawn from the seed alone."""
        return None

    # ---- snapshot and fork ----------------------------------------------------------------

    def snapshot(self) -> Snapshot[StateT]:
        """The current state, wrapped. O(1): the state value is immutable and shared."""
        return Snapshot(type(self).__qualname__, self.state)

    def restore(self, snapshot: Snapshot[StateT]) -> None:
        """Put the env back into the state captured by ``snapshot``."""
        if not isinstance(snapshot, Snapshot):
            raise TypeError(f"restore() takes a Snapshot, got {type(snapshot).__name__}")
        if snapshot.env_class != type(self).__qualname__:
            raise ValueError(f"snapshot of {snapshot.env_class} cannot restore a {type(self).__qualname__}")
        want = state_type(type(self)) or getattr(type(self), "state_class", None)  # QAEnv[S] names its own
        if snapshot.state is not None and want is not None and not isinstance(snapshot.state, want):
            raise SnapshotError(f"snapshot state must be a {want.__name__} (or None), got "
                                f"{type(snapshot.state).__name__}: restore only what snapshot() returned")
        if snapshot.state is not None:
            # A snapshot may have crossed a wire or a file: check it all before the env uses any of it.
            hint = want if want is not None and dataclasses.is_dataclass(want) else Any
            problem = shape_problem(snapshot.state, hint) or self.state_problem(snapshot.state)
            if problem:
                raise SnapshotError(f"snapshot refused: {problem}; restore only what this env's snapshot() "
                                    "returned")
        self.state = snapshot.state

    def state_problem(self, state: StateT) -> str | None:
        """What makes ``state`` (already of the declared shape) one this env cannot step from:
        a number out of its range, a task it does not know. None when it can. ``restore()`` asks."""
        return None

    def fork(self) -> ForkableEnv[StateT]:
        """A new env in the same state, sharing backends and nothing mutable."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        # The RNG is the one mutable object gymnasium keeps on the env. The fork gets the
        # parent's RNG state (a plain dict, ~10 µs) and builds its own generator from it only
        # if it ever draws (deep-copying a Generator costs ~100x more than the rest of fork).
        if self._np_random is not None:
            new._rng_state = self._np_random.bit_generator.state
            new._np_random = None
        return new

    @property
    def np_random(self) -> np.random.Generator:
        if self._np_random is None and self.__dict__.get("_rng_state") is not None:
            state = self._rng_state
            bit_generator = getattr(np.random, state["bit_generator"])()
            bit_generator.state = state
            self._np_random, self._rng_state = np.random.Generator(bit_generator), None
        return gym.Env.np_random.fget(self)

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._rng_state = None
        gym.Env.np_random.fset(self, value)

    def __deepcopy__(self, memo: dict[int, Any]) -> ForkableEnv[StateT]:
        return self.fork()

    # ---- helpers for subclasses -----------------------------------------------------------

    def make_plan(self, calls: Sequence[ToolCall] = (), parsed: Any = None) -> Plan:
        """The ``Plan`` of an action in the current state."""
        return Plan(tuple(calls), parsed, self.state)

    def check_plan(self, plan: Plan) -> None:
        """Refuse a plan that is not one of this env's, or was made in another state."""
        if not isinstance(plan, Plan):
            raise TypeError(f"resolve() takes the Plan that plan() returned, got {type(plan).__name__}")
        if plan.state is not self.state:
            raise TreegymError("resolve() with a plan made in another state: plan() again after a step, reset or restore")


def success(info: dict[str, Any]) -> float:
    """An episode's success, read from its last info: the contract's ``success`` key (1.0 or
    0.0) on the terminal step; 0.0 for an episode that a caller cut before the env ended it."""
    return float(info.get("success", 0.0))


def failed_to_run(info: dict[str, Any]) -> str | None:
    """Why an episode could not be played (a tool it needs was unreachable), read from its last
    info; None for an episode that ran. Such an episode has no score: leave it out of every figure."""
    why = info.get("failed_to_run")
    return str(why) if why else None


class NotForkableError(TreegymError, TypeError):
    """An env that is not a treegym env where forking needs one."""


# Wrappers that only check or order calls: stepping the env under them through its two phases
# changes nothing, so a sampler may batch such envs.
BOOKKEEPING_WRAPPERS = (gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)


def base_env(env: gym.Env, *, bare: bool = False) -> ForkableEnv:
    """The treegym env under ``env``'s wrappers, or a ``NotForkableError``.

    With ``bare=True``, only bookkeeping wrappers may sit on top: a sampler steps envs through
    ``plan``/``resolve``, which a wrapper that changes actions, observations or rewards cannot
    see, so such a wrapper is refused rather than silently dropped.
    """
    inner = env
    while isinstance(inner, gym.Wrapper):
        if bare and not isinstance(inner, BOOKKEEPING_WRAPPERS):
            raise NotForkableError(
                f"{type(inner).__name__} wraps the env: sampling steps envs through plan/resolve, which it "
                "cannot see. Pass the env without that wrapper (gym.make's own wrappers are fine)")
        inner = inner.env
    if not isinstance(inner, ForkableEnv):
        raise NotForkableError(f"{type(inner).__name__} is not a treegym env (ForkableEnv): it cannot be forked or snapshotted")
    return inner


def state_type(cls: type) -> type | None:
    """The state class an env declares as ``ForkableEnv[ItsState]``; None if it names none."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is ForkableEnv:
                (arg,) = typing.get_args(base)
                return arg if isinstance(arg, type) else None
    return None


def require_running(state: Any, ended: bool) -> None:
    """The one way every env refuses a step: before its first reset, or after its episode
    ended (terminated or truncated). Called from ``plan``, so an EnvPool refuses it too."""
    if state is None:
        raise TreegymError("step() before reset(): call env.reset() first")
    if ended:
        raise TreegymError("step() after the episode ended: call env.reset()")


def execute_calls(tools: dict[str, Tool], calls: Sequence[ToolCall]) -> list[Any]:
    """Run one env's ``calls`` against its ``tools``, one ``call_batch`` per tool."""
    return run_grouped([(tools, calls)])[0][0]


def run_grouped(requests: Sequence[tuple[dict[str, Tool], Sequence[ToolCall]]]) -> tuple[list[list[Any]], list[tuple[str, int]]]:
    """Execute each (tools, calls) request, batching calls that go to the same tool: the results
    per request, and the batches issued as (tool name, calls in it)."""
    groups: dict[object, tuple[str, Tool, list[tuple[int, int]]]] = {}
    for r, (tools, calls) in enumerate(requests):
        for c, call in enumerate(calls):
            if call.tool not in tools:
                raise KeyError(f"env has no tool {call.tool!r} (has {sorted(tools)})")
            tool = tools[call.tool]
            groups.setdefault(batch_key(tool), (call.tool, tool, []))[2].append((r, c))
    results: list[list[Any]] = [[None] * len(calls) for _, calls in requests]
    batches = []
    for name, tool, slots in groups.values():
        out = tool.call_batch([requests[r][1][c].payload for r, c in slots])
        if len(out) != len(slots):
            raise RuntimeError(f"tool {name!r} returned {len(out)} results for {len(slots)} calls")
        for (r, c), value in zip(slots, out):
            results[r][c] = value
        batches.append((name, len(slots)))
    return results, batches


def batch_key(tool: Tool) -> object:
    """Tools with equal keys serve each other's calls: envs built separately over one index
    have separate tool objects but should still share one batched search."""
    key = getattr(tool, "batch_key", None)
    return ("key", key) if key is not None else ("id", id(tool))
