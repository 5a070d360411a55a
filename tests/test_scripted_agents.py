"""The scripted QA agents on real passages of the built-in corpus, in the env's own observation format."""

from __future__ import annotations

import dataclasses
import random

import gymnasium as gym
import pytest

import treegym  # noqa: F401  (registers the envs)
from treegym.agents.rollout.episode import run_episode
from treegym.agents.scripted import (
    GIVE_UP,
    HeuristicQAAgent,
    OracleQAAgent,
    classify,
    life_years,
    parse_information,
)
from treegym.envs.react import format_information
from treegym.retrieval_index.corpus import wiki_documents
from treegym.retrieval_index.qa import QUESTION_TYPES, load_qa
from treegym.retrieval_index.qa_files import SEARCH_R1_PROMPT
from treegym.retrieval_index.scoring import exact_match
from treegym.retrieval_index.types import Hit


@pytest.fixture(scope="module")
def docs():
    return {d.id: d for d in wiki_documents()}


@pytest.fixture(scope="module")
def by_title(docs):
    return {d.title: d for d in docs.values()}


def observation(*documents) -> str:
    """What TreeSearchQA-v0 appends after a search that returned these passages."""
    return format_information([Hit(d.id, d.title, d.text, 1.0) for d in documents])


def answer_of(action: str) -> str | None:
    if "<answer>" not in action:
        return None
    return action.split("<answer>", 1)[1].split("</answer>", 1)[0].strip()


def search_of(action: str) -> str | None:
    if "<search>" not in action:
        return None
    return action.split("<search>", 1)[1].split("</search>", 1)[0].strip()


def play(agent, question: str, results: list[list], info: dict | None = None) -> tuple[list[str], str | None]:
    """Drive an agent by hand: each search gets the next list of passages; returns (searches, answer)."""
    if info is not None:
        agent.begin(info)
    messages = [{"role": "user", "content": SEARCH_R1_PROMPT.format(question=question)}]
    searches: list[str] = []
    for _ in range(len(results) + 2):
        action = agent.act(messages)
        messages.append({"role": "assistant", "content": action})
        if (answer := answer_of(action)) is not None:
            return searches, answer
        searches.append(search_of(action))
        batch = results[len(searches) - 1] if len(searches) <= len(results) else []
        messages.append({"role": "user", "content": observation(*batch)})
    return searches, None


def test_information_blocks_parse_back_to_the_real_passages(docs):
    picked = [d for d in docs.values() if d.title.endswith(")")][:2] + [docs["wiki-00000"]]
    parsed = parse_information(observation(*picked))
    assert [(p.rank, p.title, p.text) for p in parsed] == [(i, d.title, d.text) for i, d in enumerate(picked, 1)]


def test_every_built_in_question_type_is_recognised_with_its_entities(docs):
    for qtype in QUESTION_TYPES:
        for item in load_qa("wiki", "dev", types=[qtype])[:50]:
            got, slots = classify(item.question)
            assert got == qtype, item.question
            titles = {docs[i].title for i in item.supporting_ids}
            if qtype == "identify":
                assert slots["desc"] == docs[item.supporting_ids[0]].description.strip()
            else:
                assert set(slots.values()) == titles, item.question


def test_life_years_read_the_span_after_the_name_not_a_later_era(by_title):
    assert life_years(by_title["Ivan Turgenev"].text) == (1818, 1883)
    assert life_years(by_title["Amedeo Avogadro"].text) == (1776, 1856)  # full dates, with a pronunciation
    assert life_years(by_title["Oliver Cromwell"].text) == (1599, 1658)  # the description's span
    assert life_years("Oliver Cromwell was a statesman. After his death in September 1658 ...") == (None, 1658)
    assert life_years("Writer (born 1945). Jane Doe is a novelist.") == (1945, None)
    assert life_years("C. S. Lewis was a writer. The Inklings (1925–1954) met in Oxford.") == (None, None)


def test_heuristic_answers_a_year_from_the_entity_passage_not_a_neighbour(by_title):
    agent = HeuristicQAAgent()
    distractor, person = by_title["Hafez"], by_title["Ivan Turgenev"]
    searches, answer = play(agent, "In what year was Ivan Turgenev born?", [[distractor, person]])
    assert searches == ["Ivan Turgenev"] and answer == "1818"
    _, answer = play(agent, "In what year did Ivan Turgenev die?", [[distractor, person]])
    assert answer == "1883"


def test_heuristic_compares_two_people_with_two_searches(by_title):
    agent = HeuristicQAAgent()
    a, b = by_title["Ferdowsi"], by_title["Omar Khayyam"]  # 940–1025 and 1048–1131
    searches, answer = play(agent, "Who was born first, Omar Khayyam or Ferdowsi?", [[b], [a]])
    assert searches == ["Omar Khayyam", "Ferdowsi"] and answer == "Ferdowsi"
    hafez, tusi = by_title["Hafez"], by_title["Nasir al-Din al-Tusi"]  # 65 and 73 years
    _, answer = play(agent, "Who lived longer, Hafez or Nasir al-Din al-Tusi?", [[hafez], [tusi]])
    assert answer == "Nasir al-Din al-Tusi"


def test_heuristic_identifies_the_passage_that_matches_a_description(docs):
    agent = HeuristicQAAgent()
    items = load_qa("wiki", "dev", types=["identify"])[:60]
    rng = random.Random(0)
    others = list(docs.values())
    correct = 0
    for item in items:
        gold = docs[item.supporting_ids[0]]
        # The gold passage at rank 2, between two random passages.
        searches, answer = play(agent, item.question, [[rng.choice(others), gold, rng.choice(others)]])
        assert searches == [classify(item.question)[1]["desc"]]
        correct += exact_match(answer, item.answers)
    assert correct / len(items) >= 0.7, correct


def test_heuristic_gives_up_with_a_guess_when_nothing_useful_comes_back(by_title):
    searches, answer = play(HeuristicQAAgent(), "In what year was Ivan Turgenev born?", [[by_title["Hafez"]]])
    assert searches == ["Ivan Turgenev"] and answer  # a best guess, never a hang
    searches, answer = play(HeuristicQAAgent(max_searches=1), "Who was born first, Hafez or Ferdowsi?", [[by_title["Hafez"]]])
    assert len(searches) == 1 and answer in ("Hafez", "Ferdowsi")


def _info(item, docs) -> dict:
    return {
        "answers": list(item.answers),
        "supporting_ids": list(item.supporting_ids),
        "supporting_titles": [docs[i].title for i in item.supporting_ids],
        "question_type": item.type,
    }


def test_oracle_searches_supporting_titles_and_answers_what_they_show(docs, by_title):
    item = load_qa("wiki", "dev", types=["identify"])[0]
    searches, answer = play(OracleQAAgent(), item.question, [[docs[item.supporting_ids[0]]]], info=_info(item, docs))
    assert searches == [docs[item.supporting_ids[0]].title] and answer == item.answers[0]
    # A comparison whose passages state both life spans (Ferdowsi 940–1025, Omar Khayyam 1048–1131).
    a, b = by_title["Omar Khayyam"], by_title["Ferdowsi"]
    info = {"answers": ["Ferdowsi"], "supporting_titles": [a.title, b.title], "question_type": "born_first"}
    searches, answer = play(OracleQAAgent(), "Who was born first, Omar Khayyam or Ferdowsi?", [[a], [b]], info=info)
    assert searches == [a.title, b.title] and answer == "Ferdowsi"


def _without_description(doc):
    """The passage as the package ships it: the lead paragraph, with its life dates stripped."""
    assert doc.text.startswith(doc.description + ". ")
    return dataclasses.replace(doc, text=doc.text[len(doc.description) + 2 :])


def test_oracle_does_not_answer_a_comparison_whose_passages_lack_the_years(docs):
    item = next(
        it for it in load_qa("wiki", "dev", types=["born_first"])
        if any(life_years(_without_description(docs[i]).text)[0] is None for i in it.supporting_ids)
    )
    a, b = (_without_description(docs[i]) for i in item.supporting_ids)
    _, answer = play(OracleQAAgent(), item.question, [[a], [b]], info=_info(item, docs))
    assert answer == GIVE_UP


def test_oracle_does_not_answer_when_a_supporting_passage_was_not_retrieved(docs, by_title):
    item = load_qa("wiki", "dev", types=["born_first"])[0]
    a = docs[item.supporting_ids[0]]
    _, answer = play(OracleQAAgent(), item.question, [[a], [by_title["Hafez"]]], info=_info(item, docs))
    assert answer == GIVE_UP


def test_oracle_answers_a_year_only_if_the_passage_states_it(docs, by_title):
    year_items = load_qa("wiki", "all", types=["death_year"])
    stated = next(it for it in year_items if docs[it.supporting_ids[0]].title == "Oliver Cromwell")
    _, answer = play(OracleQAAgent(), stated.question, [[by_title["Oliver Cromwell"]]], info=_info(stated, docs))
    assert answer == "1658"
    unstated = next(it for it in year_items if it.answers[0] not in _without_description(docs[it.supporting_ids[0]]).text)
    doc = _without_description(docs[unstated.supporting_ids[0]])
    _, answer = play(OracleQAAgent(), unstated.question, [[doc]], info=_info(unstated, docs))
    assert answer == GIVE_UP


def test_both_agents_play_full_tree_search_qa_episodes():
    """End to end on a BM25 index over the first 300 passages: every dev question inside that slice."""
    env = gym.make("TreeSearchQA-v0", corpus_limit=300, split="dev", index="bm25")
    items = env.unwrapped.items
    scores: dict[str, dict[str, list[float]]] = {}
    for name, agent in (("heuristic", HeuristicQAAgent()), ("oracle", OracleQAAgent())):
        for item in items:
            ep = run_episode(env, agent, options={"task_id": item.id})
            assert ep.error is None and ep.terminated, ep.error
            answer = answer_of(ep.messages[-1]["content"])
            if name == "oracle":  # the oracle is never wrong: it answers the gold or gives up
                assert answer == GIVE_UP or ep.reward == 1.0, (item.id, answer)
            scores.setdefault(name, {}).setdefault(item.type, []).append(ep.reward)
    summary = {
        name: {t: f"{sum(v) / len(v):.2f} (n={len(v)})" for t, v in per_type.items()}
        for name, per_type in scores.items()
    }
    print("\nEM on dev questions inside corpus_limit=300 (bm25):", summary)
    oracle_identify = scores["oracle"]["identify"]
    assert sum(oracle_identify) / len(oracle_identify) >= 0.8
    heuristic_identify = scores["heuristic"]["identify"]
    assert sum(heuristic_identify) / len(heuristic_identify) >= 0.5
