"""An env family owns its settings: one record, registered with the env, that train, sft, eval and
play read. A new family is its own files plus its record, and nothing in trainers/ or agents/."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest
from toy_env import ToyEnv, ToyExpert, toy_family

from treegym.cli import main
from treegym.envs import registry
from treegym.trainers.config import load_config

pytest_plugins = ["model_fixtures"]  # the session-scoped `tiny_chat_model` fixture
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def toy_family_registered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[registry.Family]:
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path / "home"))
    fam = registry.register_family(toy_family())
    yield fam
    for env_id in (fam.id, fam.training):
        registry.FAMILIES.pop(env_id, None)
        registry.VARIANTS.pop(env_id, None)
        gym.registry.pop(env_id, None)
    registry._resolved.pop(fam.id, None)


def test_a_registered_toy_family_trains_sfts_and_evaluates_with_no_edit_elsewhere(
    toy_family_registered: registry.Family, tiny_chat_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fam = toy_family_registered
    cfg = load_config(None, [("env", fam.id)])
    assert (cfg.sampler.max_turns, cfg.sampler.max_new_tokens, cfg.warm_start_episodes) == (6, 4, 4)
    assert registry.training_id(fam.id) == "ToySquares-Train-v0" and registry.score_name(fam.id) == "success"

    # train: a warm start on the family's expert, then one RL step, scored on its held-out split
    assert main(["train", "--env", fam.id, "--model", str(tiny_chat_model), "--steps", "1", "--warm_start=on",
                 "--out", str(tmp_path / "runs"), "--name", "toy", "--no-progress", "--run.eval_n=2",
                 "--run.tensorboard=false", "--run.plots=false", "--run.trees_html=false"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "warm start on" in out and "success after RL" in out
    phases = json.loads((tmp_path / "runs" / "toy" / "phases.json").read_text())
    assert list(phases["phases"]) == ["untrained", "after warm start", "after RL"]

    # sft on its own: the family's expert and turn budget
    sft_out = tmp_path / "sft"
    assert main(["sft", "--env", fam.id, "--model", str(tiny_chat_model), "--out", str(sft_out), "--episodes", "4",
                 "--eval-n", "0", "--device", "cpu", "--no-progress"]) == 0  # fmt: skip
    meta = json.loads((sft_out / "sft.json").read_text())
    assert meta["source"].startswith("heuristic expert on ToySquares-v0") and meta["examples"] >= 1
    assert meta["config"]["sampler"]["max_turns"] == 6

    # eval: the family's scripted expert by name, and the model SFT wrote
    capsys.readouterr()
    assert main(["eval", "--agent", "heuristic", "--env", fam.id, "--n", "4", "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == 4 and report["success"]["mean"] == 1.0  # the expert solves every toy task
    assert main(["eval", "--agent", str(sft_out), "--env", fam.id, "--n", "2", "--max-new-tokens", "4",
                 "--no-progress"]) == 0  # fmt: skip


class ToyVariantEnv(ToyEnv):
    """A subclass: it plays its parent's experts unless it registers its own under the name."""


def test_the_toy_familys_expert_is_found_through_the_registry(toy_family_registered: registry.Family) -> None:
    import dataclasses

    from treegym.agents.experts import EXPERTS, experts_of, make_expert, warm_start_expert

    fam = toy_family_registered
    assert isinstance(make_expert(fam.id, "heuristic", 6), ToyExpert)
    assert set(experts_of(fam.training)) == {"heuristic"} and warm_start_expert(fam.id) == "heuristic"
    # The record names its expert; apart from its own entry point it holds no import string.
    strings = [getattr(fam, f.name) for f in dataclasses.fields(fam) if f.name != "entry_point"]
    assert not any(isinstance(v, str) and ":" in v for v in strings)
    # A subclass plays its parent's experts, and its own registration wins for its name.
    assert isinstance(make_expert("test_env_family:ToyVariantEnv", "heuristic"), ToyExpert)
    EXPERTS[(ToyVariantEnv, "heuristic")] = lambda max_turns: "its own"
    try:
        assert make_expert("test_env_family:ToyVariantEnv", "heuristic") == "its own"
    finally:
        del EXPERTS[(ToyVariantEnv, "heuristic")]


def test_every_familys_warm_start_expert_is_registered_for_its_env() -> None:
    from treegym.agents.experts import warm_start_expert

    for env_id, fam in registry.FAMILIES.items():
        assert fam.expert is None or warm_start_expert(env_id) == fam.expert, env_id


def test_each_env_owns_the_text_that_ends_its_turns() -> None:
    from treegym.agents.policy import SamplingParams

    assert registry.family("TreeSearchQA-v0").action_stops == ("</search>", "</answer>")
    assert registry.family("WebSearchQA-v0").action_stops == ("</search>", "</browse>", "</answer>")
    assert SamplingParams().stop == ()  # no table of every env's tags above the envs: samplers add the env's


def test_the_household_family_plays_its_turn_budget_in_every_command() -> None:
    fam = registry.family("TextHousehold-v0")
    assert (fam.max_turns, fam.max_new_tokens, fam.expert, fam.training) == (10, 16, "heuristic", "TextHousehold-Train-v0")
    assert fam.eval_split == "seen" and fam.splits == ("train", "seen", "unseen") and fam.action_stops == ("</action>", "\n", ",")
    for argv in (["--env", "TextHousehold-v0"], ["--env", "TextHousehold-Train-v0"]):
        cfg = load_config(None, [("env", argv[1])])
        assert (cfg.sampler.max_turns, cfg.sampler.max_new_tokens, cfg.warm_start_episodes) == (10, 16, 128)
        assert (cfg.sft.epochs, cfg.sft.batch_size) == (fam.sft_epochs, fam.sft_batch_size) == (2, 4)
    # the record's SFT settings are defaults: an override wins, and a family that sets none keeps SFT's
    assert load_config(None, [("env", "TextHousehold-v0"), ("sft.epochs", 1)]).sft.epochs == 1
    assert load_config(None, [("env", "TreeSearchQA-v0")]).sft.epochs == 1


def env_id_matches(source: str, ids: set[str]) -> list[tuple[int, str]]:
    """Where ``source`` keys a dict by an env id (or its name without the version) or compares
    one (``==``, ``in``, ``startswith``): (line, the id)."""
    def names_an_env(n: ast.AST) -> bool:
        return isinstance(n, ast.Constant) and isinstance(n.value, str) and bool(n.value) and any(
            i.startswith(n.value) for i in ids)

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            suspects = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Compare):
            suspects = [node.left, *node.comparators]
            suspects += [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("startswith", "endswith"):
            suspects = [*node.args, *(e for a in node.args if isinstance(a, ast.Tuple) for e in a.elts)]
        else:
            continue
        found += [(n.lineno, n.value) for n in suspects if names_an_env(n)]
    return found


def test_no_per_env_table_or_env_id_match_above_the_envs() -> None:
    """trainers/ and agents/ key no table by an env id and compare no id: each env's settings are
    its family's record. (A default value, ``env="TreeSearchQA-v0"``, is neither.)"""
    ids = {*registry.FAMILIES, *registry.VARIANTS}
    found = [f"{path.relative_to(ROOT)}:{line} {value!r}" for folder in ("trainers", "agents")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for line, value in env_id_matches(path.read_text(encoding="utf-8"), ids)]  # fmt: skip
    assert found == []


def test_the_checker_catches_a_prefix_match_a_comparison_and_a_table() -> None:
    source = ('if env_id.startswith(("TextHousehold",)):\n    pass\nT = {"TextHousehold-v0": 1}\n'
              'ok = env_id == "TextHousehold-Train-v0"\nDEFAULT = "TextHousehold-v0"\n')
    assert env_id_matches(source, {"TextHousehold-v0", "TextHousehold-Train-v0"}) == [
        (1, "TextHousehold"), (3, "TextHousehold-v0"), (4, "TextHousehold-Train-v0")]
