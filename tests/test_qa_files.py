"""Reading Search-R1 parquet and FlashRAG JSONL QA files (written here in those formats), and writing ours."""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from treegym.errors import ConfigError, MissingPackageError
from treegym.retrieval_index.qa import load_qa
from treegym.retrieval_index.qa_files import (
    SEARCH_R1_PROMPT,
    QADataError,
    write_flashrag_jsonl,
    write_search_r1_parquet,
)


def _search_r1_row(i: int, question: str, answers: list[str], source: str = "nq") -> dict:
    """A row as Search-R1's data_process/nq_search.py writes it (FlashRAG columns kept)."""
    return {
        "id": f"train_{i}",
        "question": question,
        "golden_answers": answers,
        "data_source": source,
        "prompt": [{"role": "user", "content": SEARCH_R1_PROMPT.format(question=question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": "train", "index": i},
    }


def test_search_r1_parquet_reads_questions_answers_and_source(tmp_path):
    path = tmp_path / "train.parquet"
    rows = [
        _search_r1_row(0, "total number of death row inmates in the us?", ["2,718"]),
        _search_r1_row(1, "who sings love will keep us alive by the eagles?", ["Timothy B. Schmit"], "hotpotqa"),
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    items = load_qa(str(path), split="train")
    assert [it.question for it in items] == [r["question"] for r in rows]
    assert items[1].answers == ("Timothy B. Schmit",) and items[1].source == "hotpotqa" and items[1].id == "train_1"
    assert load_qa(str(path), types=["open"]) == items


def test_search_r1_parquet_without_flashrag_columns_falls_back_to_prompt_and_reward_model(tmp_path):
    path = tmp_path / "nq_only_prompt.parquet"
    row = _search_r1_row(7, "where is the eiffel tower?", ["Paris", "Paris, France"])
    for column in ("id", "question", "golden_answers"):
        del row[column]
    pq.write_table(pa.Table.from_pylist([row]), path)
    (item,) = load_qa(str(path), split="test")
    assert item.question == "where is the eiffel tower?"
    assert item.answers == ("Paris", "Paris, France")
    assert (item.id, item.split, item.source) == ("nq_only_prompt-7", "test", "nq")


def test_parquet_row_without_answers_is_an_error_naming_file_and_row(tmp_path):
    path = tmp_path / "bad.parquet"
    good = _search_r1_row(0, "q0?", ["a"])
    bad = {"question": "q1?", "data_source": "nq"}
    pq.write_table(pa.Table.from_pylist([good, {**{k: None for k in good}, **bad}]), path)
    with pytest.raises(QADataError, match=r"bad\.parquet: row 1: needs"):
        load_qa(str(path))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("broken.parquet", b"PAR1 this is not a parquet file", "broken.parquet: not a readable parquet file"),
        ("data.jsonl", b"\xff\xfe\x00garbage", "not UTF-8"),
    ],
)
def test_a_file_that_cannot_be_read_as_its_format_is_a_clear_error(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(QADataError, match=message):
        load_qa(str(path))


def test_flashrag_jsonl_reads_questions_answers_and_ids(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_text(
        json.dumps({"id": "dev_0", "question": "who got the first nobel prize in physics?", "golden_answers": ["Wilhelm Conrad Röntgen"]}, ensure_ascii=False)
        + "\n\n"
        + json.dumps({"question": "when was the last time anyone was on the moon?", "golden_answers": ["14 December 1972 UTC", "December 1972"]})
        + "\n",
        encoding="utf-8",
    )
    items = load_qa(str(path), split="dev")
    assert items[0].answers == ("Wilhelm Conrad Röntgen",) and items[0].id == "dev_0"
    assert items[1].id == "dev-3" and items[1].answers[1] == "December 1972"
    assert {it.split for it in items} == {"dev"} and {it.source for it in items} == {"dev"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "q?", "golden_answers": ["a"]', "not valid JSON"),
        ('{"question": "q?"}', 'needs "question" and "golden_answers"'),
        ('{"question": "q?", "golden_answers": []}', "non-empty list"),
        ('{"question": "", "golden_answers": ["a"]}', "non-empty string"),
    ],
)
def test_malformed_jsonl_line_is_an_error_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "data.jsonl"
    good = json.dumps({"question": "q?", "golden_answers": ["a"]})
    path.write_text(f"{good}\n{good}\n{line}\n", encoding="utf-8")
    with pytest.raises(QADataError, match=rf"data\.jsonl:3: .*{message}"):
        load_qa(str(path))


def test_unknown_extension_and_type_are_config_errors(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("question,answer\n")
    with pytest.raises(ConfigError, match=r"\.parquet .*\.jsonl"):
        load_qa(str(path))
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(json.dumps({"question": "q?", "golden_answers": ["a"]}) + "\n")
    with pytest.raises(ConfigError, match="valid types: open"):
        load_qa(str(jsonl), types=["identify"])


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_exported_wiki_split_reads_back_identically(tmp_path, suffix):
    items = load_qa("wiki", "dev")[:40]
    path = tmp_path / f"dev.{suffix}"
    if suffix == "jsonl":
        write_flashrag_jsonl(items, path)
    else:
        write_search_r1_parquet(items, path, SEARCH_R1_PROMPT)
        table = pq.read_table(path)
        assert {"question", "golden_answers", "data_source", "prompt", "reward_model"} <= set(table.column_names)
        prompt = table.column("prompt")[0].as_py()[0]["content"]
        assert prompt.startswith("Answer the given question.") and prompt.rstrip().endswith(items[0].question)
    assert load_qa(str(path), split="dev") == items


def test_missing_pyarrow_names_the_package(tmp_path, monkeypatch):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingPackageError, match="'pyarrow'"):
        load_qa(str(path))
