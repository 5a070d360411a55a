"""A snapshot that crossed a wire or a file is checked before it is used: every field of its
state tampered, one at a time, is either refused by ``restore()`` with a ``SnapshotError``, or
is a state the env can step on, with nothing raised out of ``step()`` but the env's own
``TreegymError`` for an ended episode."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import gymnasium as gym
import pytest

import treegym  # noqa: F401  (registers the ids)
from treegym.envs import Snapshot, restore, snapshot
from treegym.errors import SnapshotError, TreegymError

# What a hostile file puts in a field: wrong types, wrong sizes, out-of-range numbers.
BAD_VALUES: tuple[Any, ...] = (None, "x", "", -1, 10**9, 1.5, float("nan"), True, (), ("x",), (10**9,),
                               frozenset({-5}), frozenset({"x"}), {"a": 1}, [1])
ENVS = {
    "ProbeKeys-v0": ({}, ("A", "B", "C")),
    "ProbeLookup-v0": ({}, ("?", "A", "B")),
    "TreeSearchQA-v0": ({"index": "bm25"}, ("<think>x</think><search>paris</search>", "<answer>x</answer>")),
    "WebSearchQA-v0": ({}, ("<think>x</think><search>paris</search>", "<answer>x</answer>")),
    "TextHousehold-v0": ({}, ("look", "inventory", "go to countertop 1", "open drawer 1", "take apple 1")),
}


def _tampered(state: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every copy of ``state`` with one field (at any depth of its dataclasses) set to a bad value."""
    out = []
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        for bad in BAD_VALUES:
            if bad is value or (type(bad) is type(value) and bad == value):
                continue
            out.append((f"{prefix}{f.name}={bad!r}", dataclasses.replace(state, **{f.name: bad})))
        if dataclasses.is_dataclass(value):
            out += [(path, dataclasses.replace(state, **{f.name: inner}))
                    for path, inner in _tampered(value, f"{prefix}{f.name}.")]
    return out


@pytest.mark.parametrize("env_id", list(ENVS))
def test_a_tampered_snapshot_is_refused_or_steps_without_a_raw_exception(env_id):
    kwargs, actions = ENVS[env_id]
    env = gym.make(env_id, **kwargs)
    env.reset(seed=0)
    env.step(actions[0])
    good = snapshot(env)
    raw, refused, cases = [], 0, _tampered(good.state)
    for path, state in cases:
        snap = pickle.loads(pickle.dumps(Snapshot(good.env_class, state, good.wrappers)))  # it crossed a file
        try:
            restore(env, snap)
        except SnapshotError as exc:
            assert "snapshot" in str(exc) and "\n" not in str(exc)
            refused += 1
            restore(env, good)  # the refusal left the env usable
            env.step(actions[-1])
            restore(env, good)
            continue
        for action in actions:
            try:
                env.step(action)
            except TreegymError:  # the one way every env refuses a step after its end
                break
            except Exception as exc:  # noqa: BLE001  (what the test counts)
                raw.append(f"{path}: {type(exc).__name__}: {exc}"[:200])
                break
        restore(env, good)
    assert not raw, f"{len(raw)} of {len(cases)} tampered snapshots raised out of step(): {raw[:5]}"
    assert refused > 0


@pytest.mark.parametrize("env_id", ["ProbeKeys-v0", "TextHousehold-v0"])
def test_tampered_wrapper_state_is_refused(env_id):
    env = gym.make(env_id, max_episode_steps=10)  # a TimeLimit, whose step count the snapshot carries
    env.reset(seed=0)
    good = snapshot(env)
    (name, attrs), *rest = good.wrappers
    assert name == "TimeLimit" and "_elapsed_steps" in dict(attrs)
    for bad in ((("_elapsed_steps", "x"),), (("env", None),), (("_elapsed_steps",),), "junk"):
        with pytest.raises(SnapshotError, match="snapshot refused: its state of wrapper TimeLimit"):
            restore(env, Snapshot(good.env_class, good.state, ((name, bad), *rest)))
    env.step(ENVS[env_id][1][0])  # the env is as it was
