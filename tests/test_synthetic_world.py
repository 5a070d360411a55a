"""The synthetic multi-hop world: determinism, names, passages, questions, oracle, CLI, errors."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from treegym.cli import main
from treegym.errors import ConfigError
from treegym.retrieval_index import open_retriever
from treegym.retrieval_index.corpus import read_jsonl
from treegym.retrieval_index.synthetic import FAMILIES, TEMPLATES, plan_world, synthetic_world, write_world
from treegym.retrieval_index.synthetic.oracle import ChainOracle, evaluate_oracle, parse_question
from treegym.retrieval_index.synthetic.passages import RELATIONS, entity_passage, iter_passages
from treegym.retrieval_index.synthetic.questions import iter_questions
from treegym.retrieval_index.synthetic.world import KINDS
from treegym.retrieval_index.synthetic.writer import read_questions


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2,000-passage world, unvalidated, so tests see every generated question."""
    out = tmp_path_factory.mktemp("world")
    write_world(out, 2000, seed=0, validate="none", progress=False)
    return out


def test_same_seed_gives_same_bytes_and_another_seed_does_not(tmp_path: Path, small: Path) -> None:
    again = tmp_path / "again"
    write_world(again, 2000, seed=0, validate="none", progress=False)
    for name in ("corpus.jsonl", "questions.jsonl", "manifest.json"):
        assert _sha(again / name) == _sha(small / name)
    other = tmp_path / "other"
    write_world(other, 2000, seed=1, validate="none", progress=False)
    assert _sha(other / "corpus.jsonl") != _sha(small / "corpus.jsonl")
    manifest = json.loads((small / "manifest.json").read_text())
    assert manifest["corpus_sha256"] == _sha(small / "corpus.jsonl")


def test_names_are_unique_pronounceable_and_distractors_are_one_letter_away() -> None:
    world = plan_world(4000, seed=5)
    names, twins = [], 0
    for kind, count in world.counts:
        for i in range(count):
            entity = world.entity(kind, i)
            names.append(entity.name)
            word = entity.name.split()[-1] if kind == "person" else entity.name
            if entity.twin is None and kind in ("city", "country"):
                assert re.fullmatch(r"(?:[bdfgklmnprstvz][aeiou])+[nrsl]?", word.lower()), word
            if entity.twin is not None:
                twins += 1
                twin = world.entity(kind, entity.twin).name
                assert len(entity.name) == len(twin) + 1
                assert any(entity.name[:j] + entity.name[j + 1 :] == twin for j in range(len(entity.name)))
    assert len(names) == len(set(names)) == world.entities
    assert twins >= world.entities // 12


@pytest.mark.parametrize("passages", [100, 401])
def test_corpus_has_exactly_n_unique_records_two_per_entity(tmp_path: Path, passages: int) -> None:
    write_world(tmp_path, passages, seed=2, validate="none", progress=False)
    lines = (tmp_path / "corpus.jsonl").read_text().splitlines()
    assert len(lines) == passages
    assert all(set(json.loads(line)) == {"id", "contents"} for line in lines)
    docs = list(read_jsonl(tmp_path / "corpus.jsonl"))
    assert len({d.id for d in docs}) == passages
    world = plan_world(passages, seed=2)
    titles = [d.title for d in docs[: world.entities * 2]]
    assert all(titles[i] == titles[i + 1] for i in range(0, len(titles), 2))


def test_facts_are_spread_over_both_passages_of_an_entity() -> None:
    world = plan_world(2000, seed=0)
    for person in range(20):
        first, second = (entity_passage(world, "person", person, part) for part in (0, 1))
        city = world.entity("city", world.relation("born_in", "person", person)).name
        org = world.entity("org", world.relation("member_of", "person", person)).name
        assert RELATIONS["born_in"].extract(first.text) == city
        assert RELATIONS["born_in"].extract(second.text) is None
        assert RELATIONS["member_of"].extract(second.text) == org
        assert RELATIONS["death_year"].extract(second.text) == str(world.relation("death_year", "person", person))


def test_every_question_has_aliases_a_gold_chain_and_its_hop_count(small: Path) -> None:
    passages = {d.id: d for d in read_jsonl(small / "corpus.jsonl")}
    items = list(read_questions(small / "questions.jsonl"))
    assert {q.type for q in items} == set(FAMILIES)
    assert {q.hops for q in items} == {1, 2, 3, 4}
    assert {q.split for q in items} == {"train", "dev", "test"}
    for q in items:
        assert q.answers and all(q.answers)
        assert len(q.supporting_ids) == q.hops and all(i in passages for i in q.supporting_ids)
        if q.type != "comparison":
            # the last hop's passage states the answer
            assert q.answers[0] in passages[q.supporting_ids[-1]].text
        else:
            assert q.answers[0] in q.question


def test_each_hop_of_a_chain_names_the_entity_the_next_passage_is_about(small: Path) -> None:
    passages = {d.id: d for d in read_jsonl(small / "corpus.jsonl")}
    for q in read_questions(small / "questions.jsonl"):
        if q.type == "comparison":
            continue
        chain = [passages[i] for i in q.supporting_ids]
        assert chain[0].title in q.question
        for here, nxt in zip(chain, chain[1:]):
            assert nxt.title in here.text


def test_held_out_templates_appear_only_in_test() -> None:
    world = plan_world(2000, seed=0)
    held = ("chain/director_birth_capital", "bridge/director_birth_year")
    items = [q for q in iter_questions(world, 600, holdout=held)]
    held_items = [q for q in items if q.template in held]
    assert held_items and all(q.item.split == "test" for q in held_items)
    assert {q.item.split for q in items if q.template not in held} == {"train", "dev", "test"}


def test_questions_can_be_restricted_to_families_and_hops() -> None:
    world = plan_world(2000, seed=0)
    items = [q.item for q in iter_questions(world, 100, families=["chain"], hops=[4])]
    assert len(items) == 100 and {(q.type, q.hops) for q in items} == {("chain", 4)}


def test_oracle_parses_every_template_back_to_itself() -> None:
    world = plan_world(2000, seed=0)
    seen = set()
    for q in iter_questions(world, 1000):
        template, _slots = parse_question(q.item.question)
        assert template.id == q.template
        seen.add(template.id)
    assert seen == {t.id for t in TEMPLATES}


def test_oracle_answers_through_bm25_without_reading_gold_ids(small: Path) -> None:
    retriever = open_retriever(str(small / "corpus.jsonl"), "bm25", progress=False)
    items = [replace(q, supporting_ids=()) for q in read_questions(small / "questions.jsonl")]
    report = evaluate_oracle(retriever, items, k=3, name="bm25")
    assert report.em >= 0.95
    assert all(em >= 0.95 for em, _n in report.em_by("hops").values())


def test_oracle_fails_when_the_index_holds_another_world(tmp_path: Path, small: Path) -> None:
    write_world(tmp_path, 2000, seed=9, validate="none", questions=1, progress=False)
    retriever = open_retriever(str(tmp_path / "corpus.jsonl"), "bm25", progress=False)
    items = list(read_questions(small / "questions.jsonl"))[:200]
    answers = ChainOracle(retriever, k=3).answer(items)
    assert sum(a.correct for a in answers) <= 0.05 * len(items)
    assert all(a.stuck for a in answers if not a.correct)


def test_validation_drops_what_the_oracle_cannot_answer(tmp_path: Path) -> None:
    manifest = write_world(tmp_path, 2000, seed=0, validate="bm25", k=1, progress=False)
    assert manifest.validation["dropped"] > 0
    assert manifest.questions == manifest.validation["generated"] - manifest.validation["dropped"]
    retriever = open_retriever(str(tmp_path / "corpus.jsonl"), "bm25", progress=False)
    kept = list(read_questions(tmp_path / "questions.jsonl"))
    assert len(kept) == manifest.questions
    assert evaluate_oracle(retriever, kept, k=1).em == 1.0


def test_oracle_reaches_target_with_hybrid_retrieval_at_k3() -> None:
    world = synthetic_world(passages=300, seed=0)
    retriever = open_retriever(str(world.corpus_path), "hybrid", progress=False)
    report = evaluate_oracle(retriever, world.questions("all"), k=3, name="hybrid")
    assert len(report.answers) >= 120
    assert report.em >= 0.95, report.table()


def test_synthetic_world_is_generated_once_and_filters_by_split_and_hops() -> None:
    world = synthetic_world(passages=300, seed=4, hops=2)
    stamp = world.questions_path.stat().st_mtime_ns
    again = synthetic_world(passages=300, seed=4, hops=2)
    assert again.questions_path.stat().st_mtime_ns == stamp
    train = world.questions("train")
    assert train and all(q.hops == 2 and q.split == "train" for q in train)
    assert world.questions("test", hops=3) == []
    assert world.manifest.validation["retriever"] == "bm25"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"passages": 50}, "between 100 and"),
        ({"passages": 2000, "families": ["trivia"]}, "valid families: single, bridge"),
        ({"passages": 2000, "hops": [5]}, "between 1 and 4 hops"),
        ({"passages": 2000, "families": ["comparison"], "hops": [3]}, "valid (family, hops) pairs"),
        ({"passages": 2000, "holdout": ["chain/nope"]}, "valid: single/director"),
        ({"passages": 2000, "validate": "grep"}, "choose auto or one of none, bm25"),
    ],
)
def test_bad_generator_arguments_say_the_valid_range(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        write_world(tmp_path / "w", progress=False, **kwargs)
    assert not (tmp_path / "w" / "corpus.jsonl").exists()


def test_synthetic_world_rejects_hops_outside_one_to_four() -> None:
    with pytest.raises(ConfigError, match="between 1 and 4"):
        synthetic_world(passages=300, hops=5)


def test_cli_synth_writes_a_world_and_reports_bad_input_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w"
    code = main(["data", "synth", "--passages", "300", "--seed", "1", "--out", str(out), "--no-progress",
                 "--hops", "3", "4", "--validate", "none"])
    assert code == 0
    assert {p.name for p in out.iterdir()} >= {"corpus.jsonl", "questions.jsonl", "manifest.json"}
    assert {q.hops for q in read_questions(out / "questions.jsonl")} == {3, 4}
    assert "treegym index build --corpus" in capsys.readouterr().out
    code = main(["data", "synth", "--passages", "10", "--out", str(tmp_path / "bad"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "between 100 and" in err and "Traceback" not in err


def test_world_kinds_cover_the_issue_entity_types() -> None:
    world = plan_world(2000, seed=0)
    assert [k for k, _ in world.counts] == list(KINDS)
    kinds = {world.entity("work", i).subkind for i in range(world.count("work"))}
    assert kinds == {"film", "book", "album"}
    assert sum(1 for _ in iter_passages(world)) == 2000
