"""Evaluating an agent on an env: EM, F1 and success with 95% intervals, plus JSONL traces
(written by ``write_traces``, read back by ``read_traces``, e.g. for ``treegym sft --traces``).

``evaluate(agent, env_id, n)`` runs ``n`` tasks and returns an ``EvalReport``. ``agent`` is a
spec string (see ``treegym.agents.resolve``) or an object: a text agent (``act(messages)``
or a callable) runs one episode at a time through ``run_episode``; a token-level ``Policy``
runs every task as a batched chain (one ``generate`` per turn for all tasks), and can also
sample Tree-GRPO trees for an HTML view.

The tasks are the held-out set every command shares (``treegym.agents.rollout.scoring``), and
each episode is scored as everywhere else (``EpisodeScore``). Intervals (95%, ``treegym.stats``):
Wilson for the 0/1 rates (EM, success), a seeded percentile bootstrap for the means of F1, the
well-formed share, turns and tool calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

import treegym.envs as envs
from treegym.agents.base import Message
from treegym.agents.policy import Policy, SamplingParams
from treegym.agents.protocol import Protocol, play_protocol, read_protocol
from treegym.agents.resolve import ResolvedAgent, resolve_agent
from treegym.agents.rollout.episode import Episode, run_episode
from treegym.agents.rollout.samplers import sample_chains, sample_trees
from treegym.agents.rollout.scoring import EpisodeScore, HeldOut, episode_score, heldout_prompts
from treegym.agents.rollout.types import Prompt, Tree, reset_args
from treegym.envs.core import failed_to_run
from treegym.errors import ConfigError, TreegymError
from treegym.stats import Interval, bootstrap_interval, wilson_interval


class TraceFormatError(TreegymError):
    """A trace file is missing, empty, or has a line that is not an episode."""


@dataclass(frozen=True)
class Transcript:
    """An episode as chat messages (the env's prompt, then assistant/user turns) and its success:
    what a trace line gives back (``read_traces``), and what SFT imitates."""

    episode_id: str
    messages: tuple[Message, ...]
    success: float  # the env's terminal ``success`` (EM on QA)


@dataclass(frozen=True)
class EpisodeResult:
    """One evaluated episode: its ``EpisodeScore`` and what only eval reports (EM, F1, reward, error)."""

    episode_id: str
    score: EpisodeScore
    em: float
    f1: float
    reward: float
    error: str | None
    answered_task: bool = True  # the env has answer strings (EM/F1 mean something)


@dataclass(frozen=True)
class EvalReport:
    """An evaluation's result: aggregate figures, per-episode scores, errors, output files."""

    agent: str
    env_id: str
    n: int
    em: Interval
    f1: Interval
    success: Interval
    well_formed: Interval
    turns: Interval
    tool_calls: Interval
    reward: Interval
    scores: tuple[EpisodeResult, ...]
    errors: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)

    def table(self) -> str:
        """The human-readable table ``treegym eval`` prints."""
        rows = [("EM", self.em), ("F1", self.f1), ("success", self.success), ("well-formed", self.well_formed),
                ("reward", self.reward), ("turns", self.turns), ("tool calls", self.tool_calls)]
        if self.scores and not any(sc.answered_task for sc in self.scores):
            rows = rows[2:]  # e.g. household tasks: no answer string, so EM/F1 would read as a misleading 0
        head = f"{self.agent} on {self.env_id}: {self.n} episodes, {len(self.errors)} failed"
        lines = [head, f"{'metric':<12}{'mean':>8}   95% interval", "-" * 36]
        lines += [f"{name:<12}{iv.mean:>8.3f}   [{iv.low:.3f}, {iv.high:.3f}]" for name, iv in rows]
        lines.append("(Wilson intervals for EM and success; percentile bootstrap for the means)")
        return "\n".join(lines)


# ---- scores ------------------------------------------------------------------------------


def score_episode(ep: Episode) -> EpisodeResult:
    """The contract's terminal keys: ``success`` for every env, ``em`` / ``f1`` for QA envs (0
    when the episode ended without them, e.g. cut by the turn cap)."""
    info = ep.info
    em = float(info.get("em", 0.0))
    return EpisodeResult(ep.episode_id, episode_score(info, ep.invalid, ep.tool_calls), em,
                         float(info.get("f1", em)), ep.reward, ep.error, "answers" in info)


def summarise(agent: str, env_id: str, episodes: Sequence[Episode], files: dict[str, str] | None = None) -> EvalReport:
    scores = [score_episode(ep) for ep in episodes]
    held = HeldOut(tuple(s.score for s in scores)).intervals()
    return EvalReport(
        agent=agent,
        env_id=env_id,
        n=len(scores),
        em=wilson_interval([s.em for s in scores]),
        f1=bootstrap_interval([s.f1 for s in scores]),
        success=held["success"],
        well_formed=held["well_formed"],
        turns=held["turns"],
        tool_calls=held["tool_calls"],
        reward=bootstrap_interval([s.reward for s in scores]),
        scores=tuple(scores),
        errors=tuple(s.error for s in scores if s.error),
        files=dict(files or {}),
    )


# ---- tasks ---------------------------------------------------------------------------------


def chosen_prompts(env: gym.Env, n: int) -> list[Prompt]:
    """The ``n`` tasks an evaluation on ``env`` plays: the held-out set every command shares."""
    return heldout_prompts(envs.registry.task_ids(env), n)


def _episode_id(i: int, prompt: Prompt) -> str:
    if isinstance(prompt, dict) and "task_id" in prompt:
        return f"{i}:{prompt['task_id']}"
    return f"{i}:seed={prompt}"


# ---- running -------------------------------------------------------------------------------


def evaluate(
    agent: str | Any,
    env_id: str,
    n: int,
    split: str | None = "auto",
    seed: int = 0,
    out: str | Path | None = None,
    trees: bool = False,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    params: SamplingParams | None = None,
    mode: str = "chat",
    batch_size: int = 16,
    tree_prompts: int = 4,
    progress: bool = True,
    model: str | None = None,
) -> EvalReport:
    """Run ``agent`` on ``n`` tasks of ``env_id`` and summarise.

    The tasks are the held-out set (``chosen_prompts``): the split's first ``n``, the same ones
    a train run with ``run.eval_n=n`` evaluates on. A training run's model (``RUN/final``) replays
    its run's protocol instead (``RUN/protocol.json``: the training variant, split, n, turns,
    tokens, context format and temperature), so its figure is the run's "after RL" one; the
    other sampling arguments are then not used.

    Args:
        agent: a spec (``heuristic``, ``oracle``, ``smollm2``, a model folder,
            ``openai:URL[#model]``, ``module:callable``) or an agent / Policy object.
        split: the task split (``auto``, the default: the env's held-out split, e.g. dev for QA
            and seen for household; ``None`` keeps the env's own default).
        out: a folder for ``traces.jsonl``, ``report.json`` and (``trees``) ``trees.html``.
        trees: also sample Tree-GRPO trees (m=2, n=2, l=1, k=3) on the first ``tree_prompts``
            tasks and write their HTML view (policy agents only).
        params: sampling of policy agents (default: greedy, 128 new tokens).
        mode: context format of policy agents, ``chat`` or ``raw``.
        seed: the tree search's seed (``trees``).
        model: the model an ``openai:URL`` agent asks for (``URL#model`` wins); default: the
            server's only model.
    """
    if n < 1:
        raise ConfigError(f"n must be at least 1, got {n}")
    if max_turns is not None and max_turns < 1:
        raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"--out {out} is a file; pass a folder (it gets traces.jsonl and report.json)")
    # The agent first: a bad spec should fail before an index is built.
    params = params or SamplingParams(temperature=0.0, max_new_tokens=128)
    resolved = (resolve_agent(agent, env_id, params=params, model=model) if isinstance(agent, str)
                else ResolvedAgent(str(type(agent).__name__), agent))
    if trees and not resolved.is_policy:
        raise ConfigError("--trees needs a policy agent (smollm2, a model folder, or a Policy object)")
    protocol = run_protocol_of(agent, env_id) if resolved.is_policy else None
    env = protocol.make_env() if protocol is not None else envs.make(env_id, split, **(env_kwargs or {}))
    prompts = protocol.prompts(env) if protocol is not None else chosen_prompts(env, n)
    out_dir = Path(out) if out is not None else None
    files: dict[str, str] = {}
    with progress_bar(len(prompts), f"eval {resolved.name}", progress) as bar:
        if protocol is not None:
            episodes = _replay(resolved.obj, env, prompts, protocol, bar)
        elif resolved.is_policy:
            episodes = _run_policy(resolved.obj, env, prompts, params, max_turns, mode, batch_size, bar)
        else:
            episodes = play_episodes(env, resolved.obj, prompts, max_turns, bar)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        files["traces"] = str(write_traces(out_dir / "traces.jsonl", episodes))
    if trees:
        sampled = sample_trees(resolved.obj, env, prompts[:tree_prompts], m=2, n=2, l=1, k=3,
                               params=replace_temperature(params), max_turns=max_turns, mode=mode, seed=seed)
        if out_dir is not None:
            from treegym.agents.tree_html import write_tree_html

            files["trees"] = str(write_tree_html(out_dir / "trees.html", sampled.trees, resolved.obj.tokenizer,
                                                 title=f"{resolved.name} on {env_id}"))
    if out_dir is not None:
        files["report"] = str(out_dir / "report.json")
    report = summarise(resolved.name, env_id, episodes, files)
    if out_dir is not None:
        Path(files["report"]).write_text(json.dumps(report_dict(report), indent=2), encoding="utf-8")
    return report


def play_episodes(env: gym.Env, agent: Any, prompts: Sequence[Prompt], max_turns: int | None = None,
                  bar: Any = None) -> list[Episode]:
    """A text agent's episodes on ``prompts``, one after the other (``bar`` counts them)."""
    episodes: list[Episode] = []
    for i, prompt in enumerate(prompts):
        seed, options = reset_args(prompt)
        episodes.append(run_episode(env, agent, seed=seed, options=options, max_turns=max_turns,
                                    episode_id=_episode_id(i, prompt)))
        stop_if_failed_to_run(episodes[-1:])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(failed=sum(e.error is not None for e in episodes))
    return episodes


class ToolUnreachableError(TreegymError):
    """An episode could not run: a tool it needs (a retrieval server, a search backend) was unreachable."""


def stop_if_failed_to_run(episodes: Sequence[Episode]) -> None:
    """Stop the evaluation at an episode that could not run: scored, it would be a wrong answer
    that no agent gave, and the figure would measure the tool, not the agent."""
    for ep in episodes:
        why = failed_to_run(ep.info)
        if why:
            raise ToolUnreachableError(f"eval stopped: episode {ep.episode_id} could not run, so no figure is "
                                       f"reported ({' '.join(why.split())[:300]})")


def replace_temperature(params: SamplingParams) -> SamplingParams:
    """Trees need diversity: greedy decoding would grow identical branches, so T >= 1."""
    from dataclasses import replace

    return params if params.temperature > 0 else replace(params, temperature=1.0)


def _run_policy(policy: Policy, env: gym.Env, prompts: list[Prompt], params: SamplingParams,
                max_turns: int | None, mode: str, batch_size: int, bar: Any) -> list[Episode]:
    """Every task as a chain; all tasks of a chunk generate together, turn by turn."""
    episodes: list[Episode] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        batch = sample_chains(policy, env, chunk, group_size=1, params=params, max_turns=max_turns, mode=mode)  # type: ignore[arg-type]
        for tree in batch.trees:
            i = start + tree.prompt_index
            episodes.append(_episode_of_tree(tree, _episode_id(i, prompts[i])))
        stop_if_failed_to_run(episodes[start:])
        if bar is not None:
            bar.update(len(chunk))
    return episodes


def run_protocol_of(agent: Any, env_id: str) -> Protocol | None:
    """The held-out protocol of the training run whose model ``agent`` names (``RUN/final`` finds
    ``RUN/protocol.json``), when it is one and ``env_id`` is that run's env family; else None."""
    if not isinstance(agent, str) or not Path(agent).expanduser().is_dir():
        return None
    protocol = read_protocol(Path(agent).expanduser())
    if protocol is None:
        return None
    registry = envs.registry
    if registry.base_id(protocol.variant) != registry.base_id(env_id):
        raise ConfigError(f"{agent} was trained and scored on {protocol.variant}; evaluate it with --env "
                          f"{registry.base_id(protocol.variant)} (its run's protocol) or copy the model elsewhere")
    return protocol


def _replay(policy: Policy, env: gym.Env, prompts: list[Prompt], protocol: Protocol, bar: Any) -> list[Episode]:
    """A run's held-out phase again: ``protocol``'s chains, in one batch, as training scored them."""
    batch = play_protocol(policy, env, prompts, protocol)
    if bar is not None:
        bar.update(len(prompts))
    trees = sorted(batch.trees, key=lambda t: t.prompt_index)
    return [_episode_of_tree(t, _episode_id(t.prompt_index, prompts[t.prompt_index])) for t in trees]


def _episode_of_tree(tree: Tree, episode_id: str) -> Episode:
    """A chain's single path, in the Episode shape of text agents (messages from the texts)."""
    leaf = tree.leaves()[0]
    path = tree.path(leaf)
    messages: list[Message] = [{"role": "user", "content": tree.prompt_text}]
    turns = [tree.nodes[nid].turn for nid in path]
    for turn in turns:
        assert turn is not None
        messages.append({"role": "assistant", "content": turn.action_text})
        if turn.obs_text:
            messages.append({"role": "user", "content": turn.obs_text})
    last = turns[-1]
    assert last is not None
    return Episode(episode_id, messages, float(tree.nodes[leaf].reward or 0.0), len(path),
                   sum(t.tool_calls for t in turns if t is not None), dict(last.info), None, last.terminated,
                   last.truncated, invalid=tuple(t.invalid for t in turns if t is not None))


def write_traces(path: Path, episodes: Sequence[Episode]) -> Path:
    """One JSON line per episode: id, scores, messages, final info, error."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for ep in episodes:
            s = score_episode(ep)
            record = {"episode_id": s.episode_id, "em": s.em, "f1": s.f1, **asdict(s.score), "reward": s.reward,
                      "error": s.error, "answered_task": s.answered_task, "messages": ep.messages, "terminated": ep.terminated,
                      "truncated": ep.truncated, "info": _jsonable(ep.info)}
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_traces(path: str | Path) -> list[Transcript]:
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
    episodes: list[Transcript] = []
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
        # ``success`` is every env's score; traces older than it name only QA's ``em``.
        won = record["success"] if "success" in record else record.get("em", 0.0)
        episodes.append(Transcript(str(record.get("episode_id", number)), messages, float(won or 0.0)))
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


def report_dict(report: EvalReport) -> dict[str, Any]:
    d = asdict(report)
    d.pop("scores")
    return d


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def progress_bar(total: int, desc: str, enabled: bool, unit: str = "ep", leave: bool = True) -> Any:
    """A tqdm bar counting episodes (or ``unit``); a silent one when progress is off."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=leave, disable=not enabled)
