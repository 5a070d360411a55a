"""``treegym study`` end to end on a tiny grid: real training runs, the results file, report.md."""

from __future__ import annotations

import json

import pytest

from treegym.cli import main
from treegym.study import grid as study_grid
from treegym.study.report import bootstrap_ci, choose_settings, paired


@pytest.fixture
def tiny_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-turn lock with one-token turns and a short budget; two tuning settings per method."""
    monkeypatch.setitem(study_grid.TASKS, "tiny", study_grid.Task("tiny", "ProbeLock-v0", 2, 2, 1, chains=48))
    tune = ((("optim.lr", 1e-3),), (("optim.lr", 3e-3),))
    for name in ("grpo", "tree-grpo"):
        monkeypatch.setitem(study_grid.METHODS, name, study_grid.Method(name, name, tune=tune))


def test_study_runs_resumes_and_writes_the_report(tiny_grid: None, tmp_path, capsys) -> None:
    args = ["study", "--out", str(tmp_path), "--tasks", "tiny", "--methods", "grpo,tree-grpo", "--budgets", "2",
            "--seeds", "2", "--tune-seeds", "1", "--no-ablations", "--extra-tasks", "", "--workers", "2", "--quiet"]
    assert main(args) == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert not [r for r in records if "error" in r], records
    assert len(records) == 2 * 2 + 2 * 2  # 2 methods x 2 settings x 1 tuning seed; 2 methods x 2 report seeds
    report = [r for r in records if r["phase"] == "report"]
    assert {r["seed"] for r in report} == {0, 1} and all(r["tokens"] >= 48 * 2 for r in report)
    assert all(len(r["curve"]) >= 2 and 0.0 <= r["success_t1"] <= 1.0 for r in report)
    text = (tmp_path / "report.md").read_text()
    assert "| tiny | 2 | tree-grpo | 2 |" in text and "Δ vs grpo" in text and "**yes**" in text
    assert (tmp_path / "success_vs_tokens.png").stat().st_size > 0
    assert (tmp_path / "success_vs_tool_calls.png").stat().st_size > 0
    assert "Δ at equal trainer tokens" in text and "| learnt | collapsed |" in text and "## Diagnostics" in text
    assert all({"tokens", "tool_calls", "trainer_tokens", "modelled_seconds"} <= set(r["currency_curve"][-1])
               for r in report)
    assert (tmp_path / "success_vs_budget.png").stat().st_size > 0

    # A rerun finds every run in the results file and trains nothing.
    assert main(args) == 0
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == len(records)


def test_bad_study_arguments_are_one_line_errors(tmp_path, capsys) -> None:
    assert main(["study", "--out", str(tmp_path), "--methods", "tree-grpo"]) == 2
    assert "keep grpo" in capsys.readouterr().err
    assert main(["study", "--out", str(tmp_path), "--budgets", "3"]) == 2
    with pytest.raises(SystemExit):
        main(["study", "--tasks", "nope"])


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_more_seeds() -> None:
    m, lo, hi = bootstrap_ci([0.0, 1.0] * 4)
    assert lo < m == 0.5 < hi
    _, lo2, hi2 = bootstrap_ci([0.0, 1.0] * 32)
    assert hi2 - lo2 < hi - lo
    d, dlo, dhi, n = paired({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.9})
    assert n == 3 and d == pytest.approx(0.4) and dlo == pytest.approx(0.4) and dhi == pytest.approx(0.4)


def test_tuning_counts_collapsed_seeds_against_a_setting() -> None:
    rec = lambda lr, s, last: {"task": "t", "method": "a", "setting": {"optim.lr": lr}, "success_t1": s,  # noqa: E731
                               "reward_last": last}
    # lr 1: one seed learns (0.9), four collapse (0.0 reward at the end); lr 2: all move a little.
    records = [rec(1, 0.9, 0.8)] + [rec(1, 0.05, 0.0)] * 4 + [rec(2, 0.3, 0.2)] * 5
    assert choose_settings(records) == {"t": {"a": {"optim.lr": 2}}}


def test_success_at_equal_spend_reads_each_run_between_its_evaluations() -> None:
    from treegym.study.report import at_equal_spend, success_at

    def run(seed: int, xs: list[int], ys: list[float]) -> dict:
        return {"seed": seed, "currency_curve": [{"tool_calls": x, "success_t1": y} for x, y in zip(xs, ys)]}

    assert success_at(run(0, [0, 10], [0.0, 1.0]), "tool_calls", 5) == pytest.approx(0.5)
    a = [run(0, [0, 10, 20], [0.0, 0.5, 1.0]), run(1, [0, 10, 20], [0.0, 1.0, 1.0])]
    b = [run(0, [0, 40], [0.0, 1.0]), run(1, [0, 40], [0.0, 0.5])]
    x, (d, lo, hi, n) = at_equal_spend(a, b, "tool_calls")
    assert x == 20 and n == 2  # the least any run reached
    assert d == pytest.approx(((1.0 - 0.5) + (1.0 - 0.25)) / 2)


def test_tuning_picks_each_methods_best_setting_per_task() -> None:
    rec = lambda m, lr, s: {"task": "t", "method": m, "setting": {"optim.lr": lr}, "success_t1": s}  # noqa: E731
    chosen = choose_settings([rec("a", 1, 0.2), rec("a", 1, 0.4), rec("a", 2, 0.5), rec("a", 2, 0.0),
                              rec("b", 1, 0.1), rec("b", 2, 0.3)])
    assert chosen == {"t": {"a": {"optim.lr": 1}, "b": {"optim.lr": 2}}}
