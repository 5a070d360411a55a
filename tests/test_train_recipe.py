"""``treegym train`` as a user runs it: every env family trains from its defaults, the warm start
is built once and cached, the summary shows each phase, and a finished run keeps final/ only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from treegym.cli import main
from treegym.trainers.config import TrainConfig, load_config
from treegym.trainers.prompts import make_env

pytest_plugins = ["model_fixtures"]  # the session-scoped `tiny_chat_model` fixture


def _train(tmp_path: Path, *args: str) -> Path:
    name = "run"
    assert main(["train", "--out", str(tmp_path), "--name", name, "--no-progress", *args]) == 0
    return tmp_path / name


@pytest.mark.parametrize("env_id", ["TextHousehold-v0", "WebSearchQA-v0"])
def test_each_env_family_trains_from_its_defaults(env_id: str, tiny_chat_model: Path, tmp_path: Path, capsys) -> None:
    folder = _train(tmp_path, "--env", env_id, "--model", str(tiny_chat_model), "--steps", "2",
                    "--run.eval_n=4", "--sampler.max_new_tokens=8", "--run.tensorboard=false")
    out = capsys.readouterr().out
    steps = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "reward" in r] == [1, 2]
    assert (folder / "final" / "config.json").exists()
    assert not (folder / "checkpoints").exists()  # a finished run keeps its weights only
    phases = json.loads((folder / "phases.json").read_text())
    assert set(phases["phases"]) == {"before RL", "after RL"} and phases["phases"]["after RL"]["n"] == 4
    metric = "success" if env_id == "TextHousehold-v0" else "EM"
    assert f"{metric} after RL" in out and "gain before RL -> after RL" in out
    saved = json.loads(json.dumps(__import__("yaml").safe_load((folder / "config.yaml").read_text())))
    if env_id == "TextHousehold-v0":
        assert saved["run"]["eval_split"] == "auto" and saved["sampler"]["max_turns"] == 10
        assert saved["sampler"]["max_context_tokens"] == 2048  # the family's, for the listed commands
        # It trains on the training variant, whose observations list the admissible commands.
        assert "Your admissible actions of the current situation are: [" in (folder / "trees.html").read_text()


def test_final_weights_load_as_a_model_for_the_next_run(tiny_chat_model: Path, tmp_path: Path) -> None:
    first = _train(tmp_path / "a", "--env", "TextHousehold-v0", "--model", str(tiny_chat_model), "--steps", "1",
                   "--run.eval_n=0", "--sampler.max_new_tokens=4", "--sampler.max_turns=2", "--run.tensorboard=false")
    second = _train(tmp_path / "b", "--env", "TextHousehold-v0", "--model", str(first / "final"), "--steps", "1",
                    "--run.eval_n=0", "--sampler.max_new_tokens=4", "--sampler.max_turns=2", "--run.tensorboard=false")
    assert (second / "final" / "model.safetensors").exists()


@pytest.mark.parametrize("env_id,extra", [("TextHousehold-v0", []),
                                          ("TreeSearchQA-v0", ["--env_kwargs", '{"corpus_limit": 300}'])])
def test_eval_of_a_runs_model_reproduces_its_after_rl_figure(env_id: str, extra: list[str], tiny_chat_model: Path,
                                                            tmp_path: Path, capsys) -> None:
    folder = _train(tmp_path, "--env", env_id, "--model", str(tiny_chat_model), "--steps", "1", "--warm_start=off",
                    "--run.eval_n=4", "--sampler.max_new_tokens=6", "--sampler.max_turns=3", "--run.tensorboard=false",
                    "--run.plots=false", "--run.trees_html=false", *extra)
    after = json.loads((folder / "phases.json").read_text())["phases"]["after RL"]
    protocol = json.loads((folder / "protocol.json").read_text())
    assert (protocol["variant"], protocol["n"], protocol["max_turns"]) == (env_id.replace("-v0", "-Train-v0"), 4, 3)
    capsys.readouterr()
    # --n and --max-new-tokens are the base id's defaults; a run's model replays its run's protocol
    assert main(["eval", "--agent", str(folder / "final"), "--env", env_id, "--n", "2", "--json",
                 "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == after["n"] == 4
    for key in ("success", "well_formed", "tool_calls"):
        assert report[key]["mean"] == pytest.approx(after[key][0], abs=1e-12), key


def test_train_runs_its_preflight_once(tiny_chat_model: Path, tmp_path: Path, monkeypatch) -> None:
    from treegym.trainers import loop, prompts, recipe

    calls: list[str] = []

    def counted(cfg: TrainConfig) -> None:
        calls.append(cfg.env)
        prompts.preflight(cfg)

    monkeypatch.setattr(recipe, "preflight", counted)
    monkeypatch.setattr(loop, "preflight", counted)
    _train(tmp_path, "--env", "TextHousehold-v0", "--model", str(tiny_chat_model), "--steps", "1",
           "--run.eval_n=0", "--sampler.max_new_tokens=4", "--sampler.max_turns=2", "--run.tensorboard=false")
    assert calls == ["TextHousehold-v0"]


def test_warm_start_is_built_once_then_cached(tiny_chat_model: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path / "home"))
    args = ["--model", str(tiny_chat_model), "--steps", "1", "--warm_start=on", "--warm_start_episodes=4",
            "--run.eval_n=4", "--env_kwargs", '{"corpus_limit": 300}',
            "--run.tensorboard=false"]
    folder = _train(tmp_path / "r1", *args)
    out = capsys.readouterr().out
    assert "warm start on" in out and "built in" in out
    phases = json.loads((folder / "phases.json").read_text())
    assert list(phases["phases"]) == ["untrained", "after warm start", "after RL"]
    assert (folder / "plots" / "phases.png").stat().st_size > 0
    assert "untrained -> after RL" in phases["gains"]
    _train(tmp_path / "r2", *args)
    out = capsys.readouterr().out
    assert "warm start: cached at" in out and "(cached)" in out


def test_qa_training_reward_is_format_aware_and_can_be_switched_off() -> None:
    cfg = TrainConfig()
    cfg.env_kwargs = {"corpus_limit": 300}
    env = make_env(cfg, "train")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("<think>a guess</think><answer>certainly not the answer</answer>")
    assert terminated and info["em"] == 0.0 and reward == pytest.approx(0.2)  # wrong but well-formed
    cfg.env_kwargs = {"corpus_limit": 300, "format_score": False}
    env = make_env(cfg, "train")
    env.reset(seed=0)
    assert env.step("<think>a guess</think><answer>certainly not the answer</answer>")[1] == 0.0


@pytest.mark.parametrize(("args", "message"), [
    (["--env", "TextHousehold-v0", "--run.eval_split", "dev"], "has no split 'dev'; its splits: train, seen, unseen"),
    (["--model", "/no/such/model"], "is neither 'smollm2' nor a local Hugging Face model folder"),
    (["--env", "NoSuchEnv-v9"], "is not registered"),
])
def test_bad_train_config_is_a_one_line_error(args: list[str], message: str, tmp_path: Path, capsys) -> None:
    assert main(["train", "--out", str(tmp_path), "--no-progress", "--warm_start=off", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("variant", ["TextHousehold-Train-v0", "WebSearchQA-Train-v0", "TreeSearchQA-Train-v0"])
def test_a_training_variant_id_trains_with_its_base_envs_defaults_and_expert(variant: str) -> None:
    from treegym.envs.registry import base_id, family
    from treegym.trainers.recipe import wants_warm_start

    base = base_id(variant)
    assert base != variant
    as_variant, as_base = load_config(overrides=[("env", variant)]), load_config(overrides=[("env", base)])
    assert as_variant.sampler == as_base.sampler and as_variant.warm_start_episodes == as_base.warm_start_episodes
    assert family(variant).expert == family(base).expert == "heuristic" and wants_warm_start(as_variant)


def test_household_defaults_fit_the_env() -> None:
    cfg = load_config(overrides=[("env", "TextHousehold-v0")])
    assert cfg.sampler.max_turns == 10 and cfg.sampler.max_new_tokens == 16
    cfg = load_config(overrides=[("env", "TextHousehold-v0"), ("sampler.max_turns", 3)])
    assert cfg.sampler.max_turns == 3  # the user's value wins over the env's default


def test_summary_gives_each_phase_gain_of_the_score_and_of_the_well_formed_rate() -> None:
    from types import SimpleNamespace

    from treegym.agents.rollout.scoring import EpisodeScore, HeldOut
    from treegym.trainers.heldout import phase_summary
    from treegym.trainers.recipe import summary_table

    def held(wins: int, well_formed: float, n: int = 32) -> HeldOut:
        return HeldOut(tuple(EpisodeScore(float(i < wins), well_formed, 0, 2) for i in range(n)))

    untrained, warm, after = held(0, 0.0), held(4, 0.5), held(4, 0.75)
    result = SimpleNamespace(eval_before=warm, eval_after=after, steps=3, tokens_total=100, seconds=1.0, folder="/nowhere")
    phases = phase_summary([("untrained", untrained), ("after warm start", warm), ("after RL", after)])
    names = ["untrained -> after warm start", "after warm start -> after RL", "untrained -> after RL"]
    assert list(phases["gains"]) == names and list(phases["well_formed_gains"]) == names
    assert phases["well_formed_gains"]["untrained -> after RL"] == pytest.approx([0.75, 0.75, 0.75])
    assert phases["well_formed_gains"]["after warm start -> after RL"] == pytest.approx([0.25, 0.25, 0.25])
    assert phases["gains"]["after warm start -> after RL"] == pytest.approx([0.0, 0.0, 0.0])
    cfg = load_config(overrides=[("env", "TextHousehold-v0")])
    table = summary_table(cfg, "smollm2", result, SimpleNamespace(examples=8, cached=True, seconds=0.0), phases)  # type: ignore[arg-type]
    assert re.search(r"gain untrained -> after RL\s+\+12\.5 pts \[.*\]  well-formed \+75\.0 pts \[\+75\.0, \+75\.0\]", table)


def test_warm_start_key_names_the_sft_section_only_where_it_is_off_its_defaults() -> None:
    from treegym.trainers.recipe import warm_start_config, warm_start_key

    cfg = load_config(overrides=[("env", "TextHousehold-v0")])
    assert "sft" not in warm_start_key(load_config())  # a default config keeps the key its cached model has
    # a family's own SFT settings (the household's 2 passes at 4 a step) are part of its key
    assert warm_start_key(cfg)["sft"] == {"epochs": 2, "batch_size": 4}
    assert warm_start_key(load_config(overrides=[("sft.lr", 3e-4)])) == warm_start_key(load_config())  # not the warm start's
    assert warm_start_key(load_config(overrides=[("sft.epochs", 2)]))["sft"] == {"epochs": 2}
    ws = warm_start_config(cfg, Path("/tmp/ws"))
    assert (ws.sft.episodes, ws.sft.lr, ws.run.eval_n, ws.sampler.max_turns) == (128, 2e-4, 0, 10)


# The default warm starts' cache folders before SFT labelled the end of a turn (warm start version 1).
UNLABELLED_END_OF_TURN = {"TextHousehold-v0": "TextHousehold-v0-smollm2-913f97dcce10",
                          "TreeSearchQA-v0": "TreeSearchQA-v0-smollm2-9c08ce749c83",
                          "WebSearchQA-v0": "WebSearchQA-v0-smollm2-8174c0be0a87"}


@pytest.mark.parametrize("env_id", sorted(UNLABELLED_END_OF_TURN))
def test_a_warm_start_cached_before_the_end_of_turn_label_is_never_reused(env_id: str) -> None:
    from treegym.trainers.recipe import warm_start_folder

    folder = warm_start_folder(load_config(overrides=[("env", env_id)]))
    assert folder.name.startswith(f"{env_id}-smollm2-") and folder.name != UNLABELLED_END_OF_TURN[env_id]


def test_household_summary_reports_seen_and_unseen() -> None:
    from types import SimpleNamespace

    from treegym.agents.rollout.scoring import HeldOut
    from treegym.trainers.heldout import phase_summary
    from treegym.trainers.recipe import summary_table

    cfg = load_config(overrides=[("env", "TextHousehold-v0")])
    assert cfg.run.also_eval_split == "unseen" and cfg.sft.micro_batch_size == 1
    # the update packs a tree's kept leaves into one forward; SFT pads, so it takes one episode at a time
    assert cfg.optim.micro_batch_size == cfg.sampler.leaves and cfg.optim.pack
    n = 32
    zero = HeldOut.from_dict({"success": [0.0] * n, "well_formed": [0.5] * n, "tool_calls": [0.0] * n, "turns": [10.0] * n})
    some = HeldOut.from_dict({"success": [1.0] * 8 + [0.0] * (n - 8), "well_formed": [0.75] * n,
                              "tool_calls": [0.0] * n, "turns": [10.0] * n})
    phases = phase_summary([("before RL", zero), ("after RL", some)])
    phases["also"] = {"split": "unseen", **phase_summary([("before RL", some), ("after RL", zero)])}
    result = SimpleNamespace(steps=3, tokens_total=100, seconds=1.0, folder="/nowhere")
    table = summary_table(cfg, "smollm2", result, None, phases)
    assert re.search(r"success after RL \(seen\)\s+25\.0%", table)
    assert re.search(r"success after RL \(unseen\)\s+0\.0%", table)
    assert re.search(r"gain before RL -> after RL \(unseen\)\s+-25\.0 pts", table)


def test_another_warm_start_of_a_model_reads_its_untrained_evaluation_back(tiny_chat_model: Path, tmp_path: Path,
                                                                            monkeypatch, capsys) -> None:
    import shutil

    from treegym.paths import seal_folder

    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    shutil.copytree(tiny_chat_model, model)
    seal_folder(model)  # as the converted smollm2 is
    args = ["--model", str(model), "--steps", "1", "--warm_start=on", "--run.eval_n=4",
            "--env_kwargs", '{"corpus_limit": 300}', "--run.tensorboard=false"]
    first = json.loads((_train(tmp_path / "r1", *args, "--warm_start_episodes=4") / "phases.json").read_text())
    assert "remembered" not in capsys.readouterr().out
    # Another warm start of the same model: the untrained model's evaluation is read back (the
    # new warm start's own evaluation before RL is played: other weights).
    other = json.loads((_train(tmp_path / "r2", *args, "--warm_start_episodes=3") / "phases.json").read_text())
    out = capsys.readouterr().out
    assert "held-out evaluation is remembered" in out and "before RL: remembered" not in out
    assert other["phases"]["untrained"] == first["phases"]["untrained"]
