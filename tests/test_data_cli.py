"""``treegym data``: stats, show and export through the real command line entry point."""

from __future__ import annotations

import pyarrow.parquet as pq

from treegym.cli import main
from treegym.retrieval_index.qa import load_qa


def test_stats_prints_counts_per_split_and_type(capsys):
    assert main(["data", "stats"]) == 0
    out = capsys.readouterr().out.splitlines()
    header, rows = out[0].split(), {line.split()[0]: line.split()[1:] for line in out[1:]}
    assert header[:3] == ["split", "identify", "birth_year"] and header[-1] == "total"
    dev = load_qa("wiki", "dev")
    assert int(rows["dev"][-1]) == len(dev)
    assert int(rows["dev"][header.index("born_first") - 1]) == sum(it.type == "born_first" for it in dev)


def test_show_prints_questions_answers_and_supporting_titles(capsys):
    assert main(["data", "show", "--split", "dev", "-n", "2", "--types", "lived_longer"]) == 0
    out = capsys.readouterr().out
    first = load_qa("wiki", "dev", types=["lived_longer"])[0]
    assert first.question in out and first.answers[0] in out and out.count("Q: ") == 2


def test_export_writes_a_search_r1_parquet_that_loads_back(tmp_path, capsys):
    out = tmp_path / "dev.parquet"
    assert main(["data", "export", "--split", "dev", "--format", "parquet", "--out", str(out)]) == 0
    assert pq.read_table(out).num_rows == len(load_qa("wiki", "dev"))
    assert load_qa(str(out), split="dev") == load_qa("wiki", "dev")


def test_bad_split_is_a_one_line_error_not_a_traceback(tmp_path, capsys):
    assert main(["data", "export", "--split", "validation", "--out", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "valid splits: train, dev, test" in err and "Traceback" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_data_without_an_action_prints_help(capsys):
    assert main(["data"]) == 0
    assert "export" in capsys.readouterr().out
