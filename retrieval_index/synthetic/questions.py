"""Multi-hop questions over the world, in the families that multi-hop benchmarks use.

- ``single``: one relation (1 hop), the retrieval baseline;
- ``bridge`` (HotpotQA): find the bridge entity, then ask for one of its attributes (2 hops);
- ``comparison`` (HotpotQA, 2WikiMultiHopQA): compare one attribute of two entities (2 hops);
- ``compositional`` (2WikiMultiHopQA): a composition of two relations to an entity (2 hops);
- ``inference`` (2WikiMultiHopQA): a relation that no passage states, implied by two that do,
  e.g. a person's country of birth from birthplace + the city's country (2 hops);
- ``chain`` (MuSiQue): compositions of 3 or 4 relations.

A question is drawn by hash from its number, so question n is the same whatever else is asked
for; the gold chain is the passage that states each hop's fact.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from treegym.errors import ConfigError
from treegym.retrieval_index.synthetic.names import mix
from treegym.retrieval_index.synthetic.passages import RELATIONS
from treegym.retrieval_index.synthetic.world import DISTRACTOR_EVERY, S_QUESTION, World
from treegym.retrieval_index.types import QAItem

FAMILIES = ("single", "bridge", "comparison", "compositional", "inference", "chain")
MAX_HOPS = 4
SPLIT_PERCENT = (("train", 80), ("dev", 10), ("test", 10))


@dataclass(frozen=True)
class Template:
    """A question pattern: ``{e}`` is the start entity (``{a}``/``{b}`` for comparisons)."""

    id: str
    text: str
    chain: tuple[str, ...]  # relation names, followed in order from the start entity
    compare: str = ""  # "min"/"max": a comparison of chain[0] over two entities

    @property
    def family(self) -> str:
        return self.id.split("/")[0]

    @property
    def hops(self) -> int:
        return 2 if self.compare else len(self.chain)

    @property
    def start(self) -> tuple[str, str]:
        """(kind, subkind) of the start entity."""
        first = RELATIONS[self.chain[0]]
        return first.subject, first.subkind


def _t(id: str, text: str, *chain: str, compare: str = "") -> Template:
    return Template(id, text, chain, compare)


TEMPLATES: tuple[Template, ...] = (
    _t("single/director", "Who directed the film {e}?", "director"),
    _t("single/author", "Who wrote the book {e}?", "author"),
    _t("single/born_in", "In which city was {e} born?", "born_in"),
    _t("single/country", "In which country is the city of {e}?", "country"),
    _t("single/capital", "What is the capital of {e}?", "capital"),
    _t("single/founder", "Who founded {e}?", "founder"),
    _t("single/birth_year", "In what year was {e} born?", "birth_year"),
    _t("single/headquarters", "In which city is {e} headquartered?", "headquarters"),
    _t("compositional/director_birthplace", "Where was the director of the film {e} born?", "director", "born_in"),
    _t("compositional/author_organisation", "Which organisation was the author of the book {e} a member of?",
       "author", "member_of"),
    _t("compositional/founder_birthplace", "In which city was the founder of {e} born?", "founder", "born_in"),
    _t("compositional/city_capital", "What is the capital of the country in which {e} lies?", "country", "capital"),
    _t("compositional/artist_birthplace", "In which city was the musician who recorded the album {e} born?",
       "artist", "born_in"),
    _t("bridge/director_birth_year", "In what year was the director of the film {e} born?", "director", "birth_year"),
    _t("bridge/author_death_year", "In what year did the author of the book {e} die?", "author", "death_year"),
    _t("bridge/organisation_founded", "When was the organisation that {e} belonged to founded?",
       "member_of", "org_founded"),
    _t("bridge/birthplace_founded", "In what year was the city where {e} was born founded?", "born_in", "city_founded"),
    _t("bridge/headquarters_founded", "When was the city that hosts the headquarters of {e} founded?",
       "headquarters", "city_founded"),
    _t("inference/birth_country", "What is the country of birth of {e}?", "born_in", "country"),
    _t("inference/organisation_country", "In which country is {e} based?", "headquarters", "country"),
    _t("comparison/born_first", "Who was born first, {a} or {b}?", "birth_year", compare="min"),
    _t("comparison/died_later", "Who died later, {a} or {b}?", "death_year", compare="max"),
    _t("comparison/organisation_older", "Which was founded earlier, {a} or {b}?", "org_founded", compare="min"),
    _t("comparison/city_older", "Which city is older, {a} or {b}?", "city_founded", compare="min"),
    _t("comparison/independent_first", "Which country became independent first, {a} or {b}?",
       "independence", compare="min"),
    _t("chain/director_birth_country", "In which country was the director of the film {e} born?",
       "director", "born_in", "country"),
    _t("chain/founder_birth_country", "In which country was the founder of {e} born?", "founder", "born_in", "country"),
    _t("chain/birth_country_capital", "What is the capital of the country where {e} was born?",
       "born_in", "country", "capital"),
    _t("chain/author_organisation_founded", "In what year was the organisation founded that the author of the book "
       "{e} belonged to?", "author", "member_of", "org_founded"),
    _t("chain/director_birth_capital", "What is the capital of the country where the director of the film {e} "
       "was born?", "director", "born_in", "country", "capital"),
    _t("chain/founder_birth_capital", "What is the capital of the country in which the founder of {e} was born?",
       "founder", "born_in", "country", "capital"),
    _t("chain/author_organisation_country", "In which country is the organisation that the author of the book {e} "
       "belonged to headquartered?", "author", "member_of", "headquarters", "country"),
    _t("chain/artist_birth_independence", "In what year did the country where the musician who recorded the album "
       "{e} was born become independent?", "artist", "born_in", "country", "independence"),
)
TEMPLATE_IDS = tuple(t.id for t in TEMPLATES)


@dataclass(frozen=True)
class Question:
    """A QA item plus the template it came from (kept in questions.jsonl for analysis)."""

    item: QAItem
    template: str

    def to_record(self) -> dict:
        i = self.item
        return {
            "id": i.id, "question": i.question, "answers": list(i.answers),
            "supporting_ids": list(i.supporting_ids), "hops": i.hops, "type": i.type,
            "split": i.split, "source": i.source, "template": self.template,
        }


def select_templates(
    families: Sequence[str] | None = None, hops: Sequence[int] | int | None = None
) -> tuple[Template, ...]:
    """The templates of these families and hop counts; bad names or ranges are ConfigErrors."""
    fams = tuple(families) if families else FAMILIES
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown:
        raise ConfigError(f"unknown question family {unknown[0]!r}; valid families: {', '.join(FAMILIES)}")
    wanted = (hops,) if isinstance(hops, int) else tuple(hops or range(1, MAX_HOPS + 1))
    for h in wanted:
        if isinstance(h, bool) or not isinstance(h, int) or not 1 <= h <= MAX_HOPS:
            raise ConfigError(f"hops={h!r}: questions have between 1 and {MAX_HOPS} hops")
    chosen = tuple(t for t in TEMPLATES if t.family in fams and t.hops in wanted)
    if not chosen:
        combos = sorted({(t.family, t.hops) for t in TEMPLATES})
        raise ConfigError(
            f"no question template has family in {list(fams)} and hops in {list(wanted)}; "
            f"valid (family, hops) pairs: {combos}"
        )
    return chosen


def _draw(world: World, kind: str, subkind: str, h: int) -> int:
    """An entity of ``kind`` (a work of ``subkind``) drawn from hash ``h``; -1 if none is found."""
    count = world.count(kind)
    for attempt in range(64):
        index = mix(h, attempt) % count
        if not subkind or world.work_kind(index) == subkind:
            return index
    return -1


def _answers(world: World, kind: str, value: int) -> tuple[str, ...]:
    return (str(value),) if kind == "year" else world.entity(kind, value).aliases


def _follow(world: World, template: Template, h: int) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple] | None:
    """(question text, answers, gold chain, dedupe key) for one draw, or None to redraw."""
    kind, subkind = template.start
    if template.compare:
        rel = RELATIONS[template.chain[0]]
        count = world.count(kind)
        a = mix(h, 1) % count
        # A third of comparisons pit an entity against its near-namesake distractor.
        twin = a - a % DISTRACTOR_EVERY + DISTRACTOR_EVERY - 1
        if mix(h, 2) % 3 == 0 and twin < count:
            a, b = twin - 1, twin
        else:
            b = mix(h, 3) % count
        va, vb = (world.relation(rel.name, kind, x) for x in (a, b))
        if a == b or va == vb:
            return None
        pick = min if template.compare == "min" else max
        winner = a if pick(va, vb) == va else b
        ea, eb = world.entity(kind, a), world.entity(kind, b)
        text = template.text.format(a=ea.name, b=eb.name)
        gold = (world.passage_id(kind, a, rel.part), world.passage_id(kind, b, rel.part))
        return text, world.entity(kind, winner).aliases, gold, (min(a, b), max(a, b))
    start = _draw(world, kind, subkind, h)
    if start < 0:
        return None
    seen, gold = {(kind, start)}, []
    current = start
    for name in template.chain:
        rel = RELATIONS[name]
        gold.append(world.passage_id(rel.subject, current, rel.part))
        current = world.relation(rel.function or rel.name, rel.subject, current)
        if rel.obj != "year":
            if (rel.obj, current) in seen:
                return None  # a loop (a capital's own country...) would leak the answer
            seen.add((rel.obj, current))
    final = RELATIONS[template.chain[-1]].obj
    text = template.text.format(e=world.entity(kind, start).name)
    return text, _answers(world, final, current), tuple(gold), (start,)


def split_of(world: World, number: int, template: Template, holdout: frozenset[str]) -> str:
    if template.id in holdout:
        return "test"
    bucket = mix(world.seed, S_QUESTION, 7, number) % 100
    for split, share in SPLIT_PERCENT:
        if bucket < share:
            return split
        bucket -= share
    return "test"


def iter_questions(
    world: World,
    count: int,
    families: Sequence[str] | None = None,
    hops: Sequence[int] | int | None = None,
    holdout: Sequence[str] = (),
) -> Iterator[Question]:
    """Up to ``count`` distinct questions; hop counts are drawn evenly, then templates evenly.

    Memory is one small key per question (for de-duplication), never the questions themselves.
    """
    templates = select_templates(families, hops)
    unknown = [t for t in holdout if t not in TEMPLATE_IDS]
    if unknown:
        raise ConfigError(f"unknown template {unknown[0]!r} to hold out; valid: {', '.join(TEMPLATE_IDS)}")
    held = frozenset(holdout)
    by_hops: dict[int, list[Template]] = {}
    for t in templates:
        by_hops.setdefault(t.hops, []).append(t)
    hop_list = sorted(by_hops)
    seen: set[tuple] = set()
    made = 0
    for draw in range(count * 20):  # a tiny world may run out of distinct questions
        if made >= count:
            return
        h = mix(world.seed, S_QUESTION, draw)
        group = by_hops[hop_list[h % len(hop_list)]]
        template = group[(h >> 8) % len(group)]
        result = _follow(world, template, h >> 16)
        if result is None:
            continue
        text, answers, gold, key = result
        key = (template.id, *key)
        if key in seen:
            continue
        seen.add(key)
        item = QAItem(
            id=f"synq-{made:07d}", question=text, answers=answers, supporting_ids=gold, hops=template.hops,
            type=template.family, split=split_of(world, made, template, held), source="synthetic",
        )
        made += 1
        yield Question(item, template.id)
