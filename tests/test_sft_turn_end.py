"""SFT labels where an action's turn ends, as the sampler ends it: every family, every context
mode. A household command has no stop string of its own, so its end of turn (EOS, the chat
template's ``<|im_end|>``) is labelled, and a warm start learns to stop after one command."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from web_servers import small_corpus

import treegym  # noqa: F401  (registers the env ids)
from treegym.agents.eval import Transcript
from treegym.agents.experts import make_expert
from treegym.agents.hf_policy import HFPolicy
from treegym.agents.models import load_model
from treegym.agents.policy import Generation, PolicyStats, SamplingParams
from treegym.agents.rollout.context import TokenContext
from treegym.agents.rollout.samplers import sample_chains
from treegym.envs import registry
from treegym.envs.web.local_web import LocalWeb
from treegym.trainers.config import TrainConfig, load_config
from treegym.trainers.prompts import make_env, sampling_params
from treegym.trainers.sft import run_sft
from treegym.trainers.sft_data import collect_episodes, episode_example, turn_ids

pytest_plugins = ["model_fixtures"]  # the session-scoped `tiny_chat_model` fixture

FAMILIES = ["TreeSearchQA-v0", "WebSearchQA-v0", "TextHousehold-v0"]
WEB_QA = str(Path(__file__).parent / "web_fixtures" / "qa.jsonl")


@pytest.fixture(scope="module")
def web():
    with LocalWeb(small_corpus()) as w:
        yield w


@pytest.fixture(scope="module")
def tiny(tiny_chat_model: Path) -> tuple[Any, Any]:
    return load_model(str(tiny_chat_model), device="cpu")


def _config(env_id: str, web: LocalWeb, tmp: Path) -> TrainConfig:
    """The family's defaults, on a small corpus (QA) or the local web (web)."""
    kwargs: dict[str, Any] = {
        "TreeSearchQA-v0": {"corpus_limit": 300, "index": "bm25"},
        "WebSearchQA-v0": {"dataset": WEB_QA, "search_url": web.url, "cache_path": str(tmp / "web.sqlite"),
                           "browse_allow": ["127.0.0.1"]},
    }.get(env_id, {})
    return load_config(None, [("env", env_id), ("env_kwargs", kwargs)])


def _turn_params(cfg: TrainConfig) -> SamplingParams:
    """What the trainer samples a turn with: its sampler section and the env's own stops."""
    return sampling_params(cfg).with_stops(registry.family(cfg.env).action_stops)


@pytest.fixture(scope="module")
def family_episodes(web: LocalWeb, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[TrainConfig, Any, Transcript]]:
    """Per family: its config, its training env, and one episode of its expert there."""
    out = {}
    for env_id in FAMILIES:
        cfg = _config(env_id, web, tmp_path_factory.mktemp("web"))
        env = make_env(cfg, cfg.run.train_split)
        expert = make_expert(env_id, registry.family(env_id).expert, cfg.sampler.max_turns)
        task = {"task_id": registry.task_ids(env)[0]}
        (episode,) = collect_episodes(env, expert, [task], max_turns=cfg.sampler.max_turns)
        out[env_id] = (cfg, env, episode)
    return out


def _sampler_ends_turn(policy: HFPolicy, ids: Sequence[int], params: SamplingParams) -> tuple[int, str] | None:
    """Feed ``ids`` one at a time to the HF sampler's own end-of-turn check: after how many it
    ends the turn, and why ("stop": EOS or a stop string; "length"), or None if it never does."""
    tokens: list[list[int]] = [[]]
    logprobs: list[list[float]] = [[]]
    texts = [""]
    for n, token in enumerate(ids, 1):
        tokens[0].append(token)
        logprobs[0].append(0.0)
        gen = policy._finish(0, token, tokens, logprobs, texts, params)
        if gen is not None:
            return n, gen.finish_reason
    return None


def _actions(ep: Transcript) -> list[str]:
    return [m["content"] for m in ep.messages if m["role"] == "assistant"]


@pytest.mark.parametrize("mode", ["chat", "raw"])
@pytest.mark.parametrize("env_id", FAMILIES)
def test_each_action_is_labelled_up_to_the_token_where_the_sampler_ends_its_turn(env_id: str, mode: str, family_episodes,
                                                                                 tiny) -> None:
    cfg, _, episode = family_episodes[env_id]
    model, tokenizer = tiny
    params = _turn_params(cfg)
    example = episode_example(TokenContext(tokenizer, mode), episode, params)
    policy = HFPolicy(model, tokenizer)
    unbounded = replace(params, max_new_tokens=10_000)  # an overlong action is select_examples' to drop
    actions = _actions(episode)
    assert len(example.action_spans) == len(actions) >= 2
    for (start, end), action in zip(example.action_spans, actions):
        span = example.token_ids[start:end]
        assert all(example.label_mask[start:end])
        # The labels end exactly where sampling these tokens would have ended the turn, not before.
        assert _sampler_ends_turn(policy, span, unbounded) == (len(span), "stop"), (action, tokenizer.decode(span))
        assert tokenizer.decode(span, skip_special_tokens=True) == action
    assert example.n_labels == sum(end - start for start, end in example.action_spans)  # nothing else


class ReplayPolicy:
    """Emits given actions one per call as HFPolicy returns a turn that ended at EOS: the ids
    with EOS last, the text without it."""

    def __init__(self, tokenizer: Any, actions: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stats = PolicyStats()
        self.actions = list(actions)

    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        text = self.actions.pop(0)
        ids = (*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id)
        return [Generation(ids, (0.0,) * len(ids), text, "stop") for _ in contexts]


@pytest.mark.parametrize("mode", ["chat", "raw"])
def test_household_example_is_the_rollout_of_commands_that_end_their_turn(mode: str, family_episodes, tiny) -> None:
    cfg, env, episode = family_episodes["TextHousehold-v0"]
    _, tokenizer = tiny
    example = episode_example(TokenContext(tokenizer, mode), episode, _turn_params(cfg))
    task = {"task_id": registry.task_ids(env)[0]}  # the task the episode ran
    batch = sample_chains(ReplayPolicy(tokenizer, _actions(episode)), env, [task], 1,
                          max_turns=cfg.sampler.max_turns, mode=mode)
    rollout = batch.rollouts[0]
    assert list(example.token_ids) == rollout.token_ids
    assert list(example.label_mask) == rollout.loss_mask


def test_a_command_gets_the_end_of_turn_and_a_tagged_action_keeps_its_own_stop(tiny) -> None:
    _, tokenizer = tiny
    ctx = TokenContext(tokenizer, "chat")
    household = SamplingParams().with_stops(("\n", ","))
    assert turn_ids(ctx, "go to shelf 1", household) == [*ctx.encode("go to shelf 1"), tokenizer.eos_token_id]
    search = "<think>look it up</think><search>Ada Lovelace</search>"
    qa = SamplingParams().with_stops(registry.family("TreeSearchQA-v0").action_stops)
    assert turn_ids(ctx, search, qa) == ctx.encode(search)  # its stop string ends it


def test_household_warm_start_stops_after_one_admissible_command(tiny_chat_model: Path, tmp_path: Path) -> None:
    # One expert episode, cut at 2 turns, drilled into the 1-layer model: it learns the commands
    # and, from the end-of-turn label, to stop after one.
    cfg = load_config(None, [("env", "TextHousehold-v0"), ("model", str(tiny_chat_model)), ("sft.out", str(tmp_path / "ws")),
                             ("sft.episodes", 1), ("sft.keep_wrong", True), ("sampler.max_turns", 2),
                             ("sft.epochs", 60), ("sft.lr", 3e-2), ("sft.batch_size", 1), ("sft.micro_batch_size", 1),
                             ("sft.warmup", 0.0), ("run.eval_n", 0), ("model_opts.device", "cpu")])  # fmt: skip
    result = run_sft(cfg, progress=False, log=lambda *_: None)
    (episode_id,) = json.loads((result.folder / "sft.json").read_text())["episode_ids"]
    model, tokenizer = load_model(str(result.folder), device="cpu")
    env = make_env(cfg, cfg.run.train_split)  # the training variant: the commands are listed
    obs, info = env.reset(options={"task_id": episode_id.split(":", 1)[1]})
    greedy = sampling_params(cfg, temperature=0.0).with_stops(registry.family(cfg.env).action_stops)
    (gen,) = HFPolicy(model, tokenizer).generate([TokenContext(tokenizer, "chat").prompt_ids(obs)], greedy)
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == tokenizer.eos_token_id, gen
    assert gen.text in info["admissible_commands"], gen.text  # one command, nothing after it
    _, _, _, _, step_info = env.step(gen.text)
    assert not step_info.get("invalid_action")
