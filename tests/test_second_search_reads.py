"""Reading why a run's 2-hop episodes failed (issue 25): each episode's second search, classed against the task's
gold pages."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

import second_search_reads  # noqa: E402

from agent_gym.tasks import Task  # noqa: E402
from tests.conftest import TINY_SYNTHHOP  # noqa: E402

TASK = Task("q1", "What is the population of the city where Thouzosp Industries is headquartered?", ("177,200",),
            ("Thouzosp Industries", "Stafanold Falls"))
FIRST = ('<tool_call>\n{"name": "search", "arguments": {"query": "Thouzosp Industries"}}\n</tool_call><|im_end|>\n'
         "<|im_start|>tool\nDoc 1 (Title: Thouzosp Industries) Thouzosp Industries is headquartered in Stafanold "
         "Falls.<|im_end|>\n<|im_start|>assistant\n")


def second(query: str, result: str) -> str:
    return (FIRST + f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}"}}}}\n</tool_call>'
            f"<|im_end|>\n<|im_start|>tool\n{result}<|im_end|>\n<|im_start|>assistant\n<answer>x</answer>")


@pytest.mark.parametrize(("response", "expected"), [
    (FIRST + "<answer>Stafanold Falls</answer>", "one search"),
    (second("stafanold falls", "Doc 1 (Title: Stafanold Falls) It has a population of 177,200."), "bridge query"),
    (second("Stafanold", "Doc 1 (Title: Stafanold Falls) It has a population of 177,200."), "bridge page found"),
    (second("Stafanolafirn", "No results found."), "nothing found"),
    (second("Thouzosp Industries", "Doc 1 (Title: Thouzosp Industries) ..."), "first entity again"),
    (second("Stugeimb", "Doc 1 (Title: Stugeimb) Stugeimb is a city."), "another entity"),
    (second("Stafanold Falls\\q", "No results found."), "nothing found"),  # an escape JSON rejects, kept as written
])
def test_each_second_search_gets_its_class(response: str, expected: str) -> None:
    assert second_search_reads.second_search_class(response, TASK) == expected


def test_a_run_is_read_over_its_2hop_episodes_by_global_step() -> None:
    bridge = second("Stafanold Falls", "Doc 1 (Title: Stafanold Falls) It has a population of 177,200.")
    records = [
        {"step": 1, "task_id": "q1", "task_fields": {"hops": 2}, "em": 1.0, "response": bridge},
        {"step": 2, "task_id": "q1", "task_fields": {"hops": 2}, "em": 0.0, "response": FIRST + "<answer>x</answer>"},
        {"step": 6, "task_id": "q1", "task_fields": {"hops": 2}, "em": 0.0, "response": bridge},
        {"step": 6, "task_id": "other", "task_fields": {"hops": 1}, "em": 1.0, "response": ""},  # not read
    ]
    reading = second_search_reads.read_run(records, {"q1": TASK}, offset=25, window=5)

    assert reading["episodes"] == 3 and reading["steps"] == [26, 31]
    assert reading["classes"]["bridge query"] == {"episodes": 2, "share": 2 / 3, "em": 0.5}
    assert reading["classes"]["one search"]["em"] == 0.0 and reading["classes"]["nothing found"]["em"] is None
    assert list(reading["windows"]) == ["26-30", "31-35"]  # local steps 1-5 and 6 after an offset of 25
    assert reading["windows"]["26-30"]["em"] == 0.5 and reading["windows"]["26-30"]["one search"] == 0.5
    assert reading["windows"]["31-35"]["bridge query"] == 1.0 and reading["windows"]["31-35"]["em"] == 0.0


def test_the_script_rebuilds_a_runs_tasks_and_writes_its_reading(tmp_path: Path, capsys) -> None:
    env_kwargs = {**TINY_SYNTHHOP, "max_turns": 4}
    env = gym.make("AgentR1-SynthHop-v0", **env_kwargs)
    task = env.unwrapped.tasks[0]
    env.close()
    run = tmp_path / "grpo-s0"
    run.mkdir()
    (run / "run_config.json").write_text(json.dumps(
        {"kind": "train", "settings": {"env_id": "AgentR1-SynthHop-v0", "env_kwargs": env_kwargs}}))
    query = json.dumps(task.supporting_titles[-1])
    response = (f'<tool_call>{{"name": "search", "arguments": {{"query": "x"}}}}</tool_call><|im_end|>\n'
                f"<|im_start|>tool\nDoc 1<|im_end|>\n<|im_start|>assistant\n"
                f'<tool_call>{{"name": "search", "arguments": {{"query": {query}}}}}</tool_call>')
    (run / "rollouts.jsonl").write_text(json.dumps(
        {"step": 3, "task_id": task.id, "task_fields": {"hops": 2}, "em": 1.0, "response": response}) + "\n")

    assert second_search_reads.main([str(run), "--json-out", str(tmp_path / "reads.json")]) == 0
    reading = json.loads((tmp_path / "reads.json").read_text())["grpo-s0"]
    assert reading["classes"]["bridge query"] == {"episodes": 1, "share": 1.0, "em": 1.0}
    assert "1 2-hop episodes" in capsys.readouterr().out


def test_a_run_without_rollouts_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        second_search_reads.main([str(tmp_path)])
