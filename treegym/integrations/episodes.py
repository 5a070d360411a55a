"""Live episodes of one env, by id, for a server: bounded in number, expiring when idle.

Every episode is a fork of one template env (so all of them share its read-only backends);
fork, snapshot and restore act on episodes by id. Thread-safe: the store's lock guards the
tables, each episode's lock guards its env. Needs no server package; ``openenv.py`` serves it.

Ownership: ids are chosen here and unguessable (``secrets``), yet an id is not a right: ids
travel in every observation and end up in logs. Every episode and snapshot belongs to the
session that made it (its ``creator``), and every call that names one says which session
calls (the ``caller``; over HTTP, by the session's secret token, ``open_session``): an episode
of another session is, to the caller, an episode that does not exist (the same error, word for
word, so a refusal tells nothing). A fork belongs to the creator of the episode it was forked
from, counts against that session's ``max_forks`` (never against the ``max_episodes`` that
resets need, so forks cannot starve other sessions), and is freed with that session. A
snapshot counts against its session's ``max_session_snapshots`` as well as the server's
``max_snapshots``, so one session cannot take them all; it restores only into an episode of
the same session. ``delete`` frees an episode early.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym

from treegym.envs import ForkableEnv, Snapshot, fork, public_info, restore, snapshot
from treegym.errors import ConfigError, TreegymError


class EpisodeNotFoundError(TreegymError, KeyError):
    """No live episode (or snapshot) has this id: it never existed, was closed, or expired."""

    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0])


class SessionLimitError(TreegymError):
    """The server already holds as many live episodes (or snapshots) as it may."""


@dataclass(frozen=True)
class Observed:
    """The last thing an episode showed: the opening prompt after a reset, or a step's result.
    ``info`` is the env's info without its labels (``treegym.envs.public_info``): it goes on the wire."""

    text: str
    reward: float | None = None
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass
class Episode:
    """One live episode: its env and what the store knows about it. Guarded by ``lock``."""

    env: gym.Env
    last: Observed
    steps: int = 0
    task_id: str | None = None
    parent_id: str | None = None
    owner: object | None = None  # the session that drives it, if any; it dies with that session
    creator: object | None = None  # the session it belongs to and counts against; it dies with it too
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class SavedSnapshot:
    """A treegym snapshot plus the episode bookkeeping that goes with it."""

    snap: Snapshot
    last: Observed
    steps: int
    task_id: str | None
    creator: object | None = None  # the session of the episode it was taken from


_ANY: Any = object()  # "whichever session": the server's own look-ups, never a client's


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (numpy scalars -> numbers, tuples -> lists, NaN -> None, others -> str)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if callable(getattr(value, "item", None)):  # a numpy scalar
        try:
            return jsonable(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


class EpisodeStore:
    """Episodes and snapshots of ``template``'s env, by id.

    At most ``max_episodes`` sessions' episodes (not forks), ``max_forks`` forks per session,
    ``max_snapshots`` snapshots in all and ``max_session_snapshots`` per session are live; past
    that, creating one raises ``SessionLimitError``. One unused for ``idle_timeout_s`` is dropped.
    """

    def __init__(self, template: gym.Env, env_id: str, *, max_episodes: int = 64, max_forks: int = 16,
                 max_snapshots: int = 1024, max_session_snapshots: int = 128,
                 idle_timeout_s: float = 600.0) -> None:
        if not isinstance(template.unwrapped, ForkableEnv):
            raise ConfigError(f"{env_id} is not a treegym env: it cannot be forked or snapshotted")
        if (max_episodes < 1 or max_forks < 0 or max_snapshots < 1 or max_session_snapshots < 1
                or not idle_timeout_s > 0):
            raise ConfigError("max_episodes, max_snapshots and max_session_snapshots must be at least 1, "
                              "max_forks at least 0, idle_timeout_s above 0")
        self.template, self.env_id = template, env_id
        self.max_episodes, self.max_forks = max_episodes, max_forks
        self.max_snapshots, self.max_session_snapshots = max_snapshots, max_session_snapshots
        self.idle_timeout_s = idle_timeout_s
        self._episodes: dict[str, Episode] = {}
        self._snapshots: dict[str, tuple[SavedSnapshot, float]] = {}
        self._sessions: dict[str, object] = {}  # secret token -> session
        self._lock = threading.Lock()

    # -- sessions ------------------------------------------------------------------------------

    def open_session(self, session: object) -> str:
        """A secret token (144 random bits) that names ``session`` to calls that come without
        it (the HTTP routes); it dies with ``end_session``."""
        token = secrets.token_urlsafe(18)
        with self._lock:
            self._sessions[token] = session
        return token

    def session(self, token: str | None) -> object | None:
        """The live session that ``token`` names, or None (no such token: a caller of nothing)."""
        with self._lock:
            return None if token is None else self._sessions.get(token)

    # -- the tables (callers hold self._lock) -------------------------------------------------

    def _sweep(self) -> None:
        cutoff = time.monotonic() - self.idle_timeout_s
        for eid in [e for e, ep in self._episodes.items() if ep.last_used < cutoff and not ep.lock.locked()]:
            del self._episodes[eid]
        for sid in [s for s, (_, used) in self._snapshots.items() if used < cutoff]:
            del self._snapshots[sid]

    def _new_id(self, creator: object, fork: bool) -> str:
        self._sweep()
        if fork:
            held = sum(ep.parent_id is not None and ep.creator is creator for ep in self._episodes.values())
            if held >= self.max_forks:
                raise SessionLimitError(
                    f"this session holds {held} forks, its limit (--max-forks): free one with DELETE "
                    f"/episodes/ID, or wait for idle ones to expire (after {self.idle_timeout_s:g} s)")
        else:
            held = sum(ep.parent_id is None for ep in self._episodes.values())
            if held >= self.max_episodes:
                raise SessionLimitError(
                    f"the server holds {held} live episodes, its limit (--max-episodes): close a "
                    f"session, or wait for idle episodes to expire (after {self.idle_timeout_s:g} s)")
        return secrets.token_urlsafe(18)  # 144 random bits: an id nobody can guess

    def _get(self, episode_id: str, caller: object = _ANY) -> Episode:
        """The episode, if ``caller`` made or drives it; to any other caller it does not exist."""
        self._sweep()
        ep = self._episodes.get(episode_id)
        if ep is None or (caller is not _ANY and (caller is None or (caller is not ep.creator
                                                                     and caller is not ep.owner))):
            raise EpisodeNotFoundError(
                f"no live episode {episode_id!r} of this session: it never existed, was closed, or was "
                f"idle for more than {self.idle_timeout_s:g} s; call reset()")
        ep.last_used = time.monotonic()
        return ep

    # -- episodes -------------------------------------------------------------------------------

    def create(self, owner: object, *, seed: int | None = None, task_id: str | None = None,
               options: dict[str, Any] | None = None) -> str:
        """A new episode, reset with ``seed`` and ``options`` (``task_id``, if given, joins them),
        driven by and belonging to ``owner``; returns its (unguessable) id."""
        options = {**(options or {}), **({} if task_id is None else {"task_id": task_id})}
        task_id = None if options.get("task_id") is None else str(options["task_id"])
        with self._lock:
            eid = self._new_id(owner, fork=False)
            ep = self._episodes[eid] = Episode(fork(self.template), Observed(""), owner=owner, creator=owner)
        try:
            with ep.lock:
                text, info = ep.env.reset(seed=seed, options=options or None)
                ep.last = Observed(str(text), info=jsonable(public_info(self.template, info)))
                ep.task_id = task_id if task_id is not None else _task_of(info)
        except BaseException:
            self.drop(eid)
            raise
        return eid

    def get(self, episode_id: str, caller: object = _ANY) -> Episode:
        """The episode ``episode_id`` of ``caller`` (any session's, for the server's own use)."""
        with self._lock:
            return self._get(episode_id, caller)

    def attach(self, episode_id: str, owner: object, caller: object) -> Episode:
        """Let ``owner`` drive ``episode_id`` of session ``caller`` (``owner`` itself, or the
        session whose token it presented): a fork nobody drives yet, or one it drives already."""
        with self._lock:
            ep = self._get(episode_id, caller)
            if ep.owner is not None and ep.owner is not owner:
                raise ConfigError(f"episode {episode_id!r} is driven by another session: fork it to branch")
            ep.owner = owner
            return ep

    def release(self, episode_id: str, owner: object) -> None:
        """Drop ``episode_id`` if ``owner`` drives it (its session reset or closed)."""
        with self._lock:
            ep = self._episodes.get(episode_id)
            if ep is not None and ep.owner is owner:
                del self._episodes[episode_id]

    def end_session(self, session: object) -> None:
        """Drop everything ``session`` drives or made: its episodes, its forks, its snapshots."""
        with self._lock:
            for eid in [e for e, ep in self._episodes.items() if session in (ep.owner, ep.creator)]:
                del self._episodes[eid]
            for sid in [s for s, (saved, _) in self._snapshots.items() if saved.creator is session]:
                del self._snapshots[sid]
            for token in [t for t, s in self._sessions.items() if s is session]:
                del self._sessions[token]

    def delete(self, episode_id: str, caller: object) -> None:
        """Free ``episode_id`` of ``caller`` now (a fork its session no longer needs)."""
        with self._lock:
            self._get(episode_id, caller)
            del self._episodes[episode_id]

    def drop(self, episode_id: str) -> None:
        with self._lock:
            self._episodes.pop(episode_id, None)

    def step(self, episode_id: str, action: str, caller: object) -> Observed:
        ep = self.get(episode_id, caller)
        with ep.lock:
            obs, reward, terminated, truncated, info = ep.env.step(action)
            ep.steps += 1
            ep.last = Observed(str(obs), float(reward), bool(terminated), bool(truncated),
                               jsonable(public_info(self.template, info)))
            ep.last_used = time.monotonic()
            return ep.last

    def fork(self, episode_id: str, caller: object) -> str:
        """A new episode, driven by nobody, in the state of ``episode_id`` of ``caller``, belonging
        to (and counting against the forks of) the session that episode belongs to; returns its id."""
        parent = self.get(episode_id, caller)
        with self._lock:  # refused before the copy, so a session at its limit costs no fork
            self._new_id(parent.creator, fork=True)
        with parent.lock:  # not under the store's lock: the parent may be in the middle of a slow step
            child = replace(parent, env=fork(parent.env), parent_id=episode_id, owner=None,
                            last_used=time.monotonic(), lock=threading.Lock())
        with self._lock:
            eid = self._new_id(parent.creator, fork=True)
            self._episodes[eid] = child
        return eid

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self, episode_id: str, caller: object) -> str:
        """Save the state of ``episode_id`` of ``caller``; returns the snapshot's id."""
        ep = self.get(episode_id, caller)
        with ep.lock:
            saved = SavedSnapshot(snapshot(ep.env), ep.last, ep.steps, ep.task_id, ep.creator)
        with self._lock:
            self._sweep()
            held = sum(s.creator is saved.creator for s, _ in self._snapshots.values())
            if held >= self.max_session_snapshots:  # checked first: a greedy session meets its own limit
                raise SessionLimitError(
                    f"this session holds {held} snapshots, its limit (--max-session-snapshots): wait for "
                    f"unused ones to expire (after {self.idle_timeout_s:g} s), or end the session to free them")
            if len(self._snapshots) >= self.max_snapshots:
                raise SessionLimitError(
                    f"the server holds {len(self._snapshots)} snapshots, its limit (--max-snapshots): "
                    f"wait for unused ones to expire (after {self.idle_timeout_s:g} s)")
            sid = secrets.token_urlsafe(18)
            self._snapshots[sid] = (saved, time.monotonic())
        return sid

    def restore(self, episode_id: str, snapshot_id: str, caller: object) -> Observed:
        """Put ``episode_id`` of ``caller`` into the state saved as ``snapshot_id``, taken from an
        episode of the same session (another session's snapshot is, to this one, a snapshot that
        does not exist)."""
        with self._lock:
            self._sweep()
            ep = self._get(episode_id, caller)
            saved, _ = self._snapshots.get(snapshot_id, (None, 0.0))
            if saved is None or saved.creator is not ep.creator:
                raise EpisodeNotFoundError(f"no snapshot {snapshot_id!r} of this session: it never existed, "
                                           f"or was unused for more than {self.idle_timeout_s:g} s")
            self._snapshots[snapshot_id] = (saved, time.monotonic())
        with ep.lock:
            restore(ep.env, saved.snap)
            ep.last, ep.steps, ep.task_id = saved.last, saved.steps, saved.task_id
            return ep.last

    def counts(self) -> tuple[int, int]:
        """(live episodes, live snapshots)."""
        with self._lock:
            self._sweep()
            return len(self._episodes), len(self._snapshots)


def _task_of(info: dict[str, Any]) -> str | None:
    task = info.get("task_id")
    return None if task is None else str(task)
