"""The calculator task: safe evaluation, the ``calculate`` tool, word problems and their answer checker."""

from __future__ import annotations

import builtins
import pickle
import re
import time
from fractions import Fraction

import pytest

from agent_gym.envs.word_problems import NumberChecker, generate_arithmetic_tasks, parse_number
from agent_gym.tools.calculator import CalculatorError, calculate, format_number, safe_eval

# ------------------------------------------------------------------------------------------ safe_eval


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2", 3),
        ("4382 - 1297 + 3 * 845", 5620),
        ("7 / 2", Fraction(7, 2)),
        ("6 / 3", 2),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("17 % 5", 2),
        ("2 ** 10", 1024),
        ("2 ** -2", Fraction(1, 4)),
        ("-(3 - 5)", 2),
        ("+4", 4),
        ("((1 + 2) * (3 + 4))", 21),
        ("abs(-12)", 12),
        ("round(7 / 3, 2)", Fraction(233, 100)),
        ("round(2.5)", 2),
        ("min(4, 9, 1)", 1),
        ("max(4, 9, 1)", 9),
        ("sqrt(144)", 12),
        ("sqrt(2)", 2**0.5),
        ("floor(7 / 2)", 3),
        ("ceil(7 / 2)", 4),
        ("0.5 * 4", 2.0),
        ("2 ** 0.5", 2**0.5),
        ("(-2) ** 2.0", 4.0),
        ("3 × 4 − 2 ÷ 2", 11),
        ("  12  ", 12),
    ],
)
def test_safe_eval_computes_arithmetic_exactly(expression: str, expected: object) -> None:
    value = safe_eval(expression)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("1 / (2 - 2)", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("9 ** 9 ** 9", "too large"),
        ("2 ** 1000", "too large"),
        ("10 ** 16", "too large"),
        ("99999999 * 99999999", "too large"),
        ("1" * 17, "too large"),
        ("1e300 * 1e300", "too large"),
        ("x + 1", "unknown name 'x'"),
        ("__import__('os').system('true')", "unknown function"),
        ("math.sqrt(4)", "unknown function"),
        ("open('/etc/passwd')", "unknown function"),
        ("(1).__class__", "unsupported syntax"),
        ("'ab' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j * 2", "only numbers"),
        ("[1, 2]", "unsupported syntax"),
        ("lambda: 1", "unsupported syntax"),
        ("1 if 2 else 3", "unsupported syntax"),
        ("1 < 2", "unsupported syntax"),
        ("4,382 + 1", "commas"),
        ("2 ^ 10", "write 2 ** 10"),
        ("3 << 2", "unsupported operator"),
        ("~5", "unsupported syntax"),
        ("(-8) ** 0.5", "negative number to a fractional power"),
        ("sqrt(-1)", "square root of a negative"),
        ("abs(1, 2)", "abs() takes 1 arguments"),
        ("max(3)", "max() takes 2 to 32 arguments"),
        ("round(1.5, 0.5)", "second argument"),
        ("abs(x=1)", "positional arguments only"),
        ("max(*[1, 2])", "positional arguments only"),
        ("1 +", "syntax error"),
        ("(((", "syntax error"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("1\x00 + 2", "null bytes"),
        ("+".join(["1"] * 60), "more than 100 parts"),
    ],
)
def test_safe_eval_refuses_with_a_clear_message(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=re.escape(message)):
        safe_eval(expression)


def test_calculator_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        safe_eval("1 / 0")


def test_megabyte_input_is_refused_by_length_before_parsing() -> None:
    with pytest.raises(CalculatorError, match="1048576 characters long; the limit is 200"):
        safe_eval("(" * (1 << 20))


def test_deep_nesting_is_refused_not_a_recursion_crash() -> None:
    nested = "(" * 5_000 + "1" + ")" * 5_000
    with pytest.raises(CalculatorError):
        safe_eval(nested, max_chars=20_000, max_nodes=100_000)


@pytest.mark.parametrize("depth", [1_500, 20_000])  # too deep for the evaluator; too deep for the parser
def test_deep_unary_chain_is_refused_not_a_recursion_crash(depth: int) -> None:
    with pytest.raises(CalculatorError):
        safe_eval("-" * depth + "1", max_chars=50_000, max_nodes=100_000)


def test_non_string_expression_is_refused() -> None:
    with pytest.raises(CalculatorError, match="must be a string"):
        safe_eval(12)  # type: ignore[arg-type]


def test_limits_are_configurable() -> None:
    assert safe_eval("10 ** 16", max_abs=1e20) == 10**16
    with pytest.raises(CalculatorError, match="too large"):
        safe_eval("1000 * 1000", max_abs=1e5)
    with pytest.raises(CalculatorError, match="exponent"):
        safe_eval("1 ** 50", max_exponent=10)


def test_safe_eval_works_with_eval_and_exec_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("safe_eval must not call eval/exec")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    assert safe_eval("(4382 - 1297) + 3 * 845") == 5620
    with pytest.raises(CalculatorError):
        safe_eval("__import__('os')")


# ------------------------------------------------------------------------------------------ formatting


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (5888, "5888"),
        (-12, "-12"),
        (Fraction(7, 2), "3.5"),
        (Fraction(1, 3), "0.333333333333"),
        (Fraction(123456789012345, 2), "61728394506172.5"),
        (Fraction(1, 1000), "0.001"),
        (4.0, "4"),
        (0.1 + 0.2, "0.3"),
        (2**0.5, "1.41421356237"),
        (-0.0, "0"),
        (1e-9, "1e-09"),
    ],
)
def test_format_number_is_exact_for_integers_and_rounds_others(value: object, text: str) -> None:
    assert format_number(value) == text  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ the tool


def test_calculate_tool_returns_the_formatted_result() -> None:
    result = calculate.call({"expression": "(4382 - 1297) + 3 * 845"})
    assert result.ok and result.text == "5620"


def test_calculate_tool_turns_division_by_zero_into_a_failed_result() -> None:
    result = calculate.call({"expression": "10 / (5 - 5)"})
    assert not result.ok
    assert result.text == "Error: division by zero"


def test_calculate_tool_fails_cleanly_on_wrong_argument_types() -> None:
    assert not calculate.call({"expression": 12}).ok
    assert not calculate.call({}).ok
    assert not calculate.call({"expression": "9 ** 9 ** 9"}).ok


@pytest.mark.parametrize("expression", [
    "((1/999999999999999)**1000)**1000",  # held the interpreter lock for 13 s
    "(((1/999)**1000)**1000)**30",  # had not returned after 90 s
    "(1/3)**700", "(3/4)**700", "7 ** -400", "1 + (1/97)**160",
])
def test_a_fraction_too_fine_to_compute_is_refused_at_once(expression: str) -> None:
    started = time.perf_counter()
    result = calculate.call({"expression": expression})
    assert not result.ok and "result too precise" in result.text and "limit is 1,024" in result.text
    assert time.perf_counter() - started < 2.0  # a guard, not a benchmark: the refusal comes before the work


def test_fractions_within_the_bit_limit_stay_exact_and_floats_still_underflow_quietly() -> None:
    assert safe_eval("(1/3) ** 600") == Fraction(1, 3**600)
    assert safe_eval("(1/999999999999999) ** 10 * 10 ** 15") == Fraction(10**15, 999999999999999**10)
    assert safe_eval("0.001 ** 1000") == 0.0
    with pytest.raises(CalculatorError, match="result too precise"):
        safe_eval("(1/3) ** 20", max_bits=16)


def test_calculate_tool_schema_requires_the_expression() -> None:
    schema = calculate.schema()["function"]
    assert schema["name"] == "calculate"
    assert schema["parameters"]["required"] == ["expression"]
    assert schema["parameters"]["properties"]["expression"]["type"] == "string"


def test_calculate_tool_survives_pickling() -> None:
    assert pickle.loads(pickle.dumps(calculate)).call({"expression": "2 * 21"}).text == "42"


# ------------------------------------------------------------------------------------------ word problems


@pytest.fixture(scope="module")
def problems() -> list:
    return generate_arithmetic_tasks(200, seed=0)


def test_same_seed_gives_the_same_problems() -> None:
    first, second = generate_arithmetic_tasks(30, seed=5), generate_arithmetic_tasks(30, seed=5)
    assert [(t.id, t.question, t.answers, t.decomposition) for t in first] == [
        (t.id, t.question, t.answers, t.decomposition) for t in second
    ]
    assert [t.question for t in generate_arithmetic_tasks(30, seed=6)] != [t.question for t in first]


def test_shorter_draw_is_a_prefix_of_a_longer_one() -> None:
    assert generate_arithmetic_tasks(10, seed=2) == generate_arithmetic_tasks(25, seed=2)[:10]


def test_each_hop_answer_is_the_calculator_value_of_its_query(problems: list) -> None:
    for task in problems:
        for hop in task.decomposition:
            assert format_number(safe_eval(hop.query)) == hop.answer
        assert task.answers == (task.decomposition[-1].answer,)


def test_hops_chain_every_intermediate_result_into_a_later_step(problems: list) -> None:
    for task in problems:
        hops = task.decomposition
        for index, hop in enumerate(hops[:-1]):
            later_numbers = {n for later in hops[index + 1 :] for n in re.findall(r"\d+", later.query)}
            assert hop.answer in later_numbers, (task.question, hop)


def test_problems_need_two_to_four_operations_on_multi_digit_numbers(problems: list) -> None:
    for task in problems:
        assert 2 <= len(task.decomposition) <= 4
        assert task.metadata["operations"] == len(task.decomposition)
        assert sum(len(n.replace(",", "")) >= 2 for n in re.findall(r"\d[\d,]*", task.question)) >= 2
        assert int(task.answers[0]) >= 100
    assert len({task.metadata["template"] for task in problems}) >= 8


def test_problem_ids_and_questions_are_unique(problems: list) -> None:
    assert len({t.id for t in problems}) == len(problems)
    assert len({t.question for t in problems}) == len(problems)
    assert all(t.kind == "arithmetic" for t in problems)


def test_train_and_test_problems_never_overlap() -> None:
    train = {t.question for t in generate_arithmetic_tasks(300, seed=0, split="train")}
    test_same_seed = {t.question for t in generate_arithmetic_tasks(100, seed=0, split="test")}
    test_other_seed = {t.question for t in generate_arithmetic_tasks(100, seed=1, split="test")}
    assert train.isdisjoint(test_same_seed | test_other_seed)


@pytest.mark.parametrize("kwargs", [{"split": "dev"}, {"n": -1}, {"n": 2.5}])
def test_bad_generator_arguments_raise_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        generate_arithmetic_tasks(**{"n": 3, "seed": 0, **kwargs})


# ------------------------------------------------------------------------------------------ the checker


@pytest.mark.parametrize(
    "answer",
    [
        "5888",
        "5,888",
        "5,888, I think",
        "$5,888",
        "5888.0",
        "5888 crates",
        " The total is 5,888 dollars.",
        "5888.000",
    ],
)
def test_checker_accepts_the_number_however_written(answer: str) -> None:
    assert NumberChecker("5888")(answer) == 1.0


@pytest.mark.parametrize(
    "answer", ["5887", "58,88", "-5888", "5888.5", "about 3 then 5888", "", "no idea", "5.888e3"]
)
def test_checker_rejects_other_numbers_and_non_numbers(answer: str) -> None:
    assert NumberChecker("5888")(answer) == 0.0


def test_checker_rejects_non_string_answers() -> None:
    assert NumberChecker("5888")(None) == 0.0  # type: ignore[arg-type]


def test_generated_task_checker_accepts_its_answer_and_survives_pickling(problems: list) -> None:
    task = pickle.loads(pickle.dumps(problems[0]))
    answer = int(task.answers[0])
    assert task.checker(f"{answer:,} units") == 1.0
    assert task.checker(str(answer + 1)) == 0.0


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("$1,234.50", Fraction(2469, 2)),
        ("−7", Fraction(-7)),
        ("x = 12,345,678", Fraction(12345678)),
        ("none", None),
    ],
)
def test_parse_number_reads_the_first_number(text: str, value: Fraction | None) -> None:
    assert parse_number(text) == value
