"""treegym envs under TRL's real GRPOTrainer: the environment_factory adapter and its task rows.

The trainer tests drill tiny random Llamas over SmolLM2's real tokenizer (with the tool-calling
chat template the adapter sets, since SmolLM2's own renders no tools; built once into the
test-model cache), then run two real GRPOTrainer steps each: on ProbeKeys-v0 through the one
``step`` tool, and on TreeSearchQA-v0 and TextHousehold-v0 through their own tools, with a
model drilled on the heuristic expert's episodes played through the adapter.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import requests

import treegym  # noqa: F401  (registers the ids)

trl = pytest.importorskip("trl")

from treegym.errors import ConfigError  # noqa: E402
from treegym.integrations.trl import (  # noqa: E402
    ENDED,
    HouseholdTools,
    QATools,
    TRLEnv,
    WebTools,
    environment_factory,
    grpo_kwargs,
    task_dataset,
    tool_calling_tokenizer,
    tools_for,
)

KEYS = {"horizon": 2, "choices": 2}  # ProbeKeys: say the turn's key (A or B), 0.5 per right turn


def test_task_dataset_pins_an_envs_tasks_by_id() -> None:
    rows = task_dataset("TextHousehold-v0", n=3, split="unseen")
    ids = gym.make("TextHousehold-v0", split="unseen").unwrapped.task_ids()[:3]
    assert rows.column_names == ["prompt", "task_id"] and rows["task_id"] == ids
    assert rows[0]["prompt"] == [{"role": "user", "content": ""}]
    own = gym.make("TextHousehold-v0", split="unseen").reset(options={"task_id": ids[1]})[0]
    assert environment_factory("TextHousehold-v0", split="unseen", tools=TRLEnv)().reset(**rows[1]) == own
    # The household tools' prompt asks for the command tool, over the same room and task.
    intro = own[own.index("-= Welcome"):]
    assert environment_factory("TextHousehold-v0", split="unseen")().reset(**rows[1]).endswith(intro)


def test_task_dataset_carries_seeds_when_the_env_draws_tasks_from_the_seed() -> None:
    rows = task_dataset("ProbeLookup-v0", n=4, first_seed=10)
    assert rows.column_names == ["prompt", "seed"] and rows["seed"] == [10, 11, 12, 13]
    with pytest.raises(ConfigError, match="draws its tasks from the seed"):
        task_dataset("ProbeLookup-v0")
    # The same seed is the same hidden key: the lookup tool reveals it.
    make = environment_factory("ProbeLookup-v0")
    a, b = make(), make()
    a.reset(**rows[2]), b.reset(**rows[2])
    assert a.step("?") == b.step("?")


def test_an_episode_through_the_adapter_returns_the_envs_reward_and_never_raises_after_the_end() -> None:
    env = environment_factory("ProbeKeys-v0", **KEYS)()
    keys = env.env.unwrapped.fixed_keys
    assert env.reset(seed=0, prompt=[{"role": "user", "content": ""}]) == "go"
    assert env.step(keys[0]) == "ok" and env.get_reward() == 0.5 and not env.ended
    assert env.step(keys[1]).endswith(ENDED) and env.ended and env.turns == 2
    assert env.get_reward() == 1.0 and env.info["success"] == 1.0
    assert env.step("A") == ENDED and env.get_reward() == 1.0
    env.reset(seed=0)
    assert env.get_reward() == 0.0 and env.turns == 0


def test_the_factorys_instances_are_independent_forks() -> None:
    make = environment_factory("ProbeKeys-v0", **KEYS)
    a, b = make(), make()
    assert a.env is not b.env and a.env.unwrapped is not b.env.unwrapped
    a.reset(seed=0), b.reset(seed=0)
    a.step("A")
    assert a.turns == 1 and b.turns == 0 and b.env.unwrapped.state.turn == 0


def test_the_class_offers_trl_exactly_one_tool() -> None:
    import inspect

    public = [n for n, _ in inspect.getmembers(TRLEnv, predicate=inspect.isfunction) if not n.startswith("_")]
    assert sorted(public) == ["get_reward", "reset", "step"]


def test_importing_the_adapter_without_trl_says_what_to_install() -> None:
    code = "import sys; sys.modules['trl'] = None; import treegym.integrations.trl"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("treegym.errors.MissingPackageError:") and "pip install 'treegym[trl]'" in last


# ---- two real GRPOTrainer steps -----------------------------------------------------------


@pytest.fixture(scope="module")
def one_thread():
    """The tiny model gains nothing from a second thread, and loses a lot when the cores are shared."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tool_calling_model(one_thread):
    """(model, tokenizer): a 2-layer random Llama over SmolLM2's tokenizer, drilled to call ``step``
    with A or B (50/50) on each assistant turn of a ProbeKeys conversation; cached once built, and
    loaded afresh for each test (a GRPOTrainer run changes its weights in place)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from treegym.agents.models import smollm2_folder
    from treegym.paths import cache_dir

    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    tok.chat_template = qwen2_5_chat_template  # ChatML with tool calls; TRL knows how to parse it
    tok.padding_side = "left"
    conversations = [[{"role": "user", "content": "go"}, _call(a), {"role": "tool", "name": "step", "content": "ok"}, _call(b)]
                     for a in "AB" for b in "AB"]
    tools = [TRLEnv(gym.make("ProbeKeys-v0", **KEYS)).step]
    # The folder is named after what the model was drilled on, so a change of template or tool schema rebuilds it.
    seen = tok.apply_chat_template(conversations[0], tools=tools, tokenize=False)
    folder = cache_dir("test-models") / f"tiny-toolcall-{hashlib.sha256(seen.encode()).hexdigest()[:12]}"
    if not (folder / "config.json").exists():
        _drill(tok, conversations, tools, folder)
    return AutoModelForCausalLM.from_pretrained(folder), tok


def _call(move: str) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "step", "arguments": {"action": move}}}]}


def _drill(tok, conversations: list, tools: list, folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.chat_template_utils import get_training_chat_template

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=1024, tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    batch = tok.apply_chat_template(conversations, tools=tools, chat_template=get_training_chat_template(tok),
                                    tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                    padding=True, return_tensors="pt")
    targets = batch["input_ids"][:, 1:]
    keep = batch["assistant_masks"][:, 1:].bool()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(120):
        # Logits only where the assistant speaks: the 49k-word output layer is most of the cost.
        hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[:, :-1][keep]), targets[keep])
        opt.zero_grad()
        loss.backward()
        opt.step()
    # The floor is ln 2 on the one A/B token of each turn, about 0.03 averaged over the turn.
    assert loss.item() < 0.1, f"the tiny model did not learn the tool-call format (loss {loss.item():.3f})"
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    os.replace(tmp, folder)


def _drill_exact(tok, conversations: list, tools: list, folder: Path, *, hidden: int, steps: int, floor: float) -> None:
    """Train a 2-layer random Llama on the assistant turns of ``conversations``; save it to ``folder``.

    The output layer is untied and starts at zero, and only the rows of words the assistant says
    are trained, so every other word's logit stays exactly 0: the full 49k-word cross-entropy is
    then the one over those rows plus one column of log(number of other words). Exact, and about
    a hundred times cheaper than running the whole output layer.
    """
    import math

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.chat_template_utils import get_training_chat_template

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    torch.nn.init.zeros_(model.lm_head.weight)
    batch = tok.apply_chat_template(conversations, tools=tools, chat_template=get_training_chat_template(tok),
                                    tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                    padding=True, return_tensors="pt")
    keep = batch["assistant_masks"][:, 1:].bool()
    targets = batch["input_ids"][:, 1:][keep]
    words = torch.unique(targets)  # sorted
    labels = torch.searchsorted(words, targets)
    others = torch.full((len(targets), 1), math.log(config.vocab_size - len(words)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        states = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        logits = torch.cat([states[:, :-1][keep] @ model.lm_head.weight[words].T, others], dim=1)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < floor, f"the tiny model did not learn the tool-call format (loss {loss.item():.3f})"
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    os.replace(tmp, folder)


def _grpo_args(tmp_path: Path, **overrides):
    """GRPOConfig for two CPU steps of one 8-completion group, logged each step; ``overrides`` win."""
    from trl import GRPOConfig

    return GRPOConfig(**{
        "output_dir": str(tmp_path), "max_steps": 2, "per_device_train_batch_size": 8, "num_generations": 8,
        "max_completion_length": 128, "max_tool_calling_iterations": 2, "learning_rate": 1e-3, "logging_steps": 1,
        "report_to": "none", "save_strategy": "no", "use_cpu": True, "bf16": False, "seed": 0, "temperature": 1.0,
        **overrides,
    })


def _train(model, args, make_env, made: list, **trainer_kwargs):
    """TRL's GRPOTrainer run for ``args``, its envs from ``make_env``; each env it makes is also put
    in ``made`` (the caller's list, so that a failed run still leaves them to look at or close)."""
    from trl import GRPOTrainer

    def factory():
        made.append(make_env())
        return made[-1]

    trainer = GRPOTrainer(model=model, args=args, environment_factory=factory, **trainer_kwargs)
    trainer.train()
    return trainer


def test_grpo_trainer_trains_a_model_on_a_treegym_env(tool_calling_model, tmp_path, monkeypatch) -> None:
    import torch

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tok = tool_calling_model
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    made: list[TRLEnv] = []
    trainer = _train(model, _grpo_args(tmp_path), environment_factory("ProbeKeys-v0", **KEYS), made,
                     processing_class=tok, train_dataset=task_dataset("ProbeKeys-v0", n=4, **KEYS))

    logs = [h for h in trainer.state.log_history if "rewards/TRLEnv/mean" in h]
    assert len(logs) == 2 and all(h["tools/call_frequency"] > 0 for h in logs)
    # TRL called the step tool, and the envs played by their rules until episodes ended.
    assert any(e.ended and e.turns == KEYS["horizon"] for e in made)
    assert {e.get_reward() for e in made} <= {0.0, 0.5, 1.0}
    # The reward TRL logged (and trained on) for the last step is the mean of the envs' returns, which differed.
    assert logs[-1]["rewards/TRLEnv/mean"] == pytest.approx(sum(e.get_reward() for e in made) / len(made))
    assert logs[-1]["reward_std"] > 0
    changed = [k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert changed, "no weight moved in two GRPO steps"


# ---- each env family's own tools ------------------------------------------------------------

QA_KW = {"index": "bm25", "corpus_limit": 300}  # a small corpus slice: BM25 over 300 passages


def tool_names(cls: type) -> list[str]:
    import inspect

    return sorted(n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
                  if not n.startswith("_") and n not in ("reset", "get_reward"))


def test_each_env_family_gets_its_own_typed_documented_tools() -> None:
    from transformers.utils import get_json_schema

    assert type(environment_factory("TreeSearchQA-v0", **QA_KW)()) is QATools
    assert type(environment_factory("TextHousehold-v0")()) is HouseholdTools
    assert type(environment_factory("ProbeKeys-v0")()) is TRLEnv
    # The tool set is the one the family record names (no isinstance table in the adapter).
    assert [tools_for(i) for i in ("WebSearchQA-v0", "TreeSearchQA-Train-v0", "ProbeKeys-v0")] == [WebTools, QATools,
                                                                                                   TRLEnv]
    assert tool_names(QATools) == ["answer", "search"]
    assert tool_names(WebTools) == ["answer", "browse", "search"]
    assert tool_names(HouseholdTools) == ["command"]
    schemas = {f.__name__: get_json_schema(f)["function"] for f in (QATools.search, QATools.answer, WebTools.browse,
                                                                      HouseholdTools.command)}
    assert {n: list(s["parameters"]["properties"]) for n, s in schemas.items()} == {
        "search": ["query"], "answer": ["text"], "browse": ["url"], "command": ["command"]}
    grammar = schemas["command"]["parameters"]["properties"]["command"]["description"]
    assert all(verb in grammar for verb in ("go to", "take (object) from", "heat (object) with", "inventory"))


def test_the_qa_prompt_asks_for_the_tools_and_an_answer_call_scores() -> None:
    env = environment_factory("TreeSearchQA-v0", **QA_KW)()
    prompt = env.reset(task_id=task_dataset("TreeSearchQA-v0", n=1, **QA_KW)["task_id"][0])
    question = env.env.unwrapped.state.item.question
    assert prompt.rstrip().endswith(f"Question: {question}") and "<search>" not in prompt and "search tool" in prompt
    assert env.search(question).lstrip().startswith("<information>") and not env.ended
    gold = env.env.unwrapped.state.item.answers[0]
    assert env.answer(gold).endswith(ENDED) and env.get_reward() == 1.0 and env.info["success"] == 1.0


def test_household_observations_list_the_admissible_commands() -> None:
    env = environment_factory("TextHousehold-v0")()
    prompt = env.reset(task_id=task_dataset("TextHousehold-v0", n=1)["task_id"][0])
    assert "Admissible commands: go to " in prompt and prompt.rstrip().split("\n")[-1].startswith("Your task is to: ")
    out = env.command("look")
    assert "Admissible commands: " in out and set(env.info["admissible_commands"]) <= set(
        out.split("Admissible commands: ")[1].rstrip(".").split(", "))


def test_a_tokenizer_without_tool_calling_gets_trls_template_and_is_told(capsys) -> None:
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

    from treegym.agents.models import smollm2_folder

    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    assert not supports_tool_calling(tok)
    assert tool_calling_tokenizer(tok) is tok and tok.chat_template == qwen2_5_chat_template
    assert "renders no tool calls" in capsys.readouterr().err
    tool_calling_tokenizer(tok)  # a template that works is left alone, silently
    assert capsys.readouterr().err == ""


def test_a_short_max_completion_length_is_warned_about(recwarn) -> None:
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from treegym.agents.models import smollm2_folder

    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    short = GRPOConfig(output_dir="unused", max_completion_length=128, report_to="none", use_cpu=True)
    with pytest.warns(UserWarning, match=r"max_completion_length=128 is below the 1024 tokens"):
        kwargs = grpo_kwargs("TreeSearchQA-v0", short, tok, n=2, **QA_KW)
    assert sorted(kwargs) == ["environment_factory", "processing_class", "train_dataset"]
    enough = GRPOConfig(output_dir="unused", max_completion_length=QATools.completion_tokens, report_to="none",
                        use_cpu=True)
    recwarn.clear()
    grpo_kwargs("TreeSearchQA-v0", enough, tok, n=2, **QA_KW)
    assert not [w for w in recwarn if "max_completion_length" in str(w.message)]


# ---- two real GRPOTrainer steps on the QA and household envs, through their own tools -----------

# "completion": the test's max_completion_length. The household adapter asks for 4,096 (the p90 of
# the expert's episodes); the two drilled ones need about 1,000 (573 + 981 and 623 + 930 tokens), and a
# sampled rollout that strays generates up to the limit: 4,096 made this test take 258 s of CI's 19 min.
EXPERT_ENVS = {
    "TreeSearchQA-v0": {"kwargs": QA_KW, "iterations": 3, "completion": 1024},
    "TextHousehold-v0": {"kwargs": {}, "iterations": 8, "completion": 1280},
}


def _expert_call(env_id: str, action: str) -> tuple[str, dict]:
    """The heuristic expert's text action as the adapter's tool call."""
    import re

    if env_id == "TextHousehold-v0":
        return "command", {"command": action}
    tag = re.search(r"<(search|answer)>(.*?)</\1>", action, re.DOTALL)
    return ("search", {"query": tag.group(2).strip()}) if tag.group(1) == "search" else ("answer", {"text": tag.group(2).strip()})


def expert_episodes(env_id: str, rows) -> tuple[list[list[dict]], list[float]]:
    """The heuristic expert played through the adapter on each row: TRL's conversation of it
    (the prompt ``reset`` returns, each tool call and result, a closing empty turn), and its return."""
    from treegym.agents.household import HouseholdHeuristic
    from treegym.agents.scripted import HeuristicQAAgent

    expert = HouseholdHeuristic() if env_id == "TextHousehold-v0" else HeuristicQAAgent()
    make = environment_factory(env_id, **EXPERT_ENVS[env_id]["kwargs"])
    conversations, returns = [], []
    for row in rows:
        env = make()
        prompt = env.reset(**row)
        seen = [{"role": "user", "content": prompt}]  # what the expert reads: text in, text out
        talk = [{"role": "user", "content": prompt}]
        while not env.ended and env.turns < 60:  # the env ends it first (household: 50 steps)
            action = expert.act(seen)
            name, arguments = _expert_call(env_id, action)
            out = getattr(env, name)(**arguments)
            seen += [{"role": "assistant", "content": action}, {"role": "user", "content": out}]
            talk += [{"role": "assistant", "content": "",
                      "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]},
                     {"role": "tool", "name": name, "content": out}]
        conversations.append([*talk, {"role": "assistant", "content": ""}])
        returns.append(env.get_reward())
    return conversations, returns


@pytest.fixture(scope="module")
def smollm2_tool_tokenizer():
    from transformers import AutoTokenizer

    from treegym.agents.models import smollm2_folder

    tok = tool_calling_tokenizer(AutoTokenizer.from_pretrained(smollm2_folder()))
    tok.padding_side = "left"
    return tok


def drilled_model(env_id: str, tok):
    """(model, rows): a tiny random Llama drilled on the expert's episodes of two tasks (the two
    shortest the expert solves of the env's first 8), and those tasks' rows; cached under a name
    from the rendered episodes. Two, not 8: a 2-layer model on a shared CPU memorises two episodes
    in a minute, and two GRPO steps sample one task each."""
    from transformers import AutoModelForCausalLM

    from treegym.paths import cache_dir

    kwargs = EXPERT_ENVS[env_id]["kwargs"]
    rows = task_dataset(env_id, n=8, **kwargs)
    conversations, returns = expert_episodes(env_id, rows)
    assert sum(r >= 1.0 for r in returns) >= 7, f"the expert through the adapter earned {returns} on 8 tasks"
    probe = environment_factory(env_id, **kwargs)()
    tools = [getattr(probe, name) for name in tool_names(type(probe))]
    rendered = [tok.apply_chat_template(c, tools=tools, tokenize=False) for c in conversations]
    chosen = sorted((i for i, r in enumerate(returns) if r >= 1.0), key=lambda i: len(rendered[i]))[:2]
    seen = "".join(rendered[i] for i in chosen)
    folder = cache_dir("test-models") / f"tiny-{env_id.split('-')[0].lower()}-{hashlib.sha256(seen.encode()).hexdigest()[:12]}"
    if not (folder / "config.json").exists():
        _drill_exact(tok, [conversations[i] for i in chosen], tools, folder, hidden=64, steps=150, floor=0.02)
    return AutoModelForCausalLM.from_pretrained(folder), rows.select(chosen)


@pytest.mark.parametrize("env_id", list(EXPERT_ENVS))
def test_grpo_trainer_trains_on_a_treegym_env_through_its_own_tools(env_id, smollm2_tool_tokenizer, one_thread,
                                                                   tmp_path, monkeypatch, recwarn) -> None:
    import torch

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, rows = drilled_model(env_id, smollm2_tool_tokenizer)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    tools_cls = type(environment_factory(env_id, **EXPERT_ENVS[env_id]["kwargs"])())
    args = _grpo_args(
        tmp_path, max_completion_length=EXPERT_ENVS[env_id]["completion"],
        max_tool_calling_iterations=EXPERT_ENVS[env_id]["iterations"],
        # Adam moves every weight by about the learning rate; 1e-5 leaves the drilled model intact for step 2.
        learning_rate=1e-5,
    )
    kwargs = grpo_kwargs(env_id, args, smollm2_tool_tokenizer, n=8, **EXPERT_ENVS[env_id]["kwargs"])
    kwargs["train_dataset"] = rows  # the tasks the model was drilled on
    warned = [w for w in recwarn if "max_completion_length" in str(w.message)]
    assert bool(warned) == (args.max_completion_length < tools_cls.completion_tokens)
    made: list = []
    trainer = _train(model, args, kwargs.pop("environment_factory"), made, **kwargs)

    key = f"rewards/{tools_cls.__name__}/mean"
    logs = [h for h in trainer.state.log_history if key in h]
    assert len(logs) == 2 and all(h["tools/call_frequency"] > 0 for h in logs)
    assert all(h[key] > 0 for h in logs), [h[key] for h in logs]  # the drilled model earns rewards in both steps
    assert any(e.ended and e.info.get("success") == 1.0 for e in made)
    changed = [k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert changed, "no weight moved in two GRPO steps"


# ---- TRL's OpenEnv pattern against `treegym serve-env`: the recipe of docs/integrations.md --------


class ServedEnv:
    """A TRL environment over a ``treegym serve-env`` server, through OpenEnv's own client:
    ``reset`` returns the prompt, ``step`` is the one tool, the reward accumulates."""

    url = ""  # set before training: the server's address

    def __init__(self) -> None:
        from treegym.integrations.openenv import TreegymEnvClient

        self.client = TreegymEnvClient(self.url).sync()
        self.client.connect()
        self.reward, self.done = 0.0, True

    def reset(self, task_id: str | None = None, seed: int | None = None, **row) -> str:
        result = self.client.reset(task_id=task_id, seed=seed)
        self.reward, self.done = 0.0, False
        return result.observation.text

    def step(self, action: str) -> str:
        """Take one turn in the environment and return what it shows next.

        Args:
            action: your whole turn, written as the task's instructions ask, e.g. a search or an answer in their tags.
        """
        if self.done:
            return "The episode has ended. Reply without calling a tool."
        result = self.client.step(action)
        self.reward += result.reward or 0.0
        self.done = result.done
        return result.observation.text

    def get_reward(self) -> float:
        return self.reward


def served_rows(url: str, n: int):
    """GRPOTrainer rows for a served env: its task ids from ``GET /tasks``, or ``n`` seeds when
    the env draws its tasks from the seed (``task_ids`` is null)."""
    from datasets import Dataset

    ids = requests.get(f"{url}/tasks", timeout=30).json()["task_ids"]
    prompt = [{"role": "user", "content": ""}]
    if ids is None:
        return Dataset.from_dict({"prompt": [prompt] * n, "seed": list(range(n))})
    return Dataset.from_dict({"prompt": [prompt] * min(n, len(ids)), "task_id": ids[:n]})


def test_trls_openenv_pattern_trains_against_serve_env(tool_calling_model, tmp_path, monkeypatch) -> None:
    pytest.importorskip("openenv")
    from treegym.integrations.openenv import serve

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    household = serve("TextHousehold-v0", port=0).start()
    try:  # task ids come from /tasks, and reset with one returns that task's prompt
        rows = served_rows(household.url, 2)
        assert rows["task_id"] == gym.make("TextHousehold-v0").unwrapped.task_ids()[:2]
        monkeypatch.setattr(ServedEnv, "url", household.url)
        assert ServedEnv().reset(**rows[1]).endswith(
            gym.make("TextHousehold-v0").reset(options={"task_id": rows[1]["task_id"]})[0][-200:])
    finally:
        household.stop()

    server = serve("ProbeKeys-v0", {"horizon": 2, "choices": 2}, port=0, max_episodes=32).start()
    try:
        monkeypatch.setattr(ServedEnv, "url", server.url)
        model, tok = tool_calling_model
        made: list[ServedEnv] = []
        trainer = _train(model, _grpo_args(tmp_path), ServedEnv, made, processing_class=tok,
                         train_dataset=served_rows(server.url, 4))
        logs = [h for h in trainer.state.log_history if "rewards/ServedEnv/mean" in h]
        assert len(logs) == 2 and all(h["tools/call_frequency"] > 0 for h in logs)
        assert {e.reward for e in made} <= {0.0, 0.5, 1.0} and any(e.done and e.reward > 0 for e in made)
        assert logs[-1]["rewards/ServedEnv/mean"] == pytest.approx(sum(e.reward for e in made) / len(made))
    finally:
        for env in made:
            env.client.close()
        server.stop()
