"""Wikipedia-style passages about the world's entities, and how to read facts back out of them.

Each entity has two passages with the same title (like wiki-18's 100-word chunks), and its facts
are spread over both: a person's birth is in the first, membership and death in the second.
Every relation has several sentence templates; the one used is picked by hash. Each template
also compiles to a regular expression, which is how the oracle reads an answer back out of a
retrieved passage without ever seeing the world's tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from treegym.retrieval_index.corpus import Document
from treegym.retrieval_index.synthetic.names import mix
from treegym.retrieval_index.synthetic.world import (
    KINDS,
    PASSAGES_PER_ENTITY,
    S_TEXT,
    World,
    gender,
    passage_id,
)

NAME_PATTERN = r"[A-Z][a-z]+(?: [A-Z][a-z]+)*"
YEAR_PATTERN = r"\d{3,4}"


@dataclass(frozen=True)
class Relation:
    """A functional relation: where it is written, how to ask for it, how it is phrased.

    ``subject``/``obj`` are entity kinds ("year" for a date); ``subkind`` restricts works to
    films, books or albums; ``query`` is the one-hop question the oracle searches with.
    """

    name: str
    subject: str
    obj: str
    part: int
    query: str
    sentences: tuple[str, ...]
    function: str = ""  # the world relation that computes it, when it differs from ``name``
    subkind: str = ""

    @cached_property
    def patterns(self) -> tuple[re.Pattern[str], ...]:
        value = YEAR_PATTERN if self.obj == "year" else NAME_PATTERN
        out = []
        for sentence in self.sentences:
            pattern = re.escape(sentence).replace(r"\{s\}", r"[^.]*?").replace(r"\{poss\}", r"\w+")
            out.append(re.compile(pattern.replace(r"\{o\}", f"(?P<o>{value})")))
        return tuple(out)

    def extract(self, text: str) -> str | None:
        """The object of this relation as written in a passage's text, if it is there."""
        for pattern in self.patterns:
            match = pattern.search(text)
            if match:
                return match.group("o")
        return None


def _r(name: str, subject: str, obj: str, part: int, query: str, *sentences: str, **kw: str) -> Relation:
    return Relation(name, subject, obj, part, query, sentences, **kw)


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in (
        _r("born_in", "person", "city", 0, "Where was {e} born?",
           "{s} was born in the city of {o}.", "{s} was born and raised in {o}.",
           "{s} was a native of {o}, where the family had lived for generations."),
        _r("birth_year", "person", "year", 0, "When was {e} born?",
           "{s} was born in {o}.", "{s} was born in the year {o}.", "{s} entered the world in {o}."),
        _r("member_of", "person", "org", 1, "Which organisation was {e} a member of?",
           "{s} was a member of the {o}.", "{s} joined the {o} early in {poss} career.",
           "{s} belonged to the {o} for most of {poss} life."),
        _r("death_year", "person", "year", 1, "When did {e} die?",
           "{s} died in {o}.", "{s} died in the year {o}.", "{s} passed away in {o}."),
        _r("country", "city", "country", 0, "Which country is {e} in?",
           "{s} is a city in {o}.", "{s} is a city located in the Republic of {o}.",
           "{s} is one of the cities of {o}."),
        _r("city_founded", "city", "year", 1, "When was the city of {e} founded?",
           "{s} was founded in {o}.", "{s} was established as a town in {o}.", "{s} received its charter in {o}."),
        _r("capital", "country", "city", 0, "What is the capital of {e}?",
           "The capital of {s} is {o}.", "{s} is governed from its capital, {o}.",
           "{s} has its seat of government in the capital city of {o}."),
        _r("independence", "country", "year", 1, "When did {e} become independent?",
           "{s} became independent in {o}.", "{s} gained independence in {o}.",
           "{s} declared its independence in {o}."),
        _r("founder", "org", "person", 0, "Who founded {e}?",
           "{s} was founded by {o}.", "{s} was established by {o}.", "{s} owes its creation to {o}."),
        _r("org_founded", "org", "year", 1, "When was {e} founded?",
           "{s} was founded in {o}.", "{s} was established in the year {o}.", "{s} opened its doors in {o}."),
        _r("headquarters", "org", "city", 1, "Where is {e} headquartered?",
           "{s} is headquartered in {o}.", "{s} has its headquarters in {o}.", "{s} is based in the city of {o}."),
        _r("director", "work", "person", 0, "Who directed the film {e}?",
           "{s} is a film directed by {o}.", "{s} was directed by {o}.",
           "{s} is a drama film made by the director {o}.", function="creator", subkind="film"),
        _r("author", "work", "person", 0, "Who wrote the book {e}?",
           "{s} is a book written by {o}.", "{s} was written by {o}.", "{s} is a novel by the writer {o}.",
           function="creator", subkind="book"),
        _r("artist", "work", "person", 0, "Who recorded the album {e}?",
           "{s} is an album recorded by {o}.", "{s} was recorded by {o}.",
           "{s} is a studio album by the musician {o}.", function="creator", subkind="album"),
        _r("release_year", "work", "year", 1, "When was {e} released?",
           "{s} was released in {o}.", "{s} was first published in {o}.", "{s} came out in {o}."),
    )
}

OCCUPATIONS = ("painter", "engineer", "poet", "composer", "physician", "architect", "botanist",
               "merchant", "astronomer", "sculptor", "historian", "chemist", "diplomat", "lawyer")
_FILLER = {
    ("person", 0): ("{S} was {occ} whose work was admired by {poss} contemporaries.",
                    "{S} was {occ} of modest origins.", "{S} was a noted {occ_bare}."),
    ("person", 1): ("Later in life {pron} wrote extensively about {poss} craft.",
                    "{Pron} is remembered as an influential {occ_bare}.", "{Pron} travelled widely as {occ}."),
    ("city", 0): ("It is known for its markets and old stone bridges.", "The city has a mild climate.",
                  "Its old town is built around a central square."),
    ("city", 1): ("It grew quickly after the arrival of the railway.", "Its population has grown steadily.",
                  "The city hosts an annual autumn fair."),
    ("country", 0): ("{S} is a sovereign state with a parliamentary system.",
                     "{S} is a mountainous country with a long coastline.", "{S} is a small inland country."),
    ("country", 1): ("Its economy relies on farming and trade.", "The country has two official languages.",
                     "Its flag shows three horizontal stripes."),
    ("org", 0): ("It supports research and public education.", "It organises an annual conference.",
                 "Its members meet twice a year."),
    ("org", 1): ("It publishes a quarterly journal.", "It has several regional branches.",
                 "It awards a prize every spring."),
    ("work", 0): ("It received wide critical attention.", "Critics praised its bold structure.",
                  "It was a modest commercial success."),
    ("work", 1): ("It has since been reissued several times.", "It is often cited as an early classic.",
                  "A sequel was planned but never completed."),
}


def _facts(world: World, kind: str, index: int, part: int) -> list[tuple[Relation, str]]:
    """The (relation, object text) pairs written in one passage."""
    facts = []
    work_kind = world.work_kind(index) if kind == "work" else ""
    for rel in RELATIONS.values():
        if rel.subject != kind or rel.part != part or (rel.subkind and rel.subkind != work_kind):
            continue
        value = world.relation(rel.function or rel.name, kind, index)
        facts.append((rel, str(value) if rel.obj == "year" else world.entity(rel.obj, value).name))
    return facts


def entity_passage(world: World, kind: str, index: int, part: int) -> Document:
    """One passage: its first sentence names the entity (as a Wikipedia lead does), later ones
    may use a pronoun; a fact-free sentence of colour closes it."""
    entity = world.entity(kind, index)
    h = mix(world.seed, S_TEXT, KINDS.index(kind), index, part)
    pron = gender(world, index) if kind == "person" else "it"
    poss = {"he": "his", "she": "her", "it": "its"}[pron]
    occ = OCCUPATIONS[mix(world.seed, S_TEXT, index) % len(OCCUPATIONS)]
    sentences = []
    for n, (rel, obj) in enumerate(_facts(world, kind, index, part)):
        template = rel.sentences[(h >> (4 * n)) % len(rel.sentences)]
        use_name = n == 0 or ((h >> (20 + n)) & 1) or not template.startswith("{s}")
        subject = entity.name if use_name else pron.capitalize()
        sentences.append(template.format(s=subject, o=obj, poss=poss))
    occ = ("an " if occ[0] in "aeiou" else "a ") + occ
    fillers = _FILLER[(kind, part)]
    filler = fillers[(h >> 40) % len(fillers)].format(
        S=entity.name, occ=occ, occ_bare=occ.split()[1], poss=poss, pron=pron, Pron=pron.capitalize()
    )
    sentences.append(filler)
    return Document(id=world.passage_id(kind, index, part), title=entity.name, text=" ".join(sentences))


def iter_passages(world: World) -> Iterator[Document]:
    """Every passage in corpus order (exactly ``world.passages`` of them), one at a time."""
    for kind, count in world.counts:
        for index in range(count):
            for part in range(PASSAGES_PER_ENTITY):
                yield entity_passage(world, kind, index, part)
    if world.passages % PASSAGES_PER_ENTITY:
        yield Document(
            id=passage_id(world.entities * PASSAGES_PER_ENTITY),
            title="About this encyclopedia",
            text=f"This encyclopedia describes an invented world of {world.entities:,} entities. "
            "Every person, place, organisation and work in it is fictional.",
        )
