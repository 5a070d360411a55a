"""An oracle agent that answers synthetic questions by searching, never by reading gold ids.

It knows the world's grammar (question templates and relation sentence templates) but none of
its facts. For each question it recognises the template, takes the start entity's name from the
question text, and for each hop searches with that relation's one-hop query ("Where was {e}
born?"), reads the retrieved passages titled with the current entity, and pulls the next
entity out of the text. Hops are batched: one ``Retriever.search`` call per hop for all
questions. Its exact match, per hop count and per retriever, measures whether the questions are
answerable through that retriever at that k.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from treegym.retrieval_index.scoring import exact_match
from treegym.retrieval_index.synthetic.passages import RELATIONS
from treegym.retrieval_index.synthetic.questions import TEMPLATES, Template
from treegym.retrieval_index.types import QAItem, Retriever


def _question_pattern(template: Template) -> re.Pattern[str]:
    pattern = re.escape(template.text)
    for slot in ("e", "a", "b"):
        pattern = pattern.replace(re.escape("{" + slot + "}"), f"(?P<{slot}>.+?)")
    return re.compile(pattern)


# Longest template first: "In which city was the founder of {e} born?" must win over
# "In which city was {e} born?", whose {e} would also swallow "the founder of X".
_PARSERS = tuple((t, _question_pattern(t)) for t in sorted(TEMPLATES, key=lambda t: -len(t.text)))


def parse_question(question: str) -> tuple[Template, dict[str, str]] | None:
    """The template a question was made from and its entity slots, or None if none fits."""
    for template, pattern in _PARSERS:
        match = pattern.fullmatch(question)
        if match:
            return template, match.groupdict()
    return None


@dataclass(frozen=True)
class OracleAnswer:
    """What the oracle answered, whether it is right, and where it got stuck (if it did)."""

    id: str
    prediction: str
    correct: bool
    hops: int
    family: str
    searches: int
    stuck: str = ""  # "parse", or "relation@entity" of the hop whose fact was not retrieved


@dataclass
class _Walk:
    item: QAItem
    template: Template
    entities: list[str]  # one current entity per thread (two for comparisons)
    step: int = 0
    values: tuple[str, ...] = ()
    stuck: str = ""
    searches: int = 0


class ChainOracle:
    """Follows each question's relation chain through real searches at depth ``k``."""

    def __init__(self, retriever: Retriever, k: int = 3) -> None:
        self.retriever = retriever
        self.k = k

    def answer(self, items: Sequence[QAItem]) -> list[OracleAnswer]:
        walks: list[_Walk | OracleAnswer] = []
        for item in items:
            parsed = parse_question(item.question)
            if parsed is None:
                walks.append(OracleAnswer(item.id, "", False, item.hops, item.type, 0, "parse"))
                continue
            template, slots = parsed
            entities = [slots["a"], slots["b"]] if template.compare else [slots["e"]]
            walks.append(_Walk(item, template, entities))
        active = [w for w in walks if isinstance(w, _Walk)]
        while active:
            queries, owners = [], []
            for w in active:
                rel = RELATIONS[w.template.chain[w.step]]
                for thread, entity in enumerate(w.entities):
                    queries.append(rel.query.format(e=entity))
                    owners.append((w, thread))
            results = self.retriever.search(queries, self.k)
            found: dict[tuple[int, int], str | None] = {}
            for (w, thread), hits in zip(owners, results):
                rel = RELATIONS[w.template.chain[w.step]]
                entity = w.entities[thread]
                w.searches += 1
                value = next(
                    (v for v in (rel.extract(h.text) for h in hits if h.title == entity) if v is not None), None
                )
                found[(id(w), thread)] = value
            still = []
            for w in active:
                values = [found[(id(w), t)] for t in range(len(w.entities))]
                missing = [t for t, v in enumerate(values) if v is None]
                if missing:
                    w.stuck = f"{w.template.chain[w.step]}@{w.entities[missing[0]]}"
                    continue
                if w.template.compare:
                    w.values = tuple(values)  # type: ignore[arg-type]
                    continue
                w.entities = [values[0]]  # type: ignore[list-item]
                w.step += 1
                if w.step < len(w.template.chain):
                    still.append(w)
            active = still
        return [w if isinstance(w, OracleAnswer) else _finish(w) for w in walks]


def _finish(w: _Walk) -> OracleAnswer:
    if w.stuck:
        prediction = ""
    elif w.template.compare:
        a, b = (int(v) for v in w.values)
        first = a <= b if w.template.compare == "min" else a >= b
        prediction = w.entities[0] if first else w.entities[1]
    else:
        prediction = w.entities[0]
    correct = bool(prediction) and exact_match(prediction, w.item.answers) == 1.0
    return OracleAnswer(w.item.id, prediction, correct, w.item.hops, w.item.type, w.searches, w.stuck)


@dataclass(frozen=True)
class OracleReport:
    """Exact match of the oracle over a question set, overall and per hop count and family."""

    retriever: str
    k: int
    answers: tuple[OracleAnswer, ...]

    @property
    def em(self) -> float:
        return sum(a.correct for a in self.answers) / max(1, len(self.answers))

    def em_by(self, field: str) -> dict:
        groups: dict = defaultdict(list)
        for a in self.answers:
            groups[getattr(a, field)].append(a.correct)
        return {key: (sum(v) / len(v), len(v)) for key, v in sorted(groups.items())}

    def table(self) -> str:
        lines = [f"retriever={self.retriever} k={self.k}: EM {self.em:.3f} over {len(self.answers)} questions"]
        for field in ("hops", "family"):
            cells = ", ".join(f"{key}: {em:.3f} (n={n})" for key, (em, n) in self.em_by(field).items())
            lines.append(f"  by {field}: {cells}")
        return "\n".join(lines)


def evaluate_oracle(retriever: Retriever, items: Sequence[QAItem], k: int = 3, name: str = "") -> OracleReport:
    """Run the oracle over ``items`` and summarise its exact match."""
    answers = ChainOracle(retriever, k).answer(items)
    return OracleReport(name or type(retriever).__name__, k, tuple(answers))
