"""The RL benchmarks hand their settings to ``treegym train`` as config fields; a field that does
not exist would fail each run after a warm start of many minutes. These check every method's
fields against the real config, in milliseconds."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from treegym.errors import ConfigError
from treegym.trainers.config import load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("env", ["TreeSearchQA-v0", "WebSearchQA-v0"])
def test_every_rl_real_envs_method_is_a_valid_config_with_the_budget_it_names(env: str) -> None:
    bench = _module("rl_real_envs")
    args = argparse.Namespace(steps=7, budget=1234, eval_n=16, eval_every=2, lr={})
    for method in bench.METHODS:
        cfg = load_config(None, [("env", env), *parse_overrides(bench.config_args(method, args, ["--sampler.temperature=0.7"]))])
        assert (cfg.steps, cfg.token_budget, cfg.run.eval_n, cfg.run.eval_every) == (7, 1234, 16, 2), method
        assert cfg.warm_start == "off" and cfg.sampler.temperature == 0.7
    assert load_config(None, parse_overrides(bench.config_args("grpo", args, []))).algo == "grpo"
    assert load_config(None, parse_overrides(bench.config_args("fork+moves", args, []))).sampler.distinct_actions
    # --lr METHOD=LR: that method's own rate, over an --optim.lr meant for every run; the others keep theirs
    args.lr = bench.method_lrs(["tree-grpo=3e-6"])
    assert load_config(None, parse_overrides(bench.config_args("tree-grpo", args, ["--optim.lr=1e-5"]))).optim.lr == 3e-6
    assert load_config(None, parse_overrides(bench.config_args("grpo", args, ["--optim.lr=1e-5"]))).optim.lr == 1e-5
    with pytest.raises(SystemExit, match="not a number"):
        bench.method_lrs(["grpo=fast"])


def test_a_misspelt_field_is_refused_before_any_run() -> None:
    bench = _module("rl_real_envs")
    args = argparse.Namespace(steps=1, budget=1, eval_n=1, eval_every=0, lr={})
    with pytest.raises(ConfigError, match="run.token_budget"):
        load_config(None, parse_overrides(bench.config_args("grpo", args, ["--run.token_budget=5"])))


def test_a_side_by_side_run_that_fails_says_which_and_where_its_output_is(tmp_path: Path) -> None:
    bench = _module("rl_real_envs")
    folder = tmp_path / "grpo-seed-0"
    message = bench.train_once(["train", "--out", str(tmp_path), "--name", folder.name, "--run.token_budget=5"],
                               folder, threads=1)
    assert message.startswith("grpo-seed-0 failed (exit ") and str(folder.with_suffix(".log")) in message
    assert "run.token_budget" in folder.with_suffix(".log").read_text()
    assert not (folder / "wall.json").exists()


def test_finished_runs_are_read_back_not_rerun(tmp_path: Path) -> None:
    bench = _module("rl_real_envs")
    args = argparse.Namespace(steps=1, budget=1, eval_n=1, eval_every=0, lr={}, jobs=2)
    for method in ("grpo", "tree-grpo"):
        (tmp_path / bench.run_name(method, 0)).mkdir()
        (tmp_path / bench.run_name(method, 0) / "phases.json").write_text("{}")
    # a run started here would fail (there is no such model) and raise SystemExit
    bench.run_pending("TreeSearchQA-v0", str(tmp_path / "no-model"), [("grpo", 0), ("tree-grpo", 0)], args, [], tmp_path)
    with pytest.raises(SystemExit, match="treeopsd-seed-0 failed"):
        bench.run_pending("TreeSearchQA-v0", str(tmp_path / "no-model"), [("grpo", 0), ("treeopsd", 0)], args, [], tmp_path)


def test_the_step_profile_is_each_runs_mean_then_the_range_over_seeds() -> None:
    bench = _module("rl_real_envs")
    rows = [{"method": "grpo", "seed": s, "steps": 2, "metrics": [{"step": 0, "eval_success": 0.1}, *steps]}
            for s, steps in enumerate([[{"step": 1, "adv_abs": 0.1}, {"step": 2, "adv_abs": 0.3}],
                                       [{"step": 1, "adv_abs": 0.5}, {"step": 2, "adv_abs": 0.7}]])]
    profile = bench.step_profile(rows, ["grpo"])["grpo"]
    assert profile["adv_abs"] == pytest.approx([0.2, 0.6]) and profile["steps"] == [2, 2]
    assert "grad_norm" not in profile  # a field no step logged is left out, not reported as 0


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git history")
def test_step_at_commit_unpacks_an_importable_tree_that_wins_over_the_installed_package(tmp_path: Path) -> None:
    import subprocess
    import sys

    bench = _module("step_at_commit")
    site = bench.unpack(ROOT, "HEAD", tmp_path)
    assert (site / "treegym" / "trainers" / "loop.py").is_file() and (site / "treegym" / "envs").is_dir()
    out = subprocess.run([sys.executable, "-c", "import treegym.trainers.loop as m; print(m.__file__)"],
                         env={"PYTHONPATH": str(site), "PATH": ""}, capture_output=True, text=True, check=True,
                         cwd=tmp_path)  # as the child runs: not from the repository root, whose treegym/ would win
    assert Path(out.stdout.strip()).resolve().is_relative_to(site.resolve())
    with pytest.raises(SystemExit, match="cannot read commit 'no-such-rev'"):
        bench.unpack(ROOT, "no-such-rev", tmp_path / "other")


def test_step_at_commit_copies_the_workload_and_not_the_update_settings() -> None:
    fields = _module("step_at_commit").workload(load_config(None, [("sampler.temperature", "0.7")]))
    assert fields["sampler.temperature"] == 0.7 and fields["algo"] == load_config().algo
    assert "optim.micro_batch_size" not in fields and not any(k.startswith("model_opts.") for k in fields)
