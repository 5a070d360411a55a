"""The task-held-out protocol: the split is enforced in code, choices come from selection tasks
alone, and ``treegym study --held-out`` runs end to end on real training runs."""

from __future__ import annotations

import json

import pytest

from treegym.cli import main
from treegym.stats import task_seed_bootstrap
from treegym.study import cli_study
from treegym.study.grid import METHODS, Method
from treegym.study.heldout import (
    Choice,
    HeldOutError,
    Protocol,
    Split,
    choose,
    default_split,
    family_split,
    report_runs,
    require_selection,
    selection_runs,
)

TWO_LRS = ((("optim.lr", 1e-3),), (("optim.lr", 2e-3),))
TINY_METHODS = {"grpo": Method("grpo", "grpo", tune=TWO_LRS), "fork": Method("fork", "tree-grpo", tune=TWO_LRS),
                "treeopsd": Method("treeopsd", "treeopsd", tune=TWO_LRS)}


@pytest.fixture(scope="module")
def split() -> Split:
    return family_split(2, 2, chains=32, max_chain_tokens=8)


def protocol(split: Split, **kw) -> Protocol:
    return Protocol(split=split, candidates=("fork", "treeopsd"), select_seeds=(1000, 1001), report_seeds=(0, 1), **kw)


def record(task: str, method: str, lr: float, seed: int, success: float, phase: str = "select") -> dict:
    return {"key": f"{task}-{method}-{lr}-{seed}", "phase": phase, "task": task, "method": method,
            "setting": {"optim.lr": lr}, "seed": seed, "success_t1": success, "reward_last": 0.5}


def test_the_default_split_is_12_selection_and_12_report_tasks_disjoint_and_the_same_every_time() -> None:
    a, b = default_split(), default_split()
    assert a == b and len(a.selection) == len(a.report) == 12
    assert not {t.name for t in a.selection} & a.report_names
    assert all(t.env == "ProbeTask-v0" for t in (*a.selection, *a.report))


def test_a_task_on_both_sides_of_a_split_is_refused(split: Split) -> None:
    with pytest.raises(HeldOutError, match="both sides"):
        Split(split.selection, (*split.report, split.selection[0]))


def test_selection_runs_use_selection_tasks_and_seeds_only(split: Split) -> None:
    specs = selection_runs(protocol(split), TINY_METHODS)
    assert {s.task.name for s in specs} == {t.name for t in split.selection}
    assert {s.seed for s in specs} == {1000, 1001} and {s.phase for s in specs} == {"select"}
    assert len(specs) == 2 * 3 * 2 * 2  # tasks x methods x settings x seeds


def test_a_report_task_cannot_be_used_by_a_selection_step(split: Split) -> None:
    p = protocol(split)
    leaked = split.report[0].name
    with pytest.raises(HeldOutError, match="report task"):
        require_selection(split, [split.selection[0].name, leaked])
    records = [record(t.name, m, lr, s, 0.5) for t in split.selection for m in p.methods for lr in (1e-3, 2e-3)
               for s in p.select_seeds]
    choose(p, records)  # the selection records alone are fine
    with pytest.raises(HeldOutError, match=leaked):
        choose(p, [*records, record(leaked, "fork", 1e-3, 1000, 1.0)])
    with pytest.raises(HeldOutError, match="another phase"):
        choose(p, [*records[:-1], {**records[-1], "phase": "report"}])


def test_report_runs_need_a_choice_made_on_this_splits_selection_tasks(split: Split) -> None:
    p = protocol(split)
    other = Choice("fork", (("grpo", ()), ("fork", ())), (("fork", 0.1),), ("p999",))
    with pytest.raises(HeldOutError, match="other selection tasks"):
        report_runs(p, other, TINY_METHODS)


def test_choose_tunes_one_setting_per_method_over_all_selection_tasks_and_picks_the_best_mean_delta(split: Split) -> None:
    p = protocol(split)
    s1, s2 = (t.name for t in split.selection)
    success = {  # (method, lr, task) -> success on both seeds
        ("grpo", 1e-3, s1): 0.2, ("grpo", 1e-3, s2): 0.2, ("grpo", 2e-3, s1): 0.5, ("grpo", 2e-3, s2): 0.0,
        ("fork", 1e-3, s1): 0.3, ("fork", 1e-3, s2): 0.3, ("fork", 2e-3, s1): 0.9, ("fork", 2e-3, s2): 0.1,
        ("treeopsd", 1e-3, s1): 0.6, ("treeopsd", 1e-3, s2): 0.1, ("treeopsd", 2e-3, s1): 0.1, ("treeopsd", 2e-3, s2): 0.1,
    }  # fmt: skip
    records = [record(t, m, lr, s, v) for (m, lr, t), v in success.items() for s in p.select_seeds]
    choice = choose(p, records)
    # Means over the selection tasks: grpo 0.2 vs 0.25, fork 0.3 vs 0.5, treeopsd 0.35 vs 0.1.
    assert dict(choice.settings) == {"grpo": (("optim.lr", 2e-3),), "fork": (("optim.lr", 2e-3),),
                                     "treeopsd": (("optim.lr", 1e-3),)}
    assert dict(choice.scores) == pytest.approx({"fork": 0.25, "treeopsd": 0.1})
    assert choice.variant == "fork"
    runs = report_runs(p, choice, TINY_METHODS)
    assert {r.task.name for r in runs} == split.report_names and {r.phase for r in runs} == {"report"}
    assert {r.method.name for r in runs} == {"grpo", "fork"} and {r.seed for r in runs} == {0, 1}
    assert {r.setting for r in runs if r.method.name == "fork"} == {(("optim.lr", 2e-3),)}


def test_the_task_and_seed_bootstrap_is_wider_when_tasks_disagree() -> None:
    agree = task_seed_bootstrap([[0.1, 0.2, 0.15, 0.12]] * 6)
    disagree = task_seed_bootstrap([[0.5, 0.6, 0.55, 0.52], [-0.3, -0.2, -0.25, -0.28]] * 3)
    assert agree.low < agree.mean < agree.high and agree.low > 0
    assert disagree.low < 0 < disagree.high
    assert disagree.high - disagree.low > agree.high - agree.low


def test_held_out_study_runs_end_to_end_and_reports_each_report_task(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cli_study, "family_split", lambda n, m, **kw: family_split(n, m, chains=32, max_chain_tokens=4))
    one_lr = TWO_LRS[1:]
    monkeypatch.setitem(METHODS, "grpo", Method("grpo", "grpo", tune=one_lr))
    monkeypatch.setitem(METHODS, "fork", Method("fork", "tree-grpo", METHODS["fork"].overrides, tune=one_lr))
    args = ["study", "--held-out", "--quick", "--split", "1,1", "--out", str(tmp_path), "--seeds", "2", "--workers", "2",
            "--quiet"]
    assert main(args) == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert not [r for r in records if "error" in r], records
    selection = [r for r in records if r["phase"] == "select"]
    report = [r for r in records if r["phase"] == "report"]
    assert len(selection) == 1 * 2 * 1 * 1 and len(report) == 1 * 2 * 2  # tasks x methods x settings x seeds
    assert not {r["task"] for r in selection} & {r["task"] for r in report}
    text = (tmp_path / "report.md").read_text()
    assert "## The claim (report tasks" in text and "aggregate Δ vs grpo" in text
    assert f"| {report[0]['task']} |" in text and "## Diagnostics" in text
    assert "| Δ fork with | Δ fork without |" in text  # the property table, per reported method
    assert main(args) == 0  # a rerun reuses every run
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == len(records)


def test_held_out_arguments_are_checked(tmp_path, capsys) -> None:
    assert main(["study", "--held-out", "--out", str(tmp_path), "--tasks", "lock"]) == 2
    assert "--split" in capsys.readouterr().err
    assert main(["study", "--held-out", "--out", str(tmp_path), "--budgets", "2,4"]) == 2
    assert main(["study", "--held-out", "--out", str(tmp_path), "--methods", "fork"]) == 2


def test_treeopsd_is_reported_beside_the_choice_whenever_it_is_among_the_methods() -> None:
    from treegym.cli import build_parser

    def also(*argv: str) -> tuple[str, ...]:
        return cli_study.protocol_from_args(build_parser().parse_args(["study", "--held-out", *argv])).also

    assert also() == ("treeopsd",)
    assert also("--quick", "--methods", "grpo,fork,treeopsd") == ("treeopsd",)
    assert also("--methods", "grpo,fork") == () and also("--quick") == ()
