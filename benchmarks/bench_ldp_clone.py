"""ldp's clone function, timed: treegym's ``fork`` against ``copy.deepcopy``, side by side.

ldp's ``TreeSearchRollout`` calls ``env_clone_fn(env)`` once per child of every node; its own
tests pass ``copy.deepcopy``. Over the aviary adapter (``treegym.integrations.aviary``) this
times, per env, one clone of an episode a few turns in:

- ``fork``: the adapter's ``fork`` (``treegym.envs.fork`` of the episode; tools shared);
- ``deepcopy``: ``copy.deepcopy`` of the aviary env. It reaches the treegym env's own
  ``__deepcopy__`` (which forks), so this is the price of deep-copying the wrapper around it;
- ``deepcopy, no hook``: ``copy.deepcopy`` of the same objects with the env's ``__deepcopy__``
  bypassed: what deepcopy costs an env that cannot fork (its index and world templates copied).

and then a whole ``TreeSearchRollout.sample_tree`` (scripted agent, TextHousehold-v0) with each
clone function. Prints medians in microseconds (clones) and milliseconds (trees). Example:

    python benchmarks/bench_ldp_clone.py --repeats 200
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import treegym  # noqa: F401  (registers the envs)
from treegym.envs import make
from treegym.integrations.aviary import TreegymEnvironment, fork

try:
    from aviary.core import ToolCall, ToolRequestMessage
    from ldp.agent import Agent
    from ldp.alg import TreeSearchRollout
except ImportError:
    raise SystemExit("needs pip install 'treegym[ldp]'") from None

ENVS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    # env id -> (kwargs, the turns played before cloning)
    "ProbeKeys-v0": ({"horizon": 8}, ("A", "B", "A")),
    "TextHousehold-v0": ({}, ("look", "go to fridge 1", "open fridge 1", "go to countertop 1", "inventory")),
    "TreeSearchQA-v0": ({"index": "bm25"}, ("<search>capital of France</search>",)),
}


def no_hook_deepcopy(env: TreegymEnvironment) -> TreegymEnvironment:
    """``copy.deepcopy`` with the treegym env's ``__deepcopy__`` bypassed: Python's default
    deep copy of its attributes, as for any env that does not fork."""
    inner = env.state.env
    memo: dict[int, Any] = {}
    plain = object.__new__(type(inner))
    memo[id(inner)] = plain
    plain.__dict__ = copy.deepcopy(inner.__dict__, memo)
    return copy.deepcopy(env, memo)


CLONES: dict[str, Callable[[TreegymEnvironment], TreegymEnvironment]] = {
    "fork": fork, "deepcopy": copy.deepcopy, "deepcopy, no hook": no_hook_deepcopy}


def median_us(fn: Callable[[], object], repeats: int) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)


def episode(env_id: str) -> TreegymEnvironment:
    kwargs, turns = ENVS[env_id]
    env = TreegymEnvironment(make(env_id, **kwargs).unwrapped, seed=0)
    asyncio.run(env.reset())
    call = lambda a: ToolRequestMessage(tool_calls=[ToolCall.from_name("step", action=a)])  # noqa: E731
    for turn in turns:
        asyncio.run(env.step(call(turn)))
    return env


class CyclingAgent(Agent[int]):
    """Each call takes the next household command, so that siblings differ."""

    def __init__(self) -> None:
        self.moves = itertools.cycle(("look", "go to fridge 1", "go to countertop 1", "inventory"))

    async def init_state(self, tools: Any) -> int:
        return 0

    async def get_asv(self, agent_state: int, obs: Any) -> Any:
        action = ToolRequestMessage(tool_calls=[ToolCall.from_name("step", action=next(self.moves))])
        return await Agent.wrap_action(action), agent_state + 1, 0.0


def tree_ms(clone: Callable, branching: int, depth: int, repeats: int) -> tuple[float, int]:
    times, clones = [], 0
    for i in range(repeats + 1):  # the first tree warms up ldp and the env; it is not timed
        env = TreegymEnvironment(make("TextHousehold-v0").unwrapped, seed=0)
        search = TreeSearchRollout(CyclingAgent(), branching_factor=branching, env_clone_fn=clone)
        t0 = time.perf_counter()
        tree = asyncio.run(search.sample_tree(env, max_depth=depth))
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
        clones = len(tree.tree.nodes) - 1
    return statistics.median(times), clones


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="timed clones per env and method (default 200)")
    parser.add_argument("--no-hook-repeats", type=int, default=5, help="timed no-hook deep copies (slow on QA)")
    parser.add_argument("--branching", type=int, default=3, help="tree: children per node (default 3)")
    parser.add_argument("--depth", type=int, default=4, help="tree: depth (default 4)")
    parser.add_argument("--tree-repeats", type=int, default=3, help="timed trees per clone function (default 3)")
    args = parser.parse_args()

    print(f"{'env':<18}" + "".join(f"{name:>22}" for name in CLONES) + "   (median µs per clone)")
    for env_id in ENVS:
        env = episode(env_id)
        cells = []
        for name, clone in CLONES.items():
            n = args.no_hook_repeats if name == "deepcopy, no hook" else args.repeats
            cells.append(median_us(lambda clone=clone, env=env: clone(env), n))
        print(f"{env_id:<18}" + "".join(f"{c:>22,.1f}" for c in cells))

    print(f"\nTreeSearchRollout.sample_tree, TextHousehold-v0, branching {args.branching}, depth {args.depth}:")
    for name, clone in CLONES.items():
        ms, clones = tree_ms(clone, args.branching, args.depth, args.tree_repeats)
        print(f"  {name:<20} median {ms:9.1f} ms  ({clones} clones)")


if __name__ == "__main__":
    main()
