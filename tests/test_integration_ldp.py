"""treegym envs inside ldp's own tree search: aviary ``Environment`` adapter, ``fork`` as ``env_clone_fn``.

ldp's ``TreeSearchRollout`` grows the tree and calls the clone function. The agents: a scripted ldp
``Agent`` whose tool calls are the env's own actions, and ldp's own ``SimpleAgent`` through litellm,
its plain-text replies made ``step`` calls by the adapter's ``step_call`` parser: against a scripted
OpenAI-compatible server on 127.0.0.1, and against a real ``treegym serve-model`` (SmolLM2) on
127.0.0.1, which takes SimpleAgent's ``tool`` messages and null-content tool calls. Each branch is
checked against a replay of its actions on a fresh env: a step in one branch never shows in another.
"""

import asyncio
import copy
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time

import gymnasium as gym
import pytest

import treegym  # noqa: F401  (registers the ids)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # ldp imports litellm: loopback only, no price-list fetch
pytest.importorskip("ldp", reason="needs pip install 'treegym[ldp]'")
pytest.importorskip("aviary", reason="needs pip install 'treegym[ldp]'")

from aviary.core import Message, ToolCall, ToolRequestMessage, ToolResponseMessage  # noqa: E402
from ldp.agent import Agent  # noqa: E402
from ldp.alg import TreeSearchRollout  # noqa: E402

from treegym.integrations.aviary import ENDED, TreegymEnvironment, fork  # noqa: E402

HOUSEHOLD_MOVES = ("go to fridge 1", "go to countertop 1", "look")


class CyclingAgent(Agent[dict]):
    """A scripted ldp agent: each call takes the next of ``moves``, in turn, through the ``step`` tool,
    so that siblings (asked from the same state) take different actions."""

    def __init__(self, moves: tuple[str, ...]) -> None:
        self.moves = itertools.cycle(moves)

    async def init_state(self, tools) -> dict:
        assert [t.info.name for t in tools] == ["step"]
        return {"turns": 0}

    async def get_asv(self, agent_state: dict, obs: list[Message]):
        action = ToolRequestMessage(tool_calls=[ToolCall.from_name("step", action=next(self.moves))])
        return await Agent.wrap_action(action), {"turns": agent_state["turns"] + 1}, 0.0


def replay(env_id: str, actions: list[str], seed=None, options=None, **kwargs) -> list[tuple[str, float]]:
    """The (observation, reward) of each action on a fresh gymnasium env."""
    env = gym.make(env_id, **kwargs)
    env.reset(seed=seed, options=options)
    return [env.step(a)[:2] for a in actions]


def branches(tree) -> list[list]:
    return [trajectory.steps for trajectory in tree.get_trajectories()]


def test_ldps_tree_search_over_treegym_forks_grows_true_branches() -> None:
    env = TreegymEnvironment.from_id("ProbeKeys-v0", seed=0, horizon=3, choices=2)
    search = TreeSearchRollout(CyclingAgent(("A", "B")), branching_factor=2, env_clone_fn=fork)
    tree = asyncio.run(search.sample_tree(env, max_depth=3))

    paths = branches(tree)
    assert len(paths) == 8  # 2 x 2 x 2: every node expanded, every leaf at the end of the episode
    seen = set()
    for steps in paths:
        actions = [s.action.value.tool_calls[0].function.arguments["action"] for s in steps]
        seen.add(tuple(actions))
        expected = replay("ProbeKeys-v0", actions, seed=0, horizon=3, choices=2)
        assert [(s.next_observation[0].content, s.reward) for s in steps] == expected
        assert steps[-1].done and not any(s.done for s in steps[:-1])
    assert len(seen) == 8  # all eight key sequences, each scored on its own
    # Only the branch that says every key earns the full return.
    returns = {tuple(s.action.value.tool_calls[0].function.arguments["action"] for s in steps): sum(s.reward for s in steps)
               for steps in paths}
    keys = tuple(env.state.env.unwrapped.fixed_keys)
    assert returns[keys] == 1.0 and all(r < 1.0 for k, r in returns.items() if k != keys)


def test_household_branches_in_ldps_tree_never_see_each_others_steps() -> None:
    task = gym.make("TextHousehold-v0").unwrapped.task_ids()[0]
    env = TreegymEnvironment.from_id("TextHousehold-v0", task_id=task)
    search = TreeSearchRollout(CyclingAgent(HOUSEHOLD_MOVES), branching_factor=3, env_clone_fn=fork)
    tree = asyncio.run(search.sample_tree(env, max_depth=2))

    paths = branches(tree)
    assert len(paths) == 9
    for steps in paths:
        actions = [s.action.value.tool_calls[0].function.arguments["action"] for s in steps]
        want = replay("TextHousehold-v0", actions, options={"task_id": task})
        assert [(s.next_observation[0].content, s.reward) for s in steps] == want
    # The root was reset once and never stepped: the tree's steps all ran on forks.
    assert env.state.turns == 0


def test_a_fork_is_independent_and_equals_a_deepcopy() -> None:
    env = TreegymEnvironment.from_id("TextHousehold-v0", task_id=gym.make("TextHousehold-v0").unwrapped.task_ids()[0])

    async def play():
        await env.reset()
        call = lambda a: ToolRequestMessage(tool_calls=[ToolCall.from_name("step", action=a)])  # noqa: E731
        await env.step(call("go to fridge 1"))
        branch, deep = fork(env), copy.deepcopy(env)
        assert branch.tools[0] is env.tools[0]  # tools are shared, episodes are not
        mine = await branch.step(call("open fridge 1"))
        theirs = await env.step(call("look"))
        same = await deep.step(call("look"))
        return mine, theirs, same, branch

    mine, theirs, same, branch = asyncio.run(play())
    assert isinstance(mine[0][0], ToolResponseMessage) and mine[0][0].content != theirs[0][0].content
    assert same[0][0].content == theirs[0][0].content
    assert branch.state.turns == env.state.turns == 2


def test_steps_after_the_end_return_a_note_and_text_without_a_tool_call_is_refused() -> None:
    env = TreegymEnvironment.from_id("ProbeKeys-v0", seed=0, horizon=1, choices=2)

    async def play():
        await env.reset()
        plain = await env.step(Message(role="assistant", content="A"))
        request = ToolRequestMessage(tool_calls=[ToolCall.from_name("step", action="A"),
                                                 ToolCall.from_name("step", action="A")])
        return plain, await env.step(request)

    plain, (msgs, reward, done, truncated) = asyncio.run(play())
    assert "No tool calls" in plain[0][0].content and plain[1:] == (0.0, False, False)
    assert done and not truncated and msgs[1].content == ENDED and env.state.turns == 1
    assert asyncio.run(env.get_id()) == "ProbeKeys-v0:0"


def test_ldps_simple_agent_over_a_loopback_model_drives_the_tree_through_step_call() -> None:
    from ldp.agent import SimpleAgent
    from lmi.config import LLMConfig, ModelSpec
    from openai_stub import ScriptedModel

    from treegym.integrations.aviary import step_call

    class Alternating(ScriptedModel):
        """Answers "A" the first time it sees a conversation and "B" the second, so that siblings
        differ however the search interleaves its requests (the server answers them on threads)."""

        def __init__(self) -> None:
            super().__init__([])
            self.seen: dict[str, int] = {}
            self.lock = threading.Lock()

        def reply(self, messages: list[dict]) -> str:
            key = json.dumps(messages, sort_keys=True)
            with self.lock:
                count = self.seen[key] = self.seen.get(key, 0) + 1
            return "AB"[(count - 1) % 2]

    model = Alternating()
    try:
        spec = ModelSpec(name="openai/stub", api_base=model.url, api_key="loopback", max_retries=0)
        agent = SimpleAgent(llm_config=LLMConfig(models=[spec], tool_parser=step_call))
        env = TreegymEnvironment.from_id("ProbeKeys-v0", seed=0, horizon=2, choices=2)
        search = TreeSearchRollout(agent, branching_factor=2, env_clone_fn=fork, catch_agent_failures=False)
        tree = asyncio.run(search.sample_tree(env, max_depth=2))
    finally:
        model.stop()
    paths = branches(tree)
    assert len(paths) == 4 and len(model.requests) == 6  # 2 + 4 model calls, one per node
    for steps in paths:
        actions = [s.action.value.tool_calls[0].function.arguments["action"] for s in steps]
        assert [(s.next_observation[0].content, s.reward) for s in steps] == replay(
            "ProbeKeys-v0", actions, seed=0, horizon=2, choices=2)
    assert {tuple(s.action.value.tool_calls[0].function.arguments["action"] for s in steps) for steps in paths} == {
        ("A", "A"), ("A", "B"), ("B", "A"), ("B", "B")}


@pytest.fixture(scope="module")
def serve_model():
    """``treegym serve-model`` with SmolLM2 on CPU, in its own process, on a free port of 127.0.0.1;
    yields its base URL (…/v1), read from the line it prints once it listens."""
    cmd = [sys.executable, "-m", "treegym.cli", "serve-model", "--host", "127.0.0.1", "--port", "0", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()  # drains the pipe throughout
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            found = [m for line in list(lines) if (m := re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line))]
            if found:
                yield found[0].group(1)
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"serve-model did not start: {''.join(lines)[-2000:]}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_ldps_simple_agent_grows_true_branches_through_treegym_serve_model(serve_model) -> None:
    from ldp.agent import SimpleAgent
    from lmi.config import LLMConfig, ModelSpec

    from treegym.integrations.aviary import step_call

    # Sampled replies: siblings may differ or not; the checks below hold either way.
    spec = ModelSpec(name="openai/smollm2", api_base=serve_model, api_key="loopback", max_retries=0, timeout=120,
                     extra_params={"max_tokens": 6, "temperature": 1.0})
    agent = SimpleAgent(llm_config=LLMConfig(models=[spec], tool_parser=step_call))
    env = TreegymEnvironment.from_id("ProbeKeys-v0", seed=0, horizon=2, choices=2)
    search = TreeSearchRollout(agent, branching_factor=2, env_clone_fn=fork, catch_agent_failures=False)
    tree = asyncio.run(search.sample_tree(env, max_depth=2))

    paths = branches(tree)
    # Two turns on every branch: each second turn sent the first's observation back as a `tool`
    # message (and the first reply as an assistant tool call), which serve-model took.
    assert len(paths) == 4 and all(len(steps) == 2 for steps in paths)
    for steps in paths:
        actions = [s.action.value.tool_calls[0].function.arguments["action"] for s in steps]
        assert [(s.next_observation[0].content, s.reward) for s in steps] == replay(
            "ProbeKeys-v0", actions, seed=0, horizon=2, choices=2)
        assert steps[-1].done
    assert env.state.turns == 0  # the root was reset and never stepped: every step ran on a fork
