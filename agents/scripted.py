"""Scripted agents for the QA envs (Search-R1's ReAct protocol): a heuristic and an oracle.

Both are plain agents (``act(messages) -> str``) and compute their next turn from the messages
alone (the oracle also from its ``begin(info)``), so one agent can drive any number of forks.

- ``HeuristicQAAgent`` reads only the chat: it recognises the question's wording, searches for
  the entities it names, and extracts the answer from the passages it gets back (a year from
  the entity's passage, the title of the passage that matches a description, a comparison of
  two people's years). It answers with its best guess once its searches are spent.
- ``OracleQAAgent`` is told the task (``supporting_titles``, ``answers``), searches the
  supporting titles, and answers the gold answer only if the retrieved text shows it: every
  supporting passage was retrieved and the answer is in it. Its score is therefore the share of
  questions that are answerable through the retriever, not a copy of the gold.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from treegym.agents.base import Message
from treegym.agents.experts import expert
from treegym.envs.qa_env import QAEnv
from treegym.retrieval_index.scoring import normalize_answer

GIVE_UP = "unknown"


# ---- reading the chat ------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrievedDoc:
    """One ``Doc i(Title: t) text`` entry of an ``<information>`` block."""

    rank: int
    title: str
    text: str


_INFO = re.compile(r"<information>(.*?)</information>", re.DOTALL)
_DOC_START = re.compile(r"(?:^|\n)Doc (\d+)\(Title: ")


def parse_information(observation: str) -> list[RetrievedDoc]:
    """The passages of every ``<information>`` block in an observation, in order."""
    docs = []
    for block in _INFO.findall(observation):
        starts = list(_DOC_START.finditer(block))
        for i, m in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else len(block)
            entry = block[m.end() : end]
            # The title may hold parentheses of its own ("Ural (river)"): find the ")" that
            # closes "(Title: ".
            depth, cut = 0, None
            for j, ch in enumerate(entry):
                if ch == "(":
                    depth += 1
                elif ch == ")":
                    if depth == 0:
                        cut = j
                        break
                    depth -= 1
            if cut is None:
                continue
            docs.append(RetrievedDoc(int(m.group(1)), entry[:cut].strip(), entry[cut + 1 :].strip()))
    return docs


def question_of(messages: Sequence[Message]) -> str:
    """The question at the end of the opening prompt (after its last "Question:")."""
    prompt = messages[0]["content"] if messages else ""
    return prompt.rsplit("Question:", 1)[-1].strip()


def searches_made(messages: Sequence[Message]) -> list[str]:
    return [
        m.group(1).strip()
        for msg in messages
        if msg.get("role") == "assistant"
        for m in [re.search(r"<search>(.*?)</search>", msg.get("content", ""), re.DOTALL)]
        if m
    ]


def retrieved(messages: Sequence[Message]) -> list[list[RetrievedDoc]]:
    """The passages each observation (each user turn after the prompt) brought back."""
    return [parse_information(m.get("content", "")) for m in messages[1:] if m.get("role") == "user"]


# ---- question types --------------------------------------------------------------------------

_PATTERNS = (
    ("identify", re.compile(r'^Which [\w ]+? is described as "(?P<desc>.+)"\?$')),
    ("birth_year", re.compile(r"^In what year was (?P<name>.+) born\?$")),
    ("death_year", re.compile(r"^In what year did (?P<name>.+) die\?$")),
    ("born_first", re.compile(r"^Who was born first, (?P<a>.+?) or (?P<b>.+)\?$")),
    ("lived_longer", re.compile(r"^Who lived longer, (?P<a>.+?) or (?P<b>.+)\?$")),
)
_STOP = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from", "had", "has", "have", "how", "in", "is", "it", "of", "on", "or", "the", "to", "was", "were", "what", "when", "where", "which", "who", "whom", "whose", "why", "with"]
)


def classify(question: str) -> tuple[str, dict[str, str]]:
    """The question's type and the entities it names; ``("open", {})`` if not recognised."""
    for qtype, pattern in _PATTERNS:
        m = pattern.match(question.strip())
        if m:
            return qtype, m.groupdict()
    return "open", {}


def keywords(text: str) -> str:
    """The question minus stop words: a search query for a question of unknown type."""
    words = [w for w in re.findall(r"[\w'’-]+", text) if w.lower() not in _STOP]
    return " ".join(words) or text


# ---- years in a passage ----------------------------------------------------------------------

_YEAR = r"(\d{3,4})"
_SPAN_IN_TEXT = re.compile(r"\(([^()]*?)\)")
_LEAD_VERB = re.compile(r"\b(?:was|is|were|are)\b")
_BORN = re.compile(r"\bborn\b[^.;()]{0,40}?\b" + _YEAR + r"\b")
_DIED = re.compile(r"\b(?:died|(?:his|her) death)\b[^.;()]{0,30}?\b" + _YEAR + r"\b")


def life_years(text: str) -> tuple[int | None, int | None]:
    """(birth, death) read from a passage: a "(1845–1923)" or "(born 1945)" span, else "born/died … YEAR".

    Only a span before the lead's first "was"/"is" counts: that is where a life span sits
    ("Hafez (1325–1390) was …"); a later "(1925–1954)" is a career or an era.
    """
    verb = _LEAD_VERB.search(text)
    for m in _SPAN_IN_TEXT.finditer(text, 0, verb.start() if verb else len(text)):
        inner = m.group(1)
        if "BC" in inner:
            continue
        born = re.fullmatch(r"born\s+(?:c\.\s*)?" + _YEAR, inner.strip())
        if born:
            return int(born.group(1)), None
        halves = re.split(r"\s*[–-]\s*(?=(?:c\.\s*)?\d|\d{1,2} \w+ \d|\w+ \d)", inner)
        if len(halves) == 2:
            first, last = re.findall(_YEAR, halves[0]), re.findall(_YEAR, halves[1])
            if first and last and 10 <= int(last[-1]) - int(first[-1]) <= 120:
                return int(first[-1]), int(last[-1])
    born, died = _BORN.search(text), _DIED.search(text)
    return (int(born.group(1)) if born else None, int(died.group(1)) if died else None)


def _tokens(text: str) -> set[str]:
    return {t for t in normalize_answer(text).split() if t not in _STOP and len(t) > 2}


def find_entity(name: str, docs: Sequence[RetrievedDoc]) -> RetrievedDoc | None:
    """The retrieved passage about ``name``: same title, else a title that contains it."""
    key = normalize_answer(name)
    for doc in docs:
        if normalize_answer(doc.title) == key:
            return doc
    for doc in docs:
        if key and (key in normalize_answer(doc.title) or normalize_answer(doc.title) in key):
            return doc
    return None


# ---- the agents ------------------------------------------------------------------------------


def _search(query: str, why: str) -> str:
    return f"<think>{why}</think><search>{query}</search>"


def _answer(answer: str, why: str) -> str:
    return f"<think>{why}</think><answer>{answer}</answer>"


class HeuristicQAAgent:
    """Answers the built-in question types from retrieved text alone; a baseline with no model.

    ``max_searches`` caps the searches per episode, so that it answers within the env's turn
    budget (TreeSearchQA-v0's default is 4 turns; a comparison needs 2 searches + 1 answer).
    """

    def __init__(self, max_searches: int = 2) -> None:
        self.max_searches = max(1, max_searches)

    def act(self, messages: list[Message]) -> str:
        question = question_of(messages)
        qtype, slots = classify(question)
        queries = self._queries(qtype, slots, question)
        done = searches_made(messages)
        results = retrieved(messages)
        docs = [d for batch in results for d in batch]
        if qtype in ("birth_year", "death_year"):
            found = self._year(qtype, slots["name"], docs)
            if found is not None:
                return _answer(str(found), f"The passage about {slots['name']} gives the year.")
        if len(done) < min(len(queries), self.max_searches):
            query = queries[len(done)]
            return _search(query, f"I need the passage about {query}.")
        return _answer(self._best_guess(qtype, slots, question, results), "Answering from what I found.")

    @staticmethod
    def _queries(qtype: str, slots: dict[str, str], question: str) -> list[str]:
        if qtype == "identify":
            return [slots["desc"]]
        if qtype in ("birth_year", "death_year"):
            return [slots["name"]]
        if qtype in ("born_first", "lived_longer"):
            return [slots["a"], slots["b"]]
        return [keywords(question)]

    @staticmethod
    def _year(qtype: str, name: str, docs: Sequence[RetrievedDoc]) -> int | None:
        doc = find_entity(name, docs)
        if doc is None:
            return None
        birth, death = life_years(doc.text)
        return birth if qtype == "birth_year" else death

    def _best_guess(self, qtype: str, slots: dict[str, str], question: str, results: list[list[RetrievedDoc]]) -> str:
        docs = [d for batch in results for d in batch]
        if not docs:
            return slots.get("a") or GIVE_UP
        if qtype == "identify":
            return best_match(slots["desc"], results[0] if results else docs).title
        if qtype in ("birth_year", "death_year"):
            doc = find_entity(slots["name"], docs) or docs[0]
            years = re.findall(r"\b(\d{3,4})\b", doc.text)
            return years[0] if years else GIVE_UP
        if qtype in ("born_first", "lived_longer"):
            return compare_people(qtype, slots["a"], slots["b"], docs)
        return docs[0].title


def best_match(description: str, docs: Sequence[RetrievedDoc]) -> RetrievedDoc:
    """The passage that shares most words with a description; the higher rank breaks ties."""
    want = _tokens(description)
    return max(docs, key=lambda d: (len(want & _tokens(d.title + " " + d.text)), -d.rank))


def compare_people(qtype: str, a: str, b: str, docs: Sequence[RetrievedDoc]) -> str:
    """Who was born first / lived longer, from the two people's passages; ``a`` if undecided."""
    years = {}
    for name in (a, b):
        doc = find_entity(name, docs)
        years[name] = life_years(doc.text) if doc else (None, None)
    (ba, da), (bb, db) = years[a], years[b]
    if qtype == "born_first" and ba is not None and bb is not None:
        return a if ba <= bb else b
    if qtype == "lived_longer" and None not in (ba, da, bb, db):
        return a if da - ba >= db - bb else b  # type: ignore[operator]
    return a


class OracleQAAgent:
    """Searches the task's supporting titles and answers the gold only if retrieval shows it.

    ``begin(info)`` takes the env's info: ``answers``, ``supporting_titles`` (or, failing that,
    the question is searched), ``question_type`` (a comparison needs both people's years in
    view). Without proof it answers "unknown".
    """

    def __init__(self) -> None:
        self.answers: tuple[str, ...] = ()
        self.titles: tuple[str, ...] = ()
        self.question_type = ""

    def begin(self, info: dict[str, Any]) -> None:
        self.answers = tuple(str(a) for a in info.get("answers", ()))
        self.titles = tuple(t for t in info.get("supporting_titles", ()) if t)
        self.question_type = str(info.get("question_type", ""))

    def act(self, messages: list[Message]) -> str:
        queries = list(self.titles) or [question_of(messages)]
        done = searches_made(messages)
        if len(done) < len(queries):
            return _search(queries[len(done)], "Look up a supporting passage.")
        docs = [d for batch in retrieved(messages) for d in batch]
        proven = provable_answer(self.answers, self.titles, docs, self.question_type)
        if proven is None:
            return _answer(GIVE_UP, "The retrieved passages do not show the answer.")
        return _answer(proven, "The supporting passages show the answer.")


def provable_answer(
    answers: Sequence[str], titles: Sequence[str], docs: Sequence[RetrievedDoc], question_type: str = ""
) -> str | None:
    """An answer alias shown by the retrieved passages, or None.

    Shown means: every supporting title was retrieved, and the alias is one of their titles or
    is written (as whole words) in one of their texts. For a comparison of two people, both
    passages must also state the years that decide it, and decide it for the alias.
    """
    by_title = {normalize_answer(d.title): d for d in docs}
    support = [by_title.get(normalize_answer(t)) for t in titles]
    if not titles or any(d is None for d in support):
        return None
    if question_type in ("born_first", "lived_longer"):
        if len(support) != 2:
            return None
        a, b = support
        assert a is not None and b is not None
        years = [life_years(a.text), life_years(b.text)]
        needed = [y[0] for y in years] + ([y[1] for y in years] if question_type == "lived_longer" else [])
        if any(y is None for y in needed):
            return None
        winner = compare_people(question_type, a.title, b.title, [a, b])
        return next((ans for ans in answers if normalize_answer(ans) == normalize_answer(winner)), None)
    for answer in answers:
        key = normalize_answer(answer)
        if not key:
            continue
        for doc in support:
            assert doc is not None
            if key == normalize_answer(doc.title) or re.search(rf"(?<!\w){re.escape(key)}(?!\w)", normalize_answer(doc.text)):
                return answer
    return None


# ---- the QA envs' experts (``treegym.agents.experts``) ----------------------------------------


@expert("heuristic", QAEnv)
def heuristic_expert(max_turns: int | None) -> HeuristicQAAgent:
    """The heuristic, leaving the last of ``max_turns`` turns for its answer: searches beyond the
    budget would truncate the episode before the answer, and an episode without one teaches nothing."""
    agent = HeuristicQAAgent()
    if max_turns is not None:
        agent.max_searches = max(1, min(agent.max_searches, max_turns - 1))
    return agent


@expert("oracle", QAEnv)
def oracle_expert(max_turns: int | None) -> OracleQAAgent:
    return OracleQAAgent()
