"""TRL adapter: a treegym env id as a ``GRPOTrainer`` ``environment_factory``, its tasks as rows.

TRL 1.16's ``GRPOTrainer(environment_factory=...)`` calls the factory once per concurrent
rollout, calls ``reset(**row)`` on the instance with each dataset row (the returned text is
appended to the row's last user message), exposes the instance's public methods as tools the
model calls through its chat template, and scores each rollout with ``get_reward()``. This
module maps a treegym episode onto that:

- ``reset(**row)``: ``env.reset(seed=row["seed"], options={"task_id": row["task_id"]})``;
  returns the opening prompt, written for tool calls (see below).
- the tools: each env family's own actions (the tool set its record names, ``Family.tools``), typed and documented, so that the model's tool
  calls are the env's actions (TRL steps the env only on a tool call: a plain-text
  ``<answer>`` would score 0):

  - QA (TreeSearchQA-v0): ``search(query)`` and ``answer(text)`` (``QATools``);
  - web (WebSearchQA-v0): ``search(query)``, ``browse(url)`` and ``answer(text)`` (``WebTools``);
  - household (TextHousehold-v0): ``command(command)``, whose docstring lists the grammar; every
    observation ends with the admissible commands (``HouseholdTools``);
  - any other treegym env (the probes, your own): ``step(action)``, one env turn in the env's
    own protocol (``TRLEnv``).

  A tool call after the episode ended returns a note, never raises.
- ``get_reward()``: the episode's return (the sum of the env's rewards).

``grpo_kwargs(env_id, args, tokenizer)`` gives everything ``GRPOTrainer`` needs from treegym:
the factory, the task rows, and the tokenizer with a tool-calling chat template (SmolLM2's own
renders no tools, so TRL refuses it; the adapter then sets TRL's Qwen2.5 template and says
so). It also warns when ``args.max_completion_length`` is below what the env needs: TRL counts
the tool results in the completion, so at 128 a QA rollout stops after its first search.

Why this path and not ``rollout_func``: TRL's tool loop (``GRPOTrainer._tool_call_loop``)
generates with plain transformers ``generate`` unless ``use_vllm`` is set, so the
environment path runs on a CPU without vLLM. TRL then owns generation and training; treegym
owns the episode. (Forked tree rollouts are treegym's own trainers' job: TRL's GRPO samples
independent chains.)
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium as gym

from treegym.envs import base_env, family, fork, make, public_info
from treegym.envs.household.text import INSTRUCTIONS as HOUSEHOLD_INSTRUCTIONS
from treegym.errors import ConfigError, MissingPackageError

try:
    import trl  # noqa: F401  (fail here, in one line, not deep inside a trainer)
    from datasets import Dataset
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling
except ImportError:
    raise MissingPackageError("trl", "treegym's TRL adapter", "pip install 'treegym[trl]'") from None

ENDED = "The episode has ended. Reply without calling a tool."
T = TypeVar("T", bound="type[EnvTools]")
# A family's tool set, by the name its record gives (``Family.tools``); filled by ``tool_set``.
TOOL_SETS: dict[str, type[EnvTools]] = {}


def tool_set(name: str) -> Callable[[T], T]:
    """Register a tool class under ``name``, the name a family record's ``tools`` gives."""

    def register(cls: T) -> T:
        TOOL_SETS[name] = cls
        return cls

    return register


class EnvTools:
    """One treegym env as a TRL environment: ``reset(**row)`` and ``get_reward()``; a subclass
    adds the tools.

    Public methods other than ``reset`` and ``get_reward`` become tools for TRL, so a subclass
    has exactly its tools as public methods; what a reward function may read is on properties.
    ``completion_tokens`` is the ``max_completion_length`` that the env needs (tool results included).
    """

    completion_tokens = 128

    def __init__(self, env: gym.Env) -> None:
        self._env = env
        self._return = 0.0
        self._turns = 0
        self._ended = True
        self._info: dict[str, Any] = {}

    def reset(self, task_id: str | None = None, seed: int | None = None, **row: Any) -> str:
        """Start an episode on the row's task (``task_id``) or seed; return the opening prompt."""
        options = None if task_id is None else {"task_id": task_id}
        obs, info = self._env.reset(seed=None if seed is None else int(seed), options=options)
        self._return, self._turns, self._ended, self._info = 0.0, 0, False, public_info(self._env, info)
        return self._prompt(obs)

    def _prompt(self, obs: str) -> str:
        """The opening prompt for tool calls, from the env's own."""
        return obs

    def _observe(self, obs: str) -> str:
        """What a tool returns, from the env's observation."""
        return obs

    def _turn(self, action: str) -> str:
        """One env turn with ``action`` in the env's own protocol; the tool's result."""
        if self._ended:
            return ENDED
        obs, reward, terminated, truncated, info = self._env.step(action)
        self._return += float(reward)
        self._turns += 1
        self._info = public_info(self._env, info)
        self._ended = bool(terminated or truncated)
        return f"{obs}\n{ENDED}" if self._ended else self._observe(obs)

    def get_reward(self) -> float:
        """The episode's return: the sum of the env's rewards so far."""
        return self._return

    @property
    def env(self) -> gym.Env:
        """The treegym env (fork or snapshot it with ``treegym.envs``)."""
        return self._env

    @property
    def turns(self) -> int:
        """Steps taken in this episode."""
        return self._turns

    @property
    def ended(self) -> bool:
        """Whether the episode terminated or was truncated."""
        return self._ended

    @property
    def info(self) -> dict[str, Any]:
        """The last step's info (at the end: ``success``, and ``em`` for QA envs), without the
        task's labels (``treegym.envs.public_info``); the env itself (``.env``) has them."""
        return self._info


class TRLEnv(EnvTools):
    """Any treegym env through one ``step`` tool: the action is the env's own protocol."""

    def step(self, action: str) -> str:
        """Take one turn in the environment and return what it shows next.

        Args:
            action: your whole turn, written as the task's instructions ask, e.g. a search or an answer in their tags.
        """
        return self._turn(action)


QA_PROMPT = (
    "Answer the given question. Think first every time you get new information. If you lack some "
    "knowledge, call the search tool with a query: it returns the top passages between <information> "
    "and </information>. You can search as many times as you want. When you know the answer, call the "
    "answer tool with a short answer (a name, a year, a few words), without explanations. "
    "Question: {question}\n"
)

WEB_PROMPT = (
    "Answer the given question. Think first every time you get new information. If you lack some "
    "knowledge, call the search tool with a query: it returns the top results (title, URL and snippet) "
    "between <information> and </information>. To read a page, call the browse tool with its URL; a long "
    "page comes in parts, and browse with URL#page=2 (or next) gives the next part. When you know the "
    "answer, call the answer tool with a short answer, without explanations. Question: {question}\n"
)

HOUSEHOLD_PROMPT = (
    "You are in a household. Interact with it to solve the task: each turn, call the command tool with "
    "one command. Each result tells what happened, then lists the commands admissible now.\n\n"
    "Admissible commands: {admissible}.\n\n{intro}"
)


@tool_set("qa")
class QATools(EnvTools):
    """A QA env (TreeSearchQA-v0) through its two actions: ``search`` and ``answer``."""

    # The heuristic expert's episodes through these tools: median 403 tokens, longest 729 (32 tasks).
    completion_tokens = 1024
    prompt = QA_PROMPT

    def _prompt(self, obs: str) -> str:
        # The env's own prompt asks for <search> tags; this one asks for the tools, on the same question.
        return self.prompt.format(question=base_env(self._env).state.item.question)

    def search(self, query: str) -> str:
        """Search the knowledge source and return the top passages.

        Args:
            query: what to look up, e.g. a name or a few keywords.
        """
        return self._turn(f"<search>{query}</search>")

    def answer(self, text: str) -> str:
        """Give the final answer; this ends the episode.

        Args:
            text: the answer alone, as short as possible (a name, a year, a few words).
        """
        return self._turn(f"<answer>{text}</answer>")


@tool_set("web")
class WebTools(QATools):
    """The web QA env (WebSearchQA-v0) through ``search``, ``browse`` and ``answer``."""

    completion_tokens = 2048  # a search, a page part (up to 2,000 characters, ~600 tokens), the answer; not measured
    prompt = WEB_PROMPT

    def browse(self, url: str) -> str:
        """Read a web page: its text (a long page comes in parts) and its links.

        Args:
            url: a URL from the search results or a page's links; URL#page=2 (or next) for the next part.
        """
        return self._turn(f"<browse>{url}</browse>")


@tool_set("household")
class HouseholdTools(EnvTools):
    """The household env (TextHousehold-v0) through one ``command`` tool; every observation lists
    the commands admissible now (the env's ``info["admissible_commands"]``)."""

    # The heuristic expert's solved episodes through this tool: median 2,078 tokens, p90 3,917 (32 tasks).
    completion_tokens = 4096

    def _prompt(self, obs: str) -> str:
        intro = obs[len(HOUSEHOLD_INSTRUCTIONS):].lstrip() if obs.startswith(HOUSEHOLD_INSTRUCTIONS) else obs
        # The task sentence stays last, as in ALFWorld's intro.
        return HOUSEHOLD_PROMPT.format(admissible=", ".join(self._info.get("admissible_commands", ())), intro=intro)

    def _observe(self, obs: str) -> str:
        admissible = self._info.get("admissible_commands")
        return f"{obs}\n\nAdmissible commands: {', '.join(admissible)}." if admissible else obs

    def command(self, command: str) -> str:
        """Do one thing in the household and return what happens.

        Args:
            command: one command, e.g. "go to cabinet 1". The grammar: look | inventory | go to (receptacle) | open (receptacle) | close (receptacle) | take (object) from (receptacle) | move (object) to (receptacle) | examine (something) | use (object) | heat (object) with (receptacle) | clean (object) with (receptacle) | cool (object) with (receptacle) | slice (object) with (object) | help. Use the names as the observation writes them ("apple 1", "fridge 1").
        """
        return self._turn(command)


def tools_for(env_id: str) -> type[EnvTools]:
    """The tool class ``env_id``'s family record names (``Family.tools``: ``qa`` -> ``QATools``,
    ``web`` -> ``WebTools``, ``household`` -> ``HouseholdTools``); ``TRLEnv`` for a family that names none."""
    name = family(env_id).tools
    if name is None:
        return TRLEnv
    if name not in TOOL_SETS:
        raise ConfigError(f"env {env_id!r} asks for the tool set {name!r}; the TRL adapter has: {', '.join(TOOL_SETS)}")
    return TOOL_SETS[name]


def environment_factory(env_id: str, split: str | None = None, *, tools: type[EnvTools] | None = None,
                        **env_kwargs: Any) -> Callable[[], EnvTools]:
    """A ``GRPOTrainer(environment_factory=...)`` for ``env_id``: each call returns an instance of
    ``tools`` (default: the env family's, ``tools_for``; ``TRLEnv`` for the one ``step`` tool).

    The env is made once (``treegym.envs.make(env_id, split, **env_kwargs)``); every instance
    is a fork of it, so all of them share its backends (index, HTTP cache, world templates).
    """
    template = make(env_id, split, **env_kwargs)
    base_env(template)  # a NotForkableError here, not at the first rollout, for an env treegym cannot fork
    cls = tools or tools_for(env_id)
    return lambda: cls(fork(template))


def tool_calling_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer``, with TRL's Qwen2.5 chat template (ChatML with tool calls, which TRL parses)
    when its own template cannot render a tool-calling conversation; says so on stderr."""
    if not supports_tool_calling(tokenizer):
        tokenizer.chat_template = qwen2_5_chat_template
        print("treegym: the tokenizer's chat template renders no tool calls, which GRPOTrainer needs; using "
              "TRL's Qwen2.5 template (trl.chat_template_utils.qwen2_5_chat_template)", file=sys.stderr, flush=True)
    return tokenizer


def check_completion_length(args: Any, tools: type[EnvTools]) -> None:
    """Warn when ``args.max_completion_length`` (which counts tool results too) is below what an
    episode of the env needs (``tools.completion_tokens``): rollouts would stop mid-episode at 0 reward."""
    have = getattr(args, "max_completion_length", None)
    if have is not None and have < tools.completion_tokens:
        warnings.warn(
            f"max_completion_length={have} is below the {tools.completion_tokens} tokens an episode through "
            f"{tools.__name__} needs (the tool results count): rollouts will stop before the episode ends and "
            f"score 0; set GRPOConfig(max_completion_length={tools.completion_tokens}) or more",
            UserWarning, stacklevel=2)


def grpo_kwargs(env_id: str, args: Any, tokenizer: Any, *, split: str | None = None, n: int | None = None,
                tools: type[EnvTools] | None = None, **env_kwargs: Any) -> dict[str, Any]:
    """What ``GRPOTrainer(model=..., args=args, **grpo_kwargs(...))`` needs from treegym: the
    ``environment_factory``, the ``train_dataset`` (``task_dataset``, the first ``n`` tasks) and the
    ``processing_class`` (``tool_calling_tokenizer``); warns on a short ``max_completion_length``."""
    factory = environment_factory(env_id, split, tools=tools, **env_kwargs)
    check_completion_length(args, type(factory()))
    return {"environment_factory": factory, "train_dataset": task_dataset(env_id, split, n=n, **env_kwargs),
            "processing_class": tool_calling_tokenizer(tokenizer)}


def task_dataset(env_id: str, split: str | None = None, *, n: int | None = None, first_seed: int = 0,
                 **env_kwargs: Any) -> Dataset:
    """The env's tasks as ``GRPOTrainer`` rows, for ``environment_factory(env_id, **env_kwargs)``.

    Each row has a ``prompt`` (an empty user message, which ``reset`` fills) and either a
    ``task_id`` (one row per task of ``env.unwrapped.task_ids()``, the first ``n`` if given)
    or, when the env draws its tasks from the seed, a ``seed`` (``n`` rows, seeds from
    ``first_seed``). ``split`` and ``env_kwargs`` are ``environment_factory``'s.
    """
    if n is not None and n < 1:
        raise ConfigError(f"task_dataset: n must be at least 1, got {n}")
    env = make(env_id, split, **env_kwargs)
    ids = base_env(env).task_ids()
    env.close()
    prompt = [{"role": "user", "content": ""}]
    if ids is not None:
        ids = list(ids)[:n]
        return Dataset.from_dict({"prompt": [prompt] * len(ids), "task_id": ids})
    if n is None:
        raise ConfigError(f"{env_id} draws its tasks from the seed: pass n, the number of rows (seeds) to make")
    seeds = list(range(first_seed, first_seed + n))
    return Dataset.from_dict({"prompt": [prompt] * n, "seed": seeds})


__all__ = ["ENDED", "EnvTools", "HouseholdTools", "QATools", "TRLEnv", "WebTools", "check_completion_length",
           "environment_factory", "grpo_kwargs", "task_dataset", "tool_calling_tokenizer", "tool_set", "tools_for"]
