"""treegym envs under TRL's real GRPOTrainer: the environment_factory adapter and its task rows.

The trainer test drills a tiny random Llama over SmolLM2's real tokenizer (with a chat
template that renders tool calls, which SmolLM2's own does not) to call the ``step`` tool
with move A or B at random (built once into the test-model cache), then runs two real
GRPOTrainer steps on ProbeKeys-v0.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import treegym  # noqa: F401  (registers the ids)

trl = pytest.importorskip("trl")

from treegym.errors import ConfigError  # noqa: E402
from treegym.integrations.trl import ENDED, TRLEnv, environment_factory, task_dataset  # noqa: E402

KEYS = {"horizon": 2, "choices": 2}  # ProbeKeys: say the turn's key (A or B), 0.5 per right turn


def test_task_dataset_pins_an_envs_tasks_by_id() -> None:
    rows = task_dataset("TextHousehold-v0", n=3, split="unseen")
    ids = gym.make("TextHousehold-v0", split="unseen").unwrapped.task_ids()[:3]
    assert rows.column_names == ["prompt", "task_id"] and rows["task_id"] == ids
    assert rows[0]["prompt"] == [{"role": "user", "content": ""}]
    env = environment_factory("TextHousehold-v0", split="unseen")()
    assert env.reset(**rows[1]) == gym.make("TextHousehold-v0", split="unseen").reset(options={"task_id": ids[1]})[0]


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


@pytest.fixture(scope="module")
def tool_calling_model(one_thread):
    """(model, tokenizer): a 2-layer random Llama over SmolLM2's tokenizer, drilled to call ``step``
    with A or B (50/50) on each assistant turn of a ProbeKeys conversation; cached once built."""
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


def test_grpo_trainer_trains_a_model_on_a_treegym_env(tool_calling_model, tmp_path, monkeypatch) -> None:
    import torch
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tok = tool_calling_model
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    made: list[TRLEnv] = []
    base = environment_factory("ProbeKeys-v0", **KEYS)

    def factory() -> TRLEnv:
        made.append(base())
        return made[-1]

    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8, num_generations=8,
        max_completion_length=128, max_tool_calling_iterations=2, learning_rate=1e-3, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, bf16=False, seed=0, temperature=1.0,
    )
    trainer = GRPOTrainer(model=model, args=args, processing_class=tok, train_dataset=task_dataset("ProbeKeys-v0", n=4, **KEYS),
                          environment_factory=factory)
    trainer.train()

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
