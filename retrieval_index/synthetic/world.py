"""The fictional world: how many entities of each type, their names, and their typed relations.

Everything is a pure function of (passages, seed) and an entity's number, so nothing is stored:
``world.entity("person", 17)`` and ``world.relation("born_in", "person", 17)`` are recomputed
whenever they are asked for. Entity types and the functional relations between them:

    work (film/book/album) --director/author/artist--> person
    person --born_in--> city,  person --member_of--> organisation
    city --country--> country, country --capital--> city
    organisation --founder--> person, organisation --headquarters--> city
    plus years: birth/death, city founding, independence, organisation founding, release.

Every tenth person, city, organisation and work is a distractor: a separate entity with its own
facts whose name is one doubled consonant away from its neighbour's.
"""

from __future__ import annotations

from dataclasses import dataclass

from treegym.errors import ConfigError
from treegym.retrieval_index.synthetic.names import NameSpace, double_consonant, mix

KINDS = ("country", "city", "org", "person", "work")
PASSAGES_PER_ENTITY = 2
MIN_PASSAGES = 100
MAX_PASSAGES = 50_000_000
WORK_KINDS = ("film", "book", "album")
ORG_KINDS = ("Institute", "Society", "Guild", "Company", "Academy", "Union", "Foundation", "Orchestra")
WORK_TITLES = {
    "film": ("The Last Days of {w}", "{w} Rising", "Return to {w}", "The Road to {w}"),
    "book": ("The Chronicle of {w}", "Letters from {w}", "A History of {w}", "The House of {w}"),
    "album": ("{w} Sessions", "Songs from {w}", "Live at {w}", "Echoes of {w}"),
}
DISTRACTOR_EVERY = 10  # local index i with i % 10 == 9 is the twin of i - 1

# Stream ids for mix(): one per attribute, so attributes are independent of each other.
_S_COUNTRY, _S_FOUNDED, _S_BORN, _S_BIRTH, _S_LIFE, _S_MEMBER, _S_FOUNDER = 10, 11, 12, 13, 14, 15, 16
_S_ORG_YEAR, _S_HQ, _S_WORK_KIND, _S_CREATOR, _S_RELEASE, _S_FIRST, _S_ORG_KIND = 17, 18, 19, 20, 21, 22, 23
_S_TITLE, _S_INDEP, _S_GENDER = 24, 25, 26
S_TEXT = 40  # passage wording; see passages.py
S_QUESTION = 60  # question sampling; see questions.py


@dataclass(frozen=True)
class Entity:
    """One entity: ``kind`` is its type, ``index`` its number within that type."""

    kind: str
    index: int
    name: str
    aliases: tuple[str, ...]
    subkind: str = ""  # film/book/album for works, Institute/Guild/... for organisations
    twin: int | None = None  # for a distractor, the index of the entity it imitates


@dataclass(frozen=True)
class World:
    """The counts that fix a world; all facts are derived from them and the seed."""

    seed: int
    passages: int
    counts: tuple[tuple[str, int], ...]

    def count(self, kind: str) -> int:
        return dict(self.counts)[kind]

    @property
    def entities(self) -> int:
        return sum(n for _, n in self.counts)

    def offset(self, kind: str) -> int:
        """The global number of the first entity of ``kind`` (corpus order follows KINDS)."""
        total = 0
        for k, n in self.counts:
            if k == kind:
                return total
            total += n
        raise ConfigError(f"unknown entity kind {kind!r}; valid kinds: {', '.join(KINDS)}")

    def global_index(self, kind: str, index: int) -> int:
        return self.offset(kind) + index

    def locate(self, g: int) -> tuple[str, int]:
        """(kind, index) of global entity number ``g``."""
        for kind, n in self.counts:
            if g < n:
                return kind, g
            g -= n
        raise IndexError(g)

    def passage_id(self, kind: str, index: int, part: int) -> str:
        return passage_id(self.global_index(kind, index) * PASSAGES_PER_ENTITY + part)

    def _h(self, stream: int, kind: str, index: int) -> int:
        return mix(self.seed, stream, KINDS.index(kind), index)

    def is_distractor(self, kind: str, index: int) -> bool:
        return kind != "country" and index % DISTRACTOR_EVERY == DISTRACTOR_EVERY - 1

    def entity(self, kind: str, index: int) -> Entity:
        names = _namespace(self.entities, self.seed)
        twin = index - 1 if self.is_distractor(kind, index) else None
        base = index if twin is None else twin
        word = names.word(self.global_index(kind, base))
        if twin is not None:
            word = double_consonant(word)
        if kind == "person":
            first = names.first_names[self._h(_S_FIRST, kind, base) % len(names.first_names)]
            return Entity(kind, index, f"{first} {word}", (f"{first} {word}", word), twin=twin)
        if kind == "org":
            org_kind = ORG_KINDS[self._h(_S_ORG_KIND, kind, base) % len(ORG_KINDS)]
            name = f"{word} {org_kind}"
            return Entity(kind, index, name, (name, f"the {name}"), subkind=org_kind, twin=twin)
        if kind == "work":
            work_kind = self.work_kind(base)
            titles = WORK_TITLES[work_kind]
            title = titles[self._h(_S_TITLE, kind, base) % len(titles)].format(w=word)
            return Entity(kind, index, title, (title,), subkind=work_kind, twin=twin)
        if kind == "country":
            return Entity(kind, index, word, (word, f"Republic of {word}", f"the Republic of {word}"))
        return Entity(kind, index, word, (word,), twin=twin)

    def work_kind(self, index: int) -> str:
        base = index - 1 if self.is_distractor("work", index) else index
        return WORK_KINDS[self._h(_S_WORK_KIND, "work", base) % len(WORK_KINDS)]

    # Relations: each returns an entity index (of the type RELATIONS says) or a year.
    def relation(self, name: str, kind: str, index: int) -> int:
        fn = _RELATION_FUNCS.get(name)
        if fn is None:
            raise ConfigError(f"unknown relation {name!r}; valid: {', '.join(sorted(_RELATION_FUNCS))}")
        return fn(self, kind, index)

    def lifespan(self, person: int) -> tuple[int, int]:
        birth = 1780 + self._h(_S_BIRTH, "person", person) % 150
        return birth, birth + 30 + self._h(_S_LIFE, "person", person) % 65

    def _during_life(self, stream: int, kind: str, index: int, person: int) -> int:
        birth, death = self.lifespan(person)
        return birth + 20 + self._h(stream, kind, index) % (death - birth - 19)


def _city_country(w: World, kind: str, i: int) -> int:
    # Cities 0..countries-1 are the capitals, each in its own country.
    n = w.count("country")
    return i if i < n else w._h(_S_COUNTRY, kind, i) % n


_RELATION_FUNCS = {
    "country": _city_country,
    "city_founded": lambda w, k, i: 700 + w._h(_S_FOUNDED, k, i) % 1050,
    "capital": lambda w, k, i: i,
    "independence": lambda w, k, i: 1750 + w._h(_S_INDEP, k, i) % 240,
    "born_in": lambda w, k, i: w._h(_S_BORN, k, i) % w.count("city"),
    "birth_year": lambda w, k, i: w.lifespan(i)[0],
    "death_year": lambda w, k, i: w.lifespan(i)[1],
    "member_of": lambda w, k, i: w._h(_S_MEMBER, k, i) % w.count("org"),
    "founder": lambda w, k, i: w._h(_S_FOUNDER, k, i) % w.count("person"),
    "org_founded": lambda w, k, i: w._during_life(_S_ORG_YEAR, k, i, w.relation("founder", k, i)),
    "headquarters": lambda w, k, i: w._h(_S_HQ, k, i) % w.count("city"),
    "creator": lambda w, k, i: w._h(_S_CREATOR, k, i) % w.count("person"),
    "release_year": lambda w, k, i: w._during_life(_S_RELEASE, k, i, w.relation("creator", k, i)),
}


def gender(world: World, person: int) -> str:
    return "she" if world._h(_S_GENDER, "person", person) % 2 else "he"


def passage_id(number: int) -> str:
    return f"syn-{number:07d}"


_NAMESPACES: dict[tuple[int, int], NameSpace] = {}


def _namespace(count: int, seed: int) -> NameSpace:
    key = (count, seed)
    if key not in _NAMESPACES:
        _NAMESPACES.clear()  # one world at a time in practice; keep memory flat
        _NAMESPACES[key] = NameSpace(count, seed)
    return _NAMESPACES[key]


def plan_world(passages: int, seed: int = 0) -> World:
    """Entity counts for a corpus of exactly ``passages`` passages (two per entity)."""
    if not isinstance(passages, int) or isinstance(passages, bool):
        raise ConfigError(f"passages must be an integer, not {passages!r}")
    if not MIN_PASSAGES <= passages <= MAX_PASSAGES:
        raise ConfigError(
            f"passages={passages}: the synthetic world needs between {MIN_PASSAGES:,} and "
            f"{MAX_PASSAGES:,} passages ({MIN_PASSAGES} is the least that holds 3 countries, "
            "5 cities, 5 organisations, 22 people and 15 works at 2 passages each)"
        )
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, not {seed!r}")
    entities = passages // PASSAGES_PER_ENTITY
    countries = max(3, entities // 100)
    cities = max(5, countries, entities // 10)
    orgs = max(5, entities // 10)
    people = max(22, entities * 45 // 100)
    works = entities - countries - cities - orgs - people
    counts = (("country", countries), ("city", cities), ("org", orgs), ("person", people), ("work", works))
    return World(seed=seed, passages=passages, counts=counts)
