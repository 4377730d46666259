"""Task records: a str where a tuple of strings belongs is one item, never its characters; bad fields are refused."""

from __future__ import annotations

import pytest
from conftest import FactLookup

from agent_gym.env import ToolEnv
from agent_gym.tasks import Task


def test_a_str_answer_is_one_answer_not_its_characters() -> None:
    assert Task("q", "How many feet in a mile?", answers="5280").answers == ("5280",)


def test_a_str_supporting_title_is_one_title() -> None:
    assert Task("q", "?", ("x",), supporting_titles="France").supporting_titles == ("France",)


def test_a_list_of_answers_becomes_a_tuple() -> None:
    assert Task("q", "?", answers=["Tokyo", "Tokio"]).answers == ("Tokyo", "Tokio")


def test_a_prefix_of_a_str_answer_scores_zero() -> None:
    env = ToolEnv([Task("mile", "How many feet in a mile?", answers="5280")], [FactLookup()])
    env.reset(seed=0)
    _, reward, terminated, _, _ = env.step("<answer>5</answer>")
    assert (terminated, reward) == (True, 0.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"answers": (5280,)}, r"Task 'q': answers must be strings, got int 5280; write answers=\('5280',\)"),
        ({"answers": 5280}, r"Task 'q': answers must be a str or a tuple of str, got int"),
        ({"supporting_titles": ("France", None)}, r"Task 'q': supporting_titles must be strings, got NoneType"),
        ({"question": None}, r"Task 'q': question must be a str, got NoneType"),
    ],
)
def test_bad_task_fields_raise_type_error_naming_the_fix(fields: dict, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Task(**({"id": "q", "question": "?", "answers": ("x",)} | fields))


def test_a_task_id_must_be_a_str() -> None:
    with pytest.raises(TypeError, match=r"Task id must be a str, got int 7"):
        Task(7, "?", ("x",))


@pytest.mark.parametrize("answers", [(), ("",), ("  ", "")])
def test_a_task_no_answer_can_match_is_refused(answers: tuple) -> None:
    with pytest.raises(ValueError, match=r"Task 'q': no answer can ever match"):
        Task("q", "?", answers)


def test_a_task_with_a_checker_needs_no_answers() -> None:
    assert Task("q", "?", (), checker=lambda answer: 1.0).answers == ()


def test_a_checker_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Task 'q': checker must be callable"):
        Task("q", "?", ("x",), checker="exact")
