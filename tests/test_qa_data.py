"""The built-in QA set: every answer follows from its supporting passages; splits and ids are stable."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict

import pytest

from treegym.errors import ConfigError
from treegym.paths import cache_dir
from treegym.retrieval_index.corpus import wiki_documents
from treegym.retrieval_index.qa import (
    GENERATOR_VERSION,
    QUESTION_TYPES,
    SPLITS,
    generate,
    load_qa,
    source_hash,
    split_of,
    wiki_questions,
)


@pytest.fixture(scope="module")
def docs():
    return {d.id: d for d in wiki_documents()}


@pytest.fixture(scope="module")
def items():
    return wiki_questions()


def _years_in_last_parenthesis(description: str) -> list[tuple[int, str]]:
    """An independent reading of the life span: every year in the closing "(…)", with its offset."""
    start = description.rindex("(")
    return [(start + m.start(), m.group()) for m in re.finditer(r"\d{3,4}", description[start:])]


def _life(doc) -> tuple[int, int | None]:
    years = _years_in_last_parenthesis(doc.description)
    birth = int(years[0][1])
    death = int(years[1][1]) if len(years) > 1 else None
    return birth, death


def test_every_answer_derives_from_its_supporting_passages(items, docs):
    checked = Counter()
    by_description = Counter(d.description.strip().lower() for d in docs.values())
    for it in items:
        support = [docs[i] for i in it.supporting_ids]
        assert it.hops == len(support) == (2 if it.type in ("born_first", "lived_longer") else 1), it.id
        if it.type == "identify":
            (doc,) = support
            assert it.answers[0] == doc.title, it.id
            assert f'"{doc.description.strip()}"' in it.question, it.id
            assert by_description[doc.description.strip().lower()] == 1, f"{it.id}: description is shared"
        elif it.type in ("birth_year", "death_year"):
            (doc,) = support
            assert doc.topic == "People" and doc.title in it.question, it.id
            years = _years_in_last_parenthesis(doc.description)
            offset, year = years[0] if it.type == "birth_year" else years[1]
            assert it.answers == (year,), it.id
            # The year sits where the parser found it: right after "(" / "(born " / "(c. ", or after the dash.
            before = doc.description[:offset]
            assert re.search(r"\((born |c\. ?)?$" if it.type == "birth_year" else r"[–-] ?(c\. ?)?$", before), it.id
        else:
            a, b = support
            assert {a.title, b.title} == set(re.findall(r"(?:first|longer), (.+?) or (.+)\?$", it.question)[0]), it.id
            (ba, da), (bb, db) = _life(a), _life(b)
            if it.type == "born_first":
                assert ba != bb, it.id
                expected = a if ba < bb else b
            else:
                assert da is not None and db is not None and abs((da - ba) - (db - bb)) >= 2, it.id
                expected = a if da - ba > db - bb else b
            assert it.answers[0] == expected.title, it.id
            assert "c." not in a.description and "c." not in b.description, it.id  # no circa years in comparisons
        checked[it.type] += 1
    assert sum(checked.values()) == len(items)
    print("derivation checked:", dict(checked))


def test_answer_aliases_are_the_title_and_its_bare_form(items, docs):
    ural = next(it for it in items if it.answers[0].endswith(")"))
    assert ural.answers[1] == re.sub(r"\s*\([^()]*\)$", "", ural.answers[0])


def test_identify_questions_do_not_quote_a_description_that_names_the_title(items, docs):
    for it in items:
        if it.type == "identify":
            title_words = {w for w in re.findall(r"\w{3,}", it.answers[-1].lower())} - {"the", "and"}
            quoted = it.question.split('"')[1].lower()
            assert not title_words & set(re.findall(r"\w+", quoted)), it.id


def test_regeneration_is_byte_identical_to_the_cached_set(items):
    fresh = generate(wiki_documents())
    dump = lambda xs: "\n".join(json.dumps(asdict(x), ensure_ascii=False) for x in xs)  # noqa: E731
    assert dump(fresh) == dump(items)
    assert load_qa("wiki", "dev") == load_qa("wiki", "dev")


def test_splits_are_disjoint_and_cover_everything(items):
    by_split = {s: {it.id for it in load_qa("wiki", s)} for s in SPLITS}
    assert not (by_split["train"] & by_split["dev"]) and not (by_split["train"] & by_split["test"])
    assert not by_split["dev"] & by_split["test"]
    assert set().union(*by_split.values()) == {it.id for it in items}
    assert len({it.id for it in items}) == len(items)
    share = {s: len(ids) / len(items) for s, ids in by_split.items()}
    assert 0.77 < share["train"] < 0.83 and 0.08 < share["dev"] < 0.12 and 0.08 < share["test"] < 0.12
    assert all(it.split == split_of(it.id) for it in items)


def test_every_type_is_well_represented_in_every_split(items):
    counts = Counter((it.split, it.type) for it in items)
    print("\n" + "\n".join(f"{s:5} " + " ".join(f"{t}={counts[s, t]}" for t in QUESTION_TYPES) for s in SPLITS))
    for split in SPLITS:
        for qtype in QUESTION_TYPES:
            assert counts[split, qtype] >= (50 if split != "train" else 500), (split, qtype)


def test_ids_name_their_type_and_documents(items):
    for it in items[:: max(1, len(items) // 500)]:
        assert it.id == "-".join([it.type, *sorted(it.supporting_ids)])


def test_load_qa_filters_by_type():
    items = load_qa("wiki", "dev", types=["born_first", "death_year"])
    assert {it.type for it in items} == {"born_first", "death_year"}


@pytest.mark.parametrize(
    ("kwargs", "listed"),
    [
        ({"split": "validation"}, "train, dev, test"),
        ({"types": ["capital_of"]}, "identify, birth_year"),
        ({"name": "squad"}, "'wiki'"),
    ],
)
def test_bad_names_splits_and_types_list_the_valid_ones(kwargs, listed):
    with pytest.raises(ConfigError, match=listed):
        load_qa(**kwargs)


def test_a_damaged_cache_file_is_rebuilt(tmp_path, monkeypatch, items):
    real = cache_dir("datasets") / f"wiki-qa-v{GENERATOR_VERSION}-{source_hash(wiki_documents())[:16]}.jsonl"
    cache = tmp_path / "datasets" / real.name
    cache.parent.mkdir()
    cache.write_text(real.read_text(encoding="utf-8")[:5000], encoding="utf-8")  # cut mid-record
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path))
    assert wiki_questions.__wrapped__() == items
    assert cache.read_text(encoding="utf-8") == real.read_text(encoding="utf-8")
