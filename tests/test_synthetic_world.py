"""The synthetic world: determinism, scale, and questions whose gold decompositions its pages support."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from agent_gym.envs.synthetic_world import World, generate_world
from agent_gym.rewards import normalize_answer
from agent_gym.tasks import Task, TaskSet

ALL_HOPS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def world() -> World:
    return generate_world(3_000, seed=7)


@pytest.fixture(scope="module")
def tasks(world: World) -> list[Task]:
    return world.questions(ALL_HOPS, 600, seed=3)


def _fingerprint(world: World, tasks: list[Task]) -> str:
    payload = {
        "docs": world.documents(),
        "tasks": [[t.id, t.question, t.answers, t.supporting_titles, t.decomposition, t.kind] for t in tasks],
    }
    return hashlib.sha256(json.dumps(payload, default=repr).encode()).hexdigest()


def _words(text: str) -> str:
    return f" {normalize_answer(text)} "


# ------------------------------------------------------------------------------------------ determinism


def test_same_seed_gives_identical_pages_and_questions() -> None:
    first, second = generate_world(500, seed=11), generate_world(500, seed=11)
    assert first.documents() == second.documents()
    assert first.questions(ALL_HOPS, 50, seed=2) == second.questions(ALL_HOPS, 50, seed=2)


def test_same_seed_gives_identical_world_in_a_process_with_another_hash_seed() -> None:
    world = generate_world(500, seed=5)
    expected = _fingerprint(world, world.questions(ALL_HOPS, 40, seed=1))
    script = (
        "import hashlib, json\n"
        "from agent_gym.envs.synthetic_world import generate_world\n"
        "w = generate_world(500, seed=5); t = w.questions((1, 2, 3, 4), 40, seed=1)\n"
        "payload = {'docs': w.documents(), 'tasks': [[x.id, x.question, x.answers, x.supporting_titles,"
        " x.decomposition, x.kind] for x in t]}\n"
        "print(hashlib.sha256(json.dumps(payload, default=repr).encode()).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == expected


def test_different_seeds_give_different_worlds() -> None:
    first, second = generate_world(500, seed=1), generate_world(500, seed=2)
    shared_titles = {p.title for p in first.pages} & {p.title for p in second.pages}
    assert len(shared_titles) < 10


def test_different_question_seeds_give_different_questions(world: World) -> None:
    first = [t.question for t in world.questions(ALL_HOPS, 50, seed=1)]
    second = [t.question for t in world.questions(ALL_HOPS, 50, seed=2)]
    assert first != second


def test_shorter_draw_is_a_prefix_of_a_longer_one(world: World) -> None:
    assert world.questions(ALL_HOPS, 20, seed=4) == world.questions(ALL_HOPS, 60, seed=4)[:20]


# ------------------------------------------------------------------------------------------ pages


def test_world_has_one_page_per_requested_entity() -> None:
    assert len(generate_world(1_234, seed=0).pages) == 1_234
    assert len(generate_world(num_pages=321, seed=0).documents()) == 321


def test_hundred_thousand_pages_generate_with_unique_titles_and_ids() -> None:
    world = generate_world(num_pages=100_000, seed=0)
    assert len(world.pages) == 100_000
    assert len({page.title for page in world.pages}) == 100_000
    assert len({page.id for page in world.pages}) == 100_000


def test_documents_have_the_retrieval_corpus_shape(world: World) -> None:
    documents = world.documents()
    assert all(set(doc) == {"id", "title", "text"} for doc in documents)
    assert all(isinstance(v, str) and v for doc in documents for v in doc.values())


def test_every_page_starts_with_or_states_its_own_title(world: World) -> None:
    assert all(page.title in page.text for page in world.pages)


def test_no_entity_name_is_a_word_level_substring_of_another(world: World) -> None:
    names = [_words(page.title) for page in world.pages]
    holders: dict[str, list[int]] = defaultdict(list)
    for index, name in enumerate(names):
        for token in set(name.split()):
            holders[token].append(index)
    for index, name in enumerate(names):
        rarest = min(name.split(), key=lambda token: len(holders[token]))
        assert all(other == index or name not in names[other] for other in holders[rarest]), name


@pytest.mark.parametrize("bad", [0, 39, -5, 2.5, "100", True])
def test_too_small_or_non_integer_size_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="entities"):
        generate_world(bad)  # type: ignore[arg-type]


def test_conflicting_size_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        generate_world(100, num_pages=200)


# ------------------------------------------------------------------------------------------ questions


def test_every_hop_answer_is_stated_on_its_supporting_page(world: World, tasks: list[Task]) -> None:
    for task in tasks:
        for hop in task.decomposition:
            assert hop.answer in world.page(hop.title).text, (task.question, hop)


def test_every_answer_alias_names_the_same_thing_as_the_answer(world: World, tasks: list[Task]) -> None:
    for task in tasks:
        canonical, *aliases = task.answers
        if _is_title(world, canonical):
            assert all(alias in world.page(canonical).text for alias in aliases), task.answers
        else:  # a number: the only alias drops the thousands separators
            assert all(alias == canonical.replace(",", "") for alias in aliases), task.answers


def _is_title(world: World, text: str) -> bool:
    try:
        world.page(text)
    except KeyError:
        return False
    return True


def test_every_supporting_title_is_a_page(world: World, tasks: list[Task]) -> None:
    for task in tasks:
        assert task.supporting_titles == tuple(dict.fromkeys(hop.title for hop in task.decomposition))
        for title in task.supporting_titles:
            assert world.page(title).title == title


def test_hop_query_is_the_title_of_the_page_it_looks_up(tasks: list[Task]) -> None:
    assert all(hop.query == hop.title for task in tasks for hop in task.decomposition)


def test_question_text_names_no_hop_answer(tasks: list[Task]) -> None:
    for task in tasks:
        for hop in task.decomposition:
            assert _words(hop.answer) not in _words(task.question), (task.question, hop.answer)


def test_bridge_hops_chain_each_answer_into_the_next_lookup(tasks: list[Task]) -> None:
    bridges = [t for t in tasks if t.kind == "bridge"]
    assert bridges
    for task in bridges:
        for hop, next_hop in zip(task.decomposition, task.decomposition[1:], strict=False):
            assert next_hop.title == hop.answer
        assert task.answers[0] == task.decomposition[-1].answer


def test_question_has_the_requested_number_of_hops(tasks: list[Task]) -> None:
    for task in tasks:
        assert len(task.decomposition) == task.metadata["hops"]
    assert {task.metadata["hops"] for task in tasks} == set(ALL_HOPS)
    assert {task.kind for task in tasks} == {"bridge", "comparison"}


def test_comparison_answer_is_the_entity_with_the_winning_value(world: World, tasks: list[Task]) -> None:
    comparisons = [t for t in tasks if t.kind == "comparison"]
    assert len(comparisons) > 50
    for task in comparisons:
        # the last hop of each side looks up the compared entity's value
        value_hops = [hop for hop in task.decomposition if re.fullmatch(r"[\d,]+", hop.answer)]
        assert len(value_hops) == 2, task.decomposition
        (a, value_a), (b, value_b) = ((hop.title, int(hop.answer.replace(",", ""))) for hop in value_hops)
        assert value_a != value_b
        larger_wins = any(word in task.question for word in ("later", "larger", "more recently"))
        expected = a if (value_a > value_b) == larger_wins else b
        assert task.answers[0] == expected, (task.question, value_hops)
        assert world.entity(expected).name == expected


def test_comparison_questions_are_not_repeated_with_swapped_sides(world: World) -> None:
    tasks = world.questions((2,), 300, seed=9, kinds=("comparison",))
    keys = [frozenset(re.split(r", | or ", t.question.rstrip("?"))) for t in tasks]
    assert len(set(keys)) == len(keys)


def test_task_ids_are_unique_and_name_seed_and_hops(world: World, tasks: list[Task]) -> None:
    assert len({task.id for task in tasks}) == len(tasks)
    TaskSet(tasks + world.questions(ALL_HOPS, 100, seed=3, split="test"))  # raises on duplicate ids
    assert tasks[0].id == f"synth-w7-all-s3-h{tasks[0].metadata['hops']}-0"


def test_train_and_test_questions_never_overlap(world: World) -> None:
    train = world.questions(ALL_HOPS, 400, seed=0, split="train")
    test = world.questions(ALL_HOPS, 200, seed=0, split="test")
    assert {t.question for t in train}.isdisjoint({t.question for t in test})
    train_starts = {t.decomposition[0].title for t in train if t.kind == "bridge"}
    test_starts = {t.decomposition[0].title for t in test if t.kind == "bridge"}
    assert train_starts.isdisjoint(test_starts)


def test_asking_for_more_questions_than_the_world_holds_fails_clearly() -> None:
    small = generate_world(40, seed=0)
    with pytest.raises(ValueError, match="distinct questions"):
        small.questions(1, 100_000, seed=0, split="test")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hops": 0},
        {"hops": 5},
        {"hops": ()},
        {"hops": (1, "2")},
        {"kinds": ("bridge", "trivia")},
        {"kinds": ()},
        {"split": "dev"},
        {"hops": 1, "kinds": ("comparison",)},
        {"n": -1},
    ],
)
def test_bad_question_arguments_raise_value_error(world: World, kwargs: dict) -> None:
    arguments = {"hops": 2, "n": 5, "seed": 0, **kwargs}
    with pytest.raises(ValueError):
        world.questions(**arguments)


# ------------------------------------------------------------------------------------------ retrieval


class _TantivyBM25:
    """A real BM25 index (tantivy, English stemming) over title + text, for checking retrievability."""

    def __init__(self, world: World) -> None:
        tantivy = pytest.importorskip("tantivy")
        builder = tantivy.SchemaBuilder()
        builder.add_unsigned_field("row", stored=True, indexed=True)
        builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
        self.index = tantivy.Index(builder.build())
        writer = self.index.writer()
        for row, page in enumerate(world.pages):
            document = tantivy.Document()
            document.add_unsigned(
                "row", row
            )  # Document(row=...) panics the writer (shared/notes/retrieval.md)
            document.add_text("body", f"{page.title}\n{page.text}")
            writer.add_document(document)
        writer.commit()
        self.index.reload()
        self.searcher = self.index.searcher()
        self.world = world

    def top_titles(self, query: str, k: int = 1) -> list[str]:
        parsed, _errors = self.index.parse_query_lenient(re.sub(r"[^\w\s]", " ", query), ["body"])
        hits = self.searcher.search(parsed, k).hits
        return [self.world.pages[self.searcher.doc(address)["row"][0]].title for _score, address in hits]


@pytest.fixture(scope="module")
def bm25(world: World) -> _TantivyBM25:
    return _TantivyBM25(world)


def test_each_hop_query_ranks_its_supporting_page_first_with_bm25(
    bm25: _TantivyBM25, tasks: list[Task]
) -> None:
    misses = [
        hop.query for task in tasks for hop in task.decomposition if bm25.top_titles(hop.query) != [hop.title]
    ]
    assert misses == []


def test_one_hop_question_is_answered_by_its_top_bm25_hit(
    world: World, bm25: _TantivyBM25, tasks: list[Task]
) -> None:
    one_hop = [t for t in tasks if t.metadata["hops"] == 1]
    assert one_hop
    for task in one_hop:
        (top,) = bm25.top_titles(task.question)
        assert task.answers[0] in world.page(top).text, task.question


def test_multi_hop_bridge_question_is_rarely_answered_by_its_top_bm25_hit(
    world: World, bm25: _TantivyBM25, tasks: list[Task]
) -> None:
    multi_hop = [t for t in tasks if t.kind == "bridge" and t.metadata["hops"] >= 2]
    answered = sum(
        task.answers[0] in world.page(bm25.top_titles(task.question)[0]).text for task in multi_hop
    )
    assert answered / len(multi_hop) < 0.1


def test_a_fresh_world_is_the_reserved_seed_and_shares_no_page_title_with_a_run_world() -> None:
    from agent_gym.envs.synthhop import FRESH_WORLD_SEEDS
    from agent_gym.make import make_env

    settings = {"num_pages": 200, "split": "all", "num_questions": 10}
    fresh = make_env("AgentR1-SynthHop-v0", {**settings, "world_seed": 5, "fresh_world": 3})
    reserved = make_env("AgentR1-SynthHop-v0", {**settings, "world_seed": FRESH_WORLD_SEEDS + 3})
    usual = make_env("AgentR1-SynthHop-v0", {**settings, "world_seed": 0})
    try:
        titles = {env: {page.title for page in env.unwrapped.tools["search"].documents} for env in (fresh, usual)}
        assert [task.question for task in fresh.unwrapped.tasks] == [task.question for task in reserved.unwrapped.tasks]
        assert titles[fresh].isdisjoint(titles[usual])
        with pytest.raises(ValueError, match="fresh_world must be at least 0"):
            make_env("AgentR1-SynthHop-v0", {**settings, "fresh_world": -1})
    finally:
        for env in (fresh, reserved, usual):
            env.close()
