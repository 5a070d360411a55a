"""Training config: YAML, CLI overrides, and clear errors for bad values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from treegym.errors import ConfigError
from treegym.trainers import advantages, losses
from treegym.trainers.algorithms import ALGORITHMS, chains, get_algorithm, trees
from treegym.trainers.config import TrainConfig, leaf_paths, load_config, parse_overrides
from treegym.trainers.config_options import help_text


def test_every_field_has_a_help_string() -> None:
    for path, f in leaf_paths().items():
        assert f.metadata.get("help"), path
    assert "--optim.lr" in help_text()


def test_defaults_are_tree_search_qa_with_smollm2_and_the_familys_tuned_algorithm() -> None:
    cfg = load_config()
    assert (cfg.env, cfg.model) == ("TreeSearchQA-v0", "smollm2")
    # the trainer's own algorithm is Tree-GRPO; the QA family's record sets the one that learns there
    assert TrainConfig().algo == "tree-grpo" and (cfg.algo, cfg.optim.lr, cfg.sampler.temperature) == ("grpo", 5e-6, 0.7)
    s = cfg.sampler
    assert (s.trees, s.expand_nodes, s.rounds, s.leaves) == (2, 2, 1, 3)
    assert cfg.loss.clip == 0.2 and cfg.loss.dual_clip == 3.0


def test_yaml_then_cli_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("algo: grpo\noptim:\n  lr: 1.0e-4\n  ppo_epochs: 2\nenv_kwargs:\n  max_turns: 3\n")
    cfg = load_config(f, parse_overrides(["--optim.ppo_epochs=3", "--group_size", "4", "--model_opts.lora"]))
    assert cfg.algo == "grpo" and cfg.optim.lr == 1e-4 and cfg.optim.ppo_epochs == 3
    assert cfg.sampler.group_size == 4 and cfg.model_opts.lora is True
    assert cfg.env_kwargs == {"max_turns": 3}


def test_config_round_trips_through_the_yaml_a_run_folder_keeps(tmp_path: Path) -> None:
    cfg = load_config(overrides=[("loss.beta", "0.5"), ("algo", "treeopsd")])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    assert load_config(tmp_path / "config.yaml") == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([("algo", "ppo")], "algo: 'ppo' is not one of: grpo, tree-grpo, treeopsd"),
        ([("optim.lr", "fast")], "optim.lr: 'fast' is not a valid float"),
        ([("steps", "0")], "steps: must be > 0"),
        ([("loss.agg", "sum")], "loss.agg: 'sum' is not one of: token-mean, seq-mean, constant"),
        ([("optim.learning_rate", "1")], "unknown config field 'optim.learning_rate'"),
        ([("model_opts.lora", "maybe")], "model_opts.lora: 'maybe' is not a valid bool"),
    ],
)
def test_bad_config_names_the_field_and_valid_values(overrides: list[tuple[str, str]], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(overrides=overrides)


def test_bad_yaml_is_a_config_error(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("optim: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(f)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_algorithms_are_records_of_sampler_advantage_and_loss() -> None:
    assert set(ALGORITHMS) == {"grpo", "tree-grpo", "treeopsd"}
    assert get_algorithm("grpo").sample is chains and get_algorithm("tree-grpo").sample is trees
    assert get_algorithm("treeopsd").loss is losses.treeopsd_loss
    assert get_algorithm("tree-grpo").advantage is advantages.tree_grpo
    assert get_algorithm("grpo").loss_options(TrainConfig())["clip"] == 0.2
    # each function gets exactly the options it declares (no **kwargs swallowing a typo)
    import inspect

    for algo in ALGORITHMS.values():
        cfg = TrainConfig()
        inspect.signature(algo.advantage).bind(None, **algo.advantage_options(cfg))
        inspect.signature(algo.loss).bind(None, None, None, None, **algo.loss_options(cfg))
    with pytest.raises(ConfigError, match="tree-grpo"):
        get_algorithm("dpo")


@pytest.mark.parametrize(
    "path", ["optim.lr", "sampler.temperature", "loss.clip", "loss.beta", "optim.max_grad_norm", "loss.kl_coef",
             "optim.weight_decay"],
)  # fmt: skip
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_nonfinite_numbers_are_refused(path: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{path}: must be a finite number"):
        load_config(overrides=[(path, value)])


def test_a_nonfinite_number_in_yaml_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("loss:\n  clip: .nan\n")
    with pytest.raises(ConfigError, match="loss.clip: must be a finite number"):
        load_config(f)


def test_a_zero_constant_normalizer_is_refused() -> None:
    with pytest.raises(ConfigError, match="loss.constant_normalizer: must be > 0"):
        load_config(overrides=[("loss.constant_normalizer", "0")])


def test_a_config_that_is_a_folder_or_binary_is_a_config_error(tmp_path: Path) -> None:
    from treegym.cli import main

    binary = tmp_path / "c.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x81binary")
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="cannot be read as YAML text"):
        load_config(binary)
    assert main(["train", "--config", str(binary)]) == 2


def test_train_help_lists_each_env_familys_defaults_and_training_variant(capsys) -> None:
    from treegym.cli import main
    from treegym.envs.registry import FAMILIES, VARIANTS
    from treegym.trainers.config import family_defaults

    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for env_id in FAMILIES:
        values = family_defaults(env_id)
        line = next(x for x in out.splitlines() if x.strip().startswith(f"{env_id}:"))
        assert all(f"{k}={v}" in line for k, v in values.items())
    for variant, (base, _) in VARIANTS.items():
        assert f"{base} -> {variant}:" in out


def test_the_configs_choices_are_the_ones_the_implementations_take() -> None:
    import torch

    from treegym.agents.rollout.types import Rollout
    from treegym.errors import ConfigError
    from treegym.trainers import advantages, algorithms, losses
    from treegym.trainers.config import AdvantageConfig, LossConfig, TrainConfig, choices

    assert set(choices(TrainConfig, "algo")) == set(algorithms.ALGORITHMS)
    values, mask = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    for mode in choices(LossConfig, "agg"):
        assert torch.isfinite(losses.aggregate(values, mask, mode, constant=4.0))

    def rollout(tree: int, path: list[int], reward: float) -> Rollout:
        n = len(path)
        return Rollout(0, tree, path[-1], path, [7] + [1] * n, [0] + [1] * n, [0.0] * (n + 1), [-1, *range(n)], reward)

    batch = [rollout(0, [1, 2], 1.0), rollout(0, [1, 3], 0.0), rollout(1, [1], 1.0)]
    for credit in choices(AdvantageConfig, "prefix_credit"):
        advantages.tree_grpo(batch, prefix_credit=credit)
    for root in choices(AdvantageConfig, "opsd_root"):
        advantages.treeopsd(batch, root=root)
    for mode in choices(AdvantageConfig, "tree_mode"):
        advantages.tree_grpo(batch, mode=mode)
    with pytest.raises(ConfigError):
        advantages.tree_grpo(batch, mode="inter")
    with pytest.raises(ConfigError):
        losses.aggregate(values, mask, "per-token-sum")
    with pytest.raises(ConfigError):
        advantages.tree_grpo(batch, prefix_credit="per_node")
    with pytest.raises(ConfigError):
        advantages.treeopsd(batch, root="forest")


def test_a_familys_step_count_is_the_default_and_an_override_wins() -> None:
    from treegym.envs.registry import FAMILIES

    qa = FAMILIES["TreeSearchQA-v0"].steps
    assert qa is not None and load_config(overrides=[("env", "TreeSearchQA-v0")]).steps == qa
    assert load_config(overrides=[("env", "TreeSearchQA-v0"), ("steps", "2")]).steps == 2
    household = load_config(overrides=[("env", "TextHousehold-v0")]).steps
    assert household == TrainConfig().steps != qa  # a family without its own count keeps the trainer's


def test_household_siblings_make_different_moves_by_default_and_qa_keeps_its_own() -> None:
    household = load_config(overrides=[("env", "TextHousehold-v0")])
    assert household.sampler.distinct_actions is True
    assert load_config(overrides=[("env", "TextHousehold-v0"), ("sampler.distinct_actions", "false")]).sampler.distinct_actions is False
    assert load_config(overrides=[("env", "TreeSearchQA-v0")]).sampler.distinct_actions is TrainConfig().sampler.distinct_actions


def test_a_familys_sft_micro_batch_follows_its_rollout_micro_batch_unless_it_sets_its_own() -> None:
    from treegym.envs.registry import Family
    from treegym.trainers.config import family_defaults

    fam = Family(id="Probe-MicroBatch-v0", entry_point="treegym.envs.probes:ProbeMazeEnv", micro_batch_size=2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(__import__("treegym.envs.registry", fromlist=["FAMILIES"]).FAMILIES, fam.id, fam)
        assert family_defaults(fam.id)["sft.micro_batch_size"] == family_defaults(fam.id)["optim.micro_batch_size"] == 2
        mp.setitem(__import__("treegym.envs.registry", fromlist=["FAMILIES"]).FAMILIES, fam.id,
                   Family(id=fam.id, entry_point=fam.entry_point, micro_batch_size=3, sft_micro_batch_size=1))
        assert (family_defaults(fam.id)["optim.micro_batch_size"], family_defaults(fam.id)["sft.micro_batch_size"]) == (3, 1)


def test_a_familys_algorithm_and_its_learning_rate_per_algorithm_apply_under_the_command_line(tmp_path) -> None:
    from treegym.envs.registry import FAMILIES, Family

    fam = Family(id="Probe-Tuned-v0", entry_point="treegym.envs.probes:ProbeMazeEnv", algo="grpo", temperature=0.7,
                 lr={"grpo": 5e-6, "tree-grpo": 2e-6})
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(FAMILIES, fam.id, fam)
        plain = load_config(overrides=[("env", fam.id)])
        assert (plain.algo, plain.optim.lr, plain.sampler.temperature) == ("grpo", 5e-6, 0.7)
        # another algorithm takes the family's lr for it; one the family did not tune, the trainer's own
        assert load_config(overrides=[("env", fam.id), ("algo", "tree-grpo")]).optim.lr == 2e-6
        assert load_config(overrides=[("env", fam.id), ("algo", "treeopsd")]).optim.lr == TrainConfig().optim.lr
        # the command line and a YAML file still win
        assert load_config(overrides=[("env", fam.id), ("optim.lr", "1e-5")]).optim.lr == 1e-5
        yaml = tmp_path / "run.yaml"
        yaml.write_text("algo: tree-grpo\noptim:\n  lr: 3.0e-6\n")
        from_file = load_config(yaml, [("env", fam.id)])
        assert (from_file.algo, from_file.optim.lr) == ("tree-grpo", 3e-6)
        assert load_config(yaml, [("env", fam.id), ("algo", "grpo")]).optim.lr == 3e-6
