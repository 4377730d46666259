"""An offline, seeded world of fictional entities, its Wikipedia-like pages and multi-hop questions about it.

Nothing here is true of the real world, so an agent cannot answer from memory: it must search the pages. The
world is a graph of people, places, organisations and works. Every relation is a function (a film has one
director, a city lies in one country), so every chain of relations has exactly one answer.

A page states its entity's own attributes and outgoing relations and never lists back-links (a person's page
does not list their films). A 2+-hop question names only its first entity, so a single search with the
question text finds the first hop's page but not the answer: that is what separates searching agents from
naive retrieval-augmented generation.

Example::

    world = generate_world(2_000, seed=0)
    corpus = world.documents()                 # [{"id", "title", "text"}, ...]
    tasks = world.questions(hops=(1, 2, 3, 4), n=100, seed=0, split="test")
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent_gym.envs import synthetic_names as vocab
from agent_gym.envs.synthetic_names import NameGenerator
from agent_gym.error import InvalidValue, KeyNotFound
from agent_gym.tasks import Hop, Task

__all__ = [
    "DEFAULT_NUM_ENTITIES",
    "Entity",
    "Page",
    "World",
    "generate_world",
]

DEFAULT_NUM_ENTITIES = 2_000
MIN_NUM_ENTITIES = 40
MAX_HOPS = 4
TEST_FRACTION = 0.2
MAX_CONSECUTIVE_MISSES = 5_000
SPLITS = ("train", "test", "all")
QUESTION_KINDS = ("bridge", "comparison")

# Share of each kind of entity; persons also absorb rounding so counts sum to the requested size.
KIND_FRACTIONS: dict[str, float] = {
    "country": 0.01, "city": 0.08, "university": 0.04, "person": 0.30, "company": 0.10,
    "band": 0.06, "film": 0.15, "novel": 0.15, "album": 0.11,
}  # fmt: skip
ROLE_FRACTIONS = {"director": 0.25, "writer": 0.25, "founder": 0.2, "other": 0.3}


@dataclass(frozen=True)
class Relation:
    """A functional relation between two kinds of entity, with its question and description templates."""

    name: str
    source: str
    target: str
    ask: str  # the hop question about a named entity, e.g. "Who directed {x}?"
    describe: str  # a noun phrase for the target, e.g. "the director of {x}"


@dataclass(frozen=True)
class Attribute:
    """A literal attribute (year, population, currency) and the question that asks for it."""

    name: str
    kind: str
    ask: str


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in (
        Relation("directed_by", "film", "person", "Who directed {x}?", "the director of {x}"),
        Relation("written_by", "novel", "person", "Who wrote {x}?", "the author of {x}"),
        Relation("performed_by", "album", "band", "Which band recorded {x}?", "the band that recorded {x}"),
        Relation("founded_by", "company", "person", "Who founded {x}?", "the founder of {x}"),
        Relation(
            "headquartered_in",
            "company",
            "city",
            "In which city is {x} headquartered?",
            "the city where {x} is headquartered",
        ),
        Relation("born_in", "person", "city", "In which city was {x} born?", "the city where {x} was born"),
        Relation(
            "educated_at",
            "person",
            "university",
            "Which university did {x} attend?",
            "the university that {x} attended",
        ),
        Relation(
            "located_in",
            "university",
            "city",
            "In which city is {x} located?",
            "the city where {x} is located",
        ),
        Relation(
            "formed_in", "band", "city", "In which city was {x} formed?", "the city where {x} was formed"
        ),
        Relation("country", "city", "country", "In which country is {x}?", "the country that contains {x}"),
    )
}

ATTRIBUTES: dict[tuple[str, str], Attribute] = {
    (a.kind, a.name): a
    for a in (
        Attribute("birth_year", "person", "In what year was {x} born?"),
        Attribute("founding_year", "company", "In what year was {x} founded?"),
        Attribute("founding_year", "university", "In what year was {x} founded?"),
        Attribute("release_year", "film", "In what year was {x} released?"),
        Attribute("publication_year", "novel", "In what year was {x} first published?"),
        Attribute("formation_year", "band", "In what year was {x} formed?"),
        Attribute("release_year", "album", "In what year was {x} released?"),
        Attribute("population", "city", "What is the population of {x}?"),
        Attribute("currency", "country", "What is the currency of {x}?"),
    )
}


@dataclass(frozen=True)
class Comparison:
    """A comparison question shape: two entities of ``kind`` compared on a numeric attribute."""

    kind: str
    attribute: str
    template: str
    pick_larger: bool


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("person", "birth_year", "Who was born earlier, {a} or {b}?", False),
    Comparison("person", "birth_year", "Who was born later, {a} or {b}?", True),
    Comparison("company", "founding_year", "Which company was founded first, {a} or {b}?", False),
    Comparison("university", "founding_year", "Which university is older, {a} or {b}?", False),
    Comparison("film", "release_year", "Which film was released first, {a} or {b}?", False),
    Comparison("novel", "publication_year", "Which novel was published more recently, {a} or {b}?", True),
    Comparison("band", "formation_year", "Which band was formed first, {a} or {b}?", False),
    Comparison("album", "release_year", "Which album came out first, {a} or {b}?", False),
    Comparison("city", "population", "Which city has the larger population, {a} or {b}?", True),
)


@dataclass(frozen=True)
class Entity:
    """One fictional thing. ``links`` maps a relation name to the index of the entity it points at."""

    index: int
    kind: str
    name: str
    attributes: Mapping[str, int | str]
    links: Mapping[str, int]
    aliases: tuple[str, ...] = ()

    def display(self, attribute: str) -> str:
        """The attribute as its page states it (populations with thousands separators)."""
        value = self.attributes[attribute]
        return f"{value:,}" if attribute == "population" else str(value)


@dataclass(frozen=True)
class Page:
    """A Wikipedia-like page about one entity."""

    id: str
    title: str
    text: str

    def as_dict(self) -> dict[str, str]:
        """The retrieval-corpus record ``{"id", "title", "text"}``."""
        return {"id": self.id, "title": self.title, "text": self.text}


@dataclass(frozen=True, repr=False)
class World:
    """A generated world: entities, their pages, and a question generator over them."""

    seed: int
    entities: tuple[Entity, ...]
    pages: tuple[Page, ...]
    is_test: tuple[bool, ...]  # per entity: questions that start from it belong to the test split
    _by_kind: dict[str, tuple[int, ...]] = field(repr=False, compare=False)
    _by_title: dict[str, int] = field(repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.pages)

    def __repr__(self) -> str:
        return f"World(seed={self.seed}, pages={len(self.pages)})"

    def documents(self) -> list[dict[str, str]]:
        """The pages as retrieval-corpus records ``{"id", "title", "text"}``."""
        return [page.as_dict() for page in self.pages]

    def page(self, title: str) -> Page:
        """The page with this title; ``KeyError`` names the title if there is none."""
        try:
            return self.pages[self._by_title[title]]
        except KeyError:
            raise KeyNotFound(f"synthetic world (seed {self.seed}) has no page titled {title!r}") from None

    def entity(self, title: str) -> Entity:
        """The entity whose page has this title."""
        self.page(title)
        return self.entities[self._by_title[title]]

    def questions(
        self,
        hops: int | Sequence[int] = (1, 2, 3, 4),
        n: int = 100,
        seed: int = 0,
        kinds: Sequence[str] = QUESTION_KINDS,
        split: str = "all",
    ) -> list[Task]:
        """Draw ``n`` distinct multi-hop questions about this world.

        Args:
            hops: hop count, or several used in turn (question ``i`` has ``hops[i % len(hops)]`` hops).
                Bridge questions have 1-4 hops; comparisons have 2 (two lookups), 3 or 4 (one or both
                compared entities reached through a relation).
            n: number of questions.
            seed: seeds the draw; the same (world, arguments) always give the same tasks, and a prefix of a
                longer draw equals a shorter draw.
            kinds: question kinds to mix, from ``"bridge"`` and ``"comparison"``.
            split: ``"train"`` or ``"test"`` (questions start from disjoint sets of entities, so the two never
                share a question), or ``"all"``.
        """
        hop_counts = _check_hops(hops)
        kinds = tuple(kinds)
        unknown = sorted(set(kinds) - set(QUESTION_KINDS))
        if not kinds or unknown:
            raise InvalidValue(f"kinds must be a non-empty subset of {QUESTION_KINDS}, got {kinds!r}")
        if split not in SPLITS:
            raise InvalidValue(f"split must be one of {SPLITS}, got {split!r}")
        if "bridge" not in kinds and 1 in hop_counts:
            raise InvalidValue(
                "comparison questions need at least 2 hops; add 'bridge' to kinds or drop hops=1"
            )
        if n < 0:
            raise InvalidValue(f"n must be >= 0, got {n}")
        pools = self._pools(split)
        rng = random.Random(_mix(self.seed, seed, SPLITS.index(split)))
        seen: set[str] = set()
        tasks: list[Task] = []
        misses = 0  # consecutive draws that gave nothing new: the world is (nearly) exhausted
        while len(tasks) < n:
            if misses > MAX_CONSECUTIVE_MISSES:
                raise InvalidValue(
                    f"could only draw {len(tasks)} distinct questions of {n} from a world of {len(self)} "
                    f"pages (split {split!r}); generate a larger world or ask for fewer questions"
                )
            num_hops = hop_counts[len(tasks) % len(hop_counts)]
            usable = [kind for kind in kinds if kind == "bridge" or num_hops >= 2]
            kind = rng.choice(usable)
            draft = (self._bridge if kind == "bridge" else self._comparison)(rng, num_hops, pools)
            if draft is None or draft.key in seen:
                misses += 1
                continue
            misses = 0
            seen.add(draft.key)
            task_id = f"synth-w{self.seed}-{split}-s{seed}-h{num_hops}-{len(tasks)}"
            tasks.append(draft.to_task(task_id, kind, num_hops, world_seed=self.seed, split=split))
        return tasks

    # ------------------------------------------------------------------------------------------ internals

    def _pools(self, split: str) -> dict[str, list[int]]:
        wanted = None if split == "all" else split == "test"
        return {
            kind: [i for i in indices if wanted is None or self.is_test[i] == wanted]
            for kind, indices in self._by_kind.items()
        }

    def _bridge(self, rng: random.Random, num_hops: int, pools: dict[str, list[int]]) -> _Draft | None:
        path = rng.choice(_BRIDGE_PATHS[num_hops])
        start_pool = pools[path.start]
        if not start_pool:
            return None
        entity = self.entities[rng.choice(start_pool)]
        description = entity.name
        decomposition: list[Hop] = []
        for relation_name in path.relations:
            relation = RELATIONS[relation_name]
            target = self.entities[entity.links[relation_name]]
            decomposition.append(
                Hop(relation.ask.format(x=entity.name), target.name, entity.name, entity.name)
            )
            if len(decomposition) < num_hops:
                description = relation.describe.format(x=description)
            entity = target
        if path.attribute is None:
            question = RELATIONS[path.relations[-1]].ask.format(x=description)
            answers = (entity.name, *entity.aliases)
        else:
            attribute = ATTRIBUTES[(entity.kind, path.attribute)]
            value = entity.display(path.attribute)
            decomposition.append(Hop(attribute.ask.format(x=entity.name), value, entity.name, entity.name))
            question = attribute.ask.format(x=description)
            answers = (
                (value, str(entity.attributes[path.attribute]))
                if path.attribute == "population"
                else (value,)
            )
        return _Draft(question, answers, tuple(decomposition), path.steps, key=question)

    def _comparison(self, rng: random.Random, num_hops: int, pools: dict[str, list[int]]) -> _Draft | None:
        indirect_sides = num_hops - 2
        shapes = [c for c in COMPARISONS if indirect_sides == 0 or c.kind in _INCOMING]
        shape = rng.choice(shapes)
        indirect = [False, False]
        for side in rng.sample((0, 1), indirect_sides):
            indirect[side] = True
        sides: list[tuple[str, Entity, list[Hop]]] = []  # (phrase in question, compared entity, hops)
        for via_relation in indirect:
            if via_relation:
                relation = RELATIONS[rng.choice(_INCOMING[shape.kind])]
                if not pools[relation.source]:
                    return None
                start = self.entities[rng.choice(pools[relation.source])]
                compared = self.entities[start.links[relation.name]]
                hops = [Hop(relation.ask.format(x=start.name), compared.name, start.name, start.name)]
                phrase = relation.describe.format(x=start.name)
            else:
                if not pools[shape.kind]:
                    return None
                compared = start = self.entities[rng.choice(pools[shape.kind])]
                hops, phrase = [], start.name
            attribute = ATTRIBUTES[(shape.kind, shape.attribute)]
            value = compared.display(shape.attribute)
            hops.append(Hop(attribute.ask.format(x=compared.name), value, compared.name, compared.name))
            sides.append((phrase, compared, hops))
        (phrase_a, entity_a, hops_a), (phrase_b, entity_b, hops_b) = sides
        value_a, value_b = entity_a.attributes[shape.attribute], entity_b.attributes[shape.attribute]
        if entity_a.index == entity_b.index or value_a == value_b:
            return None  # a tie or a self-comparison has no single answer
        a_wins = (value_a > value_b) == shape.pick_larger
        winner = entity_a if a_wins else entity_b
        question = shape.template.format(a=phrase_a, b=phrase_b)
        steps = (f"compare:{shape.kind}.{shape.attribute}", *(["indirect"] * indirect_sides))
        key = "|".join((shape.template, *sorted((phrase_a, phrase_b))))  # "A or B" asks what "B or A" asks
        return _Draft(question, (winner.name, *winner.aliases), (*hops_a, *hops_b), steps, key)


@dataclass(frozen=True)
class _Draft:
    question: str
    answers: tuple[str, ...]
    decomposition: tuple[Hop, ...]
    steps: tuple[str, ...]
    key: str  # two drafts with the same key ask the same question

    def to_task(self, task_id: str, kind: str, num_hops: int, *, world_seed: int, split: str) -> Task:
        titles = tuple(dict.fromkeys(hop.title for hop in self.decomposition))
        metadata = {"hops": num_hops, "world_seed": world_seed, "split": split, "path": self.steps}
        return Task(task_id, self.question, self.answers, titles, self.decomposition, kind, metadata)


@dataclass(frozen=True)
class _BridgePath:
    start: str
    relations: tuple[str, ...]
    attribute: str | None

    @property
    def steps(self) -> tuple[str, ...]:
        return (*self.relations, *([self.attribute] if self.attribute else []))


def _enumerate_bridge_paths() -> dict[int, tuple[_BridgePath, ...]]:
    """Every chain of relations, optionally ending in an attribute, by hop count (deterministic order)."""
    by_hops: dict[int, list[_BridgePath]] = {h: [] for h in range(1, MAX_HOPS + 1)}
    outgoing: dict[str, list[str]] = {}
    for relation in RELATIONS.values():
        outgoing.setdefault(relation.source, []).append(relation.name)

    def extend(start: str, kind: str, relations: tuple[str, ...]) -> None:
        if relations:
            by_hops[len(relations)].append(_BridgePath(start, relations, None))
        for (attribute_kind, attribute), _ in ATTRIBUTES.items():
            if attribute_kind == kind and 1 <= len(relations) + 1 <= MAX_HOPS:
                by_hops[len(relations) + 1].append(_BridgePath(start, relations, attribute))
        if len(relations) < MAX_HOPS:
            for name in outgoing.get(kind, []):
                extend(start, RELATIONS[name].target, (*relations, name))

    for start in KIND_FRACTIONS:
        extend(start, start, ())
    return {h: tuple(paths) for h, paths in by_hops.items()}


_BRIDGE_PATHS = _enumerate_bridge_paths()
_INCOMING: dict[str, list[str]] = {}
for _relation in RELATIONS.values():
    _INCOMING.setdefault(_relation.target, []).append(_relation.name)


def _check_hops(hops: int | Sequence[int]) -> tuple[int, ...]:
    counts = (hops,) if isinstance(hops, int) else tuple(hops)
    if not counts or any(
        not isinstance(h, int) or isinstance(h, bool) or not 1 <= h <= MAX_HOPS for h in counts
    ):
        raise InvalidValue(
            f"hops must be an int or a non-empty sequence of ints in 1..{MAX_HOPS}, got {hops!r}"
        )
    return counts


def _mix(*numbers: int) -> int:
    """Combine seeds into one seed without ``hash()``, which Python randomises per process for ``str``."""
    value = 0x9E3779B97F4A7C15
    for number in numbers:
        value = (value * 1_000_003 + number) % (1 << 64)
    return value


# ---------------------------------------------------------------------------------------------- generation


def generate_world(num_entities: int | None = None, *, num_pages: int | None = None, seed: int = 0) -> World:
    """Generate a world of ``num_entities`` entities, one page each (``num_pages`` is a synonym).

    The same seed gives a byte-identical world on every machine: one ``random.Random(seed)`` stream drives
    every choice, in a fixed order.
    """
    if num_entities is not None and num_pages is not None and num_entities != num_pages:
        raise InvalidValue(f"give num_entities or num_pages, not both ({num_entities} != {num_pages})")
    size = num_entities if num_entities is not None else num_pages
    size = DEFAULT_NUM_ENTITIES if size is None else size
    if not isinstance(size, int) or isinstance(size, bool) or size < MIN_NUM_ENTITIES:
        raise InvalidValue(
            f"a synthetic world needs an int number of entities >= {MIN_NUM_ENTITIES}, got {size!r}"
        )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InvalidValue(f"seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    builder = _Builder(rng, NameGenerator(rng))
    counts = _kind_counts(size)
    builder.build(counts)
    entities = tuple(builder.entities)
    pages = tuple(Page(f"synth-{entity.index}", entity.name, builder.render(entity)) for entity in entities)
    split_rng = random.Random(_mix(seed, 0x5EED))
    is_test = tuple(split_rng.random() < TEST_FRACTION for _ in entities)
    by_kind: dict[str, tuple[int, ...]] = {
        kind: tuple(e.index for e in entities if e.kind == kind) for kind in KIND_FRACTIONS
    }
    by_title = {page.title: index for index, page in enumerate(pages)}
    assert len(by_title) == len(pages), "distinctive words make titles unique"
    return World(seed, entities, pages, is_test, by_kind, by_title)


def _kind_counts(size: int) -> dict[str, int]:
    counts = {kind: max(2, math.floor(fraction * size)) for kind, fraction in KIND_FRACTIONS.items()}
    counts["person"] += size - sum(counts.values())
    return counts


class _Builder:
    """Creates entities kind by kind (targets before sources, so links point at existing entities)."""

    def __init__(self, rng: random.Random, names: NameGenerator) -> None:
        self.rng = rng
        self.names = names
        self.entities: list[Entity] = []
        self.of_kind: dict[str, list[Entity]] = {}
        self.people_by_role: dict[str, list[Entity]] = {}

    def add(
        self, kind: str, name: str, attributes: dict, links: dict, aliases: tuple[str, ...] = ()
    ) -> Entity:
        entity = Entity(len(self.entities), kind, name, attributes, links, aliases)
        self.entities.append(entity)
        self.of_kind.setdefault(kind, []).append(entity)
        return entity

    def pick(self, kind: str) -> Entity:
        return self.rng.choice(self.of_kind[kind])

    def build(self, counts: dict[str, int]) -> None:
        rng, names = self.rng, self.names
        for _ in range(counts["country"]):
            word = names.distinctive_word()
            currency = f"{names.distinctive_word()} {rng.choice(vocab.CURRENCY_UNITS)}"
            official = f"{rng.choice(vocab.GOVERNMENT_FORMS)} of {word}"
            # integer draws only: float ** goes through the platform's libm, which may differ in the last bit
            population = rng.randint(300, 9_000) * rng.choice((1_000, 10_000))
            self.add(
                "country",
                word,
                {"currency": currency, "population": population, "official": official},
                {},
                (official,),
            )
        for _ in range(counts["city"]):
            name = rng.choice(vocab.CITY_PATTERNS).format(w=names.distinctive_word())
            population = rng.randint(500, 6_000) * rng.choice((10, 100, 1_000))
            self.add("city", name, {"population": population}, {"country": self.pick("country").index})
        for _ in range(counts["university"]):
            name = rng.choice(vocab.UNIVERSITY_PATTERNS).format(w=names.distinctive_word())
            self.add(
                "university",
                name,
                {"founding_year": rng.randint(1150, 1900)},
                {"located_in": self.pick("city").index},
            )
        roles = _quota(rng, ROLE_FRACTIONS, counts["person"])
        for role in roles:
            name = f"{names.given_name()} {names.distinctive_word()}"
            attributes = {
                "birth_year": rng.randint(1880, 1995),
                "occupation": rng.choice(vocab.OCCUPATIONS_BY_ROLE[role]),
            }
            person = self.add(
                "person",
                name,
                attributes,
                {"born_in": self.pick("city").index, "educated_at": self.pick("university").index},
            )
            self.people_by_role.setdefault(role, []).append(person)
        for _ in range(counts["company"]):
            word = names.distinctive_word()
            name = f"{word} {rng.choice(vocab.COMPANY_SUFFIXES)}"
            founder = rng.choice(self.people_by_role["founder"])
            year = min(2024, founder.attributes["birth_year"] + rng.randint(22, 60))
            self.add(
                "company",
                name,
                {"founding_year": year, "industry": rng.choice(vocab.INDUSTRIES)},
                {"founded_by": founder.index, "headquartered_in": self.pick("city").index},
                (word,),
            )
        for _ in range(counts["band"]):
            word = names.distinctive_word()
            self.add(
                "band",
                f"The {word}s",
                {"formation_year": rng.randint(1955, 2018), "genre": rng.choice(vocab.MUSIC_GENRES)},
                {"formed_in": self.pick("city").index},
                (f"{word}s",),
            )
        for _ in range(counts["film"]):
            director = rng.choice(self.people_by_role["director"])
            year = min(2024, director.attributes["birth_year"] + rng.randint(25, 70))
            name = rng.choice(vocab.FILM_TITLES).format(w=names.distinctive_word())
            self.add(
                "film",
                name,
                {
                    "release_year": year,
                    "genre": rng.choice(vocab.FILM_GENRES),
                    "minutes": rng.randint(78, 175),
                },
                {"directed_by": director.index},
            )
        for _ in range(counts["novel"]):
            author = rng.choice(self.people_by_role["writer"])
            year = min(2024, author.attributes["birth_year"] + rng.randint(20, 75))
            name = rng.choice(vocab.NOVEL_TITLES).format(w=names.distinctive_word())
            self.add(
                "novel",
                name,
                {
                    "publication_year": year,
                    "genre": rng.choice(vocab.NOVEL_GENRES),
                    "pages": rng.randint(140, 820),
                },
                {"written_by": author.index},
            )
        for _ in range(counts["album"]):
            band = self.pick("band")
            year = min(2024, band.attributes["formation_year"] + rng.randint(0, 30))
            name = rng.choice(vocab.ALBUM_TITLES).format(w=names.distinctive_word())
            self.add(
                "album",
                name,
                {"release_year": year, "tracks": rng.randint(7, 16)},
                {"performed_by": band.index},
            )

    # ------------------------------------------------------------------------------------------ rendering

    def render(self, entity: Entity) -> str:
        """The page text: a lead paragraph stating every attribute and relation, then a paragraph of colour.

        Colour sentences name no other entity and state no number, so they add realistic length without
        adding facts a question could depend on.
        """
        a = entity.attributes
        link = {name: self.entities[index].name for name, index in entity.links.items()}
        rng = self.rng
        fields = {**a, **link, "name": entity.name}
        if entity.kind == "person":
            fields["surname"] = entity.name.split(" ", 1)[1]
            lead = rng.choice(_PERSON_TEMPLATES).format(**fields)
        else:
            if "population" in a:
                fields["population"] = entity.display("population")
            if entity.aliases:
                fields["alias"] = entity.aliases[0]
            if entity.kind == "album":
                fields["ordinal"] = rng.choice(("debut", "second", "third", "fourth", "fifth"))
            lead = rng.choice(_TEMPLATES[entity.kind]).format(**fields)
        colour = " ".join(sentence.format(**fields) for sentence in rng.sample(_COLOUR[entity.kind], 2))
        return f"{lead}\n\n{colour}"


def _quota(rng: random.Random, fractions: dict[str, float], total: int) -> list[str]:
    """``total`` labels in the given proportions, each label at least once, in a seeded order."""
    labels = [label for label, fraction in fractions.items() for _ in range(max(1, int(fraction * total)))]
    labels += ["other"] * (total - len(labels))
    labels = labels[:total]
    rng.shuffle(labels)
    return labels


# Several phrasings per kind, so pages do not all read alike. Each states its entity's name more often than
# any other page does, so a search for the title ranks the entity's own page first.
_PERSON_TEMPLATES = (
    "{name} (born {birth_year}) is a {occupation}. Born in {born_in}, {surname} studied at {educated_at}.",
    "{name} is a {occupation} who was born in {born_in} in {birth_year}. "
    "{surname} later attended {educated_at}.",
    "{name} (born {birth_year} in {born_in}) is a {occupation}. {surname} was educated at {educated_at}.",
)
_COLOUR: dict[str, tuple[str, ...]] = {
    "person": (
        "{surname} is known for a patient, unhurried way of working.",
        "Colleagues describe {surname} as meticulous and private.",
        "{surname} has given few interviews and rarely appears in public.",
        "Early in life, {surname} worked briefly as a teacher.",
        "{surname} has received several regional honours.",
        "In later years, {surname} divided their time between teaching and travel.",
        "{surname} kept detailed diaries throughout a long career.",
    ),
    "country": (
        "The country is divided into several provinces.",
        "Its flag shows two horizontal bands.",
        "Agriculture and fishing remain important to the economy of {name}.",
        "Most of the country is covered by forest and low hills.",
    ),
    "city": (
        "The city is served by a regional railway line.",
        "Its main square hosts a weekly flower market.",
        "The local economy of {name} rests on trade and light industry.",
        "Winters there are long and snowy.",
        "A ring of parks surrounds the old town.",
    ),
    "university": (
        "It admits students from many countries.",
        "The campus is known for its botanical garden.",
        "Its rowing club is among the oldest in the region.",
        "Teaching at {name} is organised in small tutorial groups.",
    ),
    "company": (
        "The company employs several thousand people.",
        "Its shares are traded on the national stock exchange.",
        "Its logo has changed little since the early years.",
        "{alias} has opened offices in several neighbouring countries.",
    ),
    "band": (
        "The band is known for energetic live shows.",
        "Critics have praised the group's close harmonies.",
        "The group took a long hiatus before reuniting.",
        "Their songs often deal with travel and homesickness.",
    ),
    "film": (
        "Critics praised its photography and score.",
        "The film was restored for a later home release.",
        "It was a modest success at the box office.",
        "Much of the cast had never acted on screen before.",
    ),
    "novel": (
        "The novel was later translated into several languages.",
        "Critics praised its intricate structure.",
        "It has never been out of print.",
        "The story is told through letters and diary entries.",
    ),
    "album": (
        "Critics praised its production.",
        "The album was reissued with bonus material.",
        "Its cover art became widely recognised.",
        "Several of its songs became staples of the band's concerts.",
    ),
}
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "country": (
        "{name}, officially the {official}, is a country with a population of about {population}. "
        "The currency of {name} is the {currency}.",
        "{name} (the {official}) is a sovereign state whose currency is the {currency}. "
        "About {population} people live in {name}.",
    ),
    "city": (
        "{name} is a city in {country} with a population of {population}. "
        "{name} lies on a broad river plain.",
        "{name} is a city located in {country}. It has a population of {population}, and the old centre of "
        "{name} is known for its covered markets.",
        "With a population of {population}, {name} is one of the larger towns of {country}. "
        "{name} grew up around a medieval bridge.",
    ),
    "university": (
        "{name} is a public research university in {located_in}, founded in {founding_year}. "
        "{name} is organised into several faculties.",
        "Founded in {founding_year}, {name} is a university located in {located_in}. "
        "The library of {name} holds a large collection of maps.",
    ),
    "company": (
        "{name} (commonly known as {alias}) is a {industry} company founded in {founding_year} by "
        "{founded_by}. "
        "{name} is headquartered in {headquartered_in}.",
        "{name} is a {industry} company headquartered in {headquartered_in}. {founded_by} founded {name} in "
        "{founding_year}; it is often called simply {alias}.",
    ),
    "band": (
        "{name} are a {genre} band formed in {formed_in} in {formation_year}. {name} (often just {alias}) "
        "toured widely in their first years.",
        "{name}, also known as {alias}, are a {genre} group that formed in {formation_year} in {formed_in}. "
        "The line-up of {name} has changed several times.",
    ),
    "film": (
        "{name} is a {release_year} {genre} film directed by {directed_by}. {name} runs {minutes} minutes.",
        "Directed by {directed_by}, {name} is a {genre} film released in {release_year}. "
        "The running time of {name} is {minutes} minutes.",
        "{name} is a {genre} film by {directed_by}, first released in {release_year}. {name} was shot on "
        "location over a single summer.",
    ),
    "novel": (
        "{name} is a {genre} novel by {written_by}, first published in {publication_year}. "
        "{name} runs to {pages} pages.",
        "Written by {written_by}, {name} is a {genre} novel published in {publication_year}. "
        "The first edition of {name} had {pages} pages.",
    ),
    "album": (
        "{name} is the {ordinal} studio album by {performed_by}, released in {release_year}. "
        "{name} has {tracks} tracks.",
        "{name} is an album by {performed_by}, released in {release_year}. It contains {tracks} tracks, and "
        "{name} was recorded in under a month.",
    ),
}
