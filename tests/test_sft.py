"""``treegym sft``: expert episodes in the RL context format, the masked loss, the saved model, bad input."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import treegym  # noqa: F401  (registers the env ids)
from treegym.agents.eval import TraceFormatError, Transcript, read_traces
from treegym.agents.experts import ExpertError, make_expert
from treegym.agents.policy import Generation, PolicyStats, SamplingParams
from treegym.agents.rollout.context import TokenContext
from treegym.agents.rollout.samplers import sample_chains
from treegym.cli import main
from treegym.envs.registry import family
from treegym.errors import ConfigError, TreegymError
from treegym.trainers.config import SFTConfig, TrainConfig, load_config
from treegym.trainers.logprobs import TokenScorer
from treegym.trainers.sft import batch_nll, check_writable, run_sft, train_examples
from treegym.trainers.sft_data import SFTExample, collect_episodes, episode_example, select_examples

# how a QA turn ends when the sampler plays it: at the env's own closing tags
QA_TURN = SamplingParams().with_stops(family("TreeSearchQA-v0").action_stops)

pytest_plugins = ["model_fixtures"]  # the session-scoped `smollm2` fixture

ENV_KWARGS = {"corpus_limit": 300, "index": "bm25", "max_turns": 2}


@pytest.fixture(scope="module")
def qa_env() -> gym.Env:
    return gym.make("TreeSearchQA-v0", split="train", **ENV_KWARGS)


@pytest.fixture(scope="module")
def expert_episodes(qa_env: gym.Env) -> list[Transcript]:
    ids = [it.id for it in qa_env.unwrapped.items[:3]]
    return collect_episodes(qa_env, make_expert("TreeSearchQA-v0", "heuristic", 2), [{"task_id": t} for t in ids])


class ReplayPolicy:
    """Emits given action texts, one per call, as the sampler would have sampled them."""

    def __init__(self, tokenizer: object, actions: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stats = PolicyStats()
        self.actions = list(actions)

    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        text = self.actions.pop(0)
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        return [Generation(ids, (0.0,) * len(ids), text, "stop") for _ in contexts]


def _actions(ep: Transcript) -> list[str]:
    return [m["content"] for m in ep.messages if m["role"] == "assistant"]


@pytest.mark.parametrize("mode", ["chat", "raw"])
def test_example_is_the_rl_rollout_of_the_same_actions(mode: str, smollm2, qa_env, expert_episodes) -> None:
    _, tokenizer = smollm2
    ep = expert_episodes[0]
    example = episode_example(TokenContext(tokenizer, mode), ep, QA_TURN)
    task = {"task_id": qa_env.unwrapped.items[0].id}  # the task expert_episodes[0] ran
    batch = sample_chains(ReplayPolicy(tokenizer, _actions(ep)), qa_env, [task], 1, max_turns=2, mode=mode)
    rollout = batch.rollouts[0]
    assert list(example.token_ids) == rollout.token_ids
    assert list(example.label_mask) == rollout.loss_mask


@pytest.mark.parametrize("mode", ["chat", "raw"])
def test_loss_mask_covers_exactly_the_expert_actions(mode: str, smollm2, expert_episodes) -> None:
    _, tokenizer = smollm2
    ep = expert_episodes[0]
    example = episode_example(TokenContext(tokenizer, mode), ep, QA_TURN)
    labelled = [t for t, m in zip(example.token_ids, example.label_mask) if m]
    assert tokenizer.decode(labelled) == "".join(_actions(ep))
    spans = [tokenizer.decode(example.token_ids[a:b]) for a, b in example.action_spans]
    assert spans == _actions(ep)
    context = [t for t, m in zip(example.token_ids, example.label_mask) if not m]
    unlabelled = tokenizer.decode(context)
    assert "<information>" in unlabelled and "Question:" in unlabelled
    decoded = tokenizer.decode(labelled)
    assert "<information>" not in decoded and "Question:" not in decoded and "<|im_start|>" not in decoded


def test_wrong_and_overlong_episodes_are_not_imitated(smollm2, expert_episodes) -> None:
    _, tokenizer = smollm2
    ctx = TokenContext(tokenizer, "chat")
    right, wrong = expert_episodes[0], Transcript("w", expert_episodes[0].messages, success=0.0)
    kept, dropped = select_examples(ctx, [right, wrong], only_correct=True, params=SamplingParams(max_new_tokens=1000))
    assert [e.episode_id for e in kept] == [right.episode_id] and dropped["wrong"] == 1
    kept, dropped = select_examples(ctx, [right], only_correct=True, params=SamplingParams(max_new_tokens=3))
    assert kept == [] and dropped["too_long"] == 1


def _short_episodes() -> list[Transcript]:
    out = []
    for name, year in (("Ada Lovelace", 1815), ("Alan Turing", 1912), ("Grace Hopper", 1906)):
        out.append(Transcript(name, (
            {"role": "user", "content": f"Question: In what year was {name} born?"},
            {"role": "assistant", "content": f"<think>I need the passage about {name}.</think><search>{name}</search>"},
            {"role": "user", "content": f"<information>Doc 1(Title: {name}) born {year}.</information>"},
            {"role": "assistant", "content": f"<think>The passage gives the year.</think><answer>{year}</answer>"},
        ), success=1.0))
    return out


def example_loss(model: torch.nn.Module, examples: Sequence[SFTExample], pad_id: int) -> float:
    """Mean NLL per labelled token of ``examples`` (no grad)."""
    with torch.no_grad():
        total, count = batch_nll(TokenScorer(model), examples, pad_id, torch.device("cpu"))
    return float(total) / max(count, 1)


def test_a_few_optimiser_steps_lower_the_loss_on_their_episodes() -> None:
    from treegym.agents.models import load_model

    torch.manual_seed(0)
    model, tokenizer = load_model("smollm2", device="cpu", dtype=torch.float32)  # a private copy: it is trained
    examples = [episode_example(TokenContext(tokenizer, "chat"), ep, QA_TURN) for ep in _short_episodes()]
    before = example_loss(model, examples, tokenizer.pad_token_id)
    cfg = SFTConfig(epochs=2, batch_size=3, micro_batch_size=3, lr=1e-4, warmup=0.0)
    passes: list[tuple[int, bool, float]] = []  # after each pass: its number, train mode, the loss then
    losses = train_examples(model, examples, cfg, tokenizer.pad_token_id, torch.device("cpu"), progress=False,
                            after_pass=lambda k: passes.append((k, model.training, example_loss(model, examples, tokenizer.pad_token_id))))
    after = example_loss(model, examples, tokenizer.pad_token_id)
    assert len(losses) == 2
    assert after < 0.8 * before
    assert [(k, training) for k, training, _ in passes] == [(1, False), (2, False)]
    assert passes[0][2] < before and passes[1][2] == pytest.approx(after)


def test_bf16_sft_runs_its_matmuls_in_bf16_and_learns_what_fp32_learns() -> None:
    """``bf16=True``: the forward's projections run in bf16 (a hook reads their output dtype),
    the weights stay fp32, and the losses follow fp32's to bf16 rounding."""
    from treegym.agents.models import load_model

    seen: dict[bool, set[torch.dtype]] = {}
    losses: dict[bool, list[float]] = {}
    for bf16 in (False, True):
        torch.manual_seed(0)
        model, tokenizer = load_model("smollm2", device="cpu", dtype=torch.float32)
        examples = [episode_example(TokenContext(tokenizer, "chat"), ep, QA_TURN) for ep in _short_episodes()]
        proj = model.get_decoder().layers[0].self_attn.q_proj
        dtypes: set[torch.dtype] = set()
        hook = proj.register_forward_hook(lambda _m, _i, out, seen_here=dtypes: seen_here.add(out.dtype))
        cfg = SFTConfig(epochs=2, batch_size=3, micro_batch_size=3, lr=1e-4, warmup=0.0)
        losses[bf16] = train_examples(model, examples, cfg, tokenizer.pad_token_id, torch.device("cpu"),
                                      progress=False, bf16=bf16)
        hook.remove()
        seen[bf16] = dtypes
        assert proj.weight.dtype == torch.float32
    assert seen == {False: {torch.float32}, True: {torch.bfloat16}}
    assert losses[True] == pytest.approx(losses[False], rel=0.05)
    assert losses[True][1] < losses[True][0]


def test_sft_run_saves_a_folder_that_train_and_eval_load(tmp_path: Path) -> None:
    from treegym.agents.resolve import resolve_agent
    from treegym.trainers.model import load_trainable_model

    out = tmp_path / "sft"
    cfg = load_config(None, [("sft.out", str(out)), ("env_kwargs", {"corpus_limit": 300}), ("sft.episodes", 2),
                             ("sft.batch_size", 2), ("sft.micro_batch_size", 2), ("run.eval_n", 0),
                             ("model_opts.device", "cpu")])
    result = run_sft(cfg, progress=False, log=lambda _: None)
    assert result.steps == 1 and result.examples >= 1
    meta = json.loads((out / "sft.json").read_text())
    assert meta["context_mode"] == "chat" and meta["examples"] == result.examples
    assert (out / "model.safetensors").exists()
    agent = resolve_agent(str(out), "TreeSearchQA-v0")
    assert agent.is_policy
    tokenizer = agent.obj.tokenizer
    ctx = TokenContext(tokenizer, "chat").prompt_ids("Question: In what year was Ada Lovelace born?")
    gen = agent.obj.generate([ctx], SamplingParams(temperature=0.0, max_new_tokens=4))[0]
    assert len(gen.token_ids) >= 1
    train_cfg = load_config(None, [("model", str(out)), ("model_opts.device", "cpu")])
    model, _ = load_trainable_model(train_cfg, torch.device("cpu"))
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in agent.obj.model.parameters())


# ---- bad input ---------------------------------------------------------------------------------


def test_empty_trace_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_text("\n")
    with pytest.raises(TraceFormatError, match="no usable episode"):
        read_traces(path)


def test_malformed_trace_line_is_named(tmp_path: Path, expert_episodes) -> None:
    path = tmp_path / "traces.jsonl"
    good = json.dumps({"episode_id": "0", "em": 1.0, "messages": list(expert_episodes[0].messages)})
    path.write_text(good + "\n{not json\n")
    with pytest.raises(TraceFormatError, match="line 2"):
        read_traces(path)
    path.write_text(good + "\n" + json.dumps({"messages": [{"role": "assistant", "content": "x"}]}) + "\n")
    with pytest.raises(TraceFormatError, match="line 2.*first message"):
        read_traces(path)


def test_traces_from_eval_are_read_back(tmp_path: Path) -> None:
    from treegym.agents.eval import evaluate

    evaluate("heuristic", "TreeSearchQA-v0", 2, split="dev", out=tmp_path, env_kwargs=ENV_KWARGS, progress=False)
    episodes = read_traces(tmp_path)
    assert len(episodes) == 2 and all(ep.messages[0]["role"] == "user" for ep in episodes)


def test_unknown_expert_and_env_without_expert_are_clear_errors() -> None:
    with pytest.raises(ExpertError, match="unknown expert 'genius'"):
        make_expert("TreeSearchQA-v0", "genius", 2)
    with pytest.raises(ExpertError, match="has no heuristic expert"):
        make_expert("CartPole-v1", "heuristic", 2)


def test_unwritable_out_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(TreegymError, match="cannot write the output folder"):
        check_writable(blocker / "out")


def test_cli_reports_bad_input_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("[1, 2]\n")
    assert main(["sft", "--traces", str(path), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "Traceback" not in err
    assert main(["sft", "--expert", "genius", "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "unknown expert" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="sft.epochs: must be > 0"):
        run_sft(load_config(None, [("sft.out", str(tmp_path / "o")), ("sft.epochs", 0)]))
    cfg = TrainConfig()
    cfg.sft.epochs = 0  # set after loading: run_sft validates what it is given
    with pytest.raises(ConfigError, match="sft.epochs"):
        run_sft(cfg)


def test_cli_options_are_the_config_fields_with_their_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from treegym.cli import build_parser
    from treegym.trainers.cli_sft import FLAGS
    from treegym.trainers.config import get_path, leaf_paths
    from treegym.trainers.config_options import given_overrides

    args, _ = build_parser().parse_known_args(["sft"])
    assert given_overrides(args, FLAGS) == []  # nothing given: every value is the config's
    assert load_config(None, given_overrides(args, FLAGS)).sft == SFTConfig()
    assert {p for p in leaf_paths() if p.startswith("sft.")} <= set(FLAGS.values())  # every sft field is a flag
    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    defaults = TrainConfig()
    for flag, path in FLAGS.items():
        assert f"--{flag}" in out and f"config field {path})" in out
        assert f"(default {get_path(defaults, path)!r}" in out, flag


def test_sft_plays_the_env_familys_turn_budget(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``treegym sft --env TextHousehold-v0`` plays 10-turn episodes of 16 tokens, as train does
    (it used to play 2 turns, so no heuristic episode was solved and none was kept)."""
    import treegym.trainers.sft as sft
    from treegym.cli import build_parser
    from treegym.trainers.cli_sft import FLAGS
    from treegym.trainers.config_options import given_overrides

    seen: dict[str, object] = {}

    def stop_after_collecting(env, expert, prompts, progress=False, max_turns=None):
        seen["max_turns"] = max_turns
        episodes = collect_episodes(env, expert, prompts[:4], max_turns=max_turns)
        seen["solved"] = sum(ep.success for ep in episodes)
        raise SystemExit(0)

    monkeypatch.setattr(sft, "collect_episodes", stop_after_collecting)
    args, _ = build_parser().parse_known_args(["sft", "--env", "TextHousehold-v0", "--out", str(tmp_path / "o")])
    cfg = load_config(None, given_overrides(args, FLAGS))
    assert (cfg.sampler.max_turns, cfg.sampler.max_new_tokens) == (10, 16)
    with pytest.raises(SystemExit):
        run_sft(cfg, progress=False, log=lambda _: None)
    assert seen["max_turns"] == 10 and seen["solved"] >= 1
