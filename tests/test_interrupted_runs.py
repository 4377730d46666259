"""Data that must never be lost: an `eval` or a `train` stopped by Ctrl-C (SIGINT) or SIGTERM keeps what it
finished, says where it is, and leaves the results of earlier runs as they were; the same command continues."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_gym.cli import main

WORLD = ["--env-kwarg", "num_pages=200", "--env-kwarg", "num_questions=20"]

# `agent-gym eval` in a child process, each episode made 0.2 s slower so that a signal lands mid-run.
_SLOW_EVAL = """
import sys, time
import agent_gym.evaluation as evaluation
from agent_gym.cli import main

play = evaluation.run_episode
def slow_episode(*args, **kwargs):
    time.sleep(0.2)
    return play(*args, **kwargs)
evaluation.run_episode = slow_episode
sys.exit(main(sys.argv[1:]))
"""


def _wait_for(condition: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the child"
        time.sleep(0.05)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


# ---------------------------------------------------------------------------------------------- eval


def test_an_interrupted_eval_rerun_keeps_the_earlier_results_and_reports_what_finished(tmp_path: Path) -> None:
    out = tmp_path / "oracle.jsonl"
    eval_args = ["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--out", str(out), "--no-progress", *WORLD]
    assert main([*eval_args, "--episodes", "3"]) == 0
    earlier = out.read_text(encoding="utf-8")

    child = subprocess.Popen([sys.executable, "-c", _SLOW_EVAL, *eval_args, "--episodes", "20"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = tmp_path / "oracle.partial.jsonl"
    _wait_for(lambda: len(_lines(partial)) >= 2)
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)

    assert child.returncode == 130
    assert out.read_text(encoding="utf-8") == earlier  # the complete earlier result survived the rerun
    finished = len(_lines(partial))
    row = next(line for line in stdout.splitlines() if "(partial)" in line)
    assert row.split(" | ")[1] == str(finished)  # the summary of what finished, marked partial
    assert f"after {finished} of 20 episodes" in stderr and str(partial) in stderr


def test_a_finished_eval_replaces_the_earlier_file_and_leaves_no_partial_file(tmp_path: Path) -> None:
    out = tmp_path / "oracle.jsonl"
    for episodes in ("3", "2"):
        assert main(["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--out", str(out), "--no-progress",
                     "--episodes", episodes, *WORLD]) == 0
    assert len(_lines(out)) == 2 and sorted(path.name for path in tmp_path.iterdir()) == ["oracle.jsonl"]


def test_evals_of_different_episode_counts_write_different_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for episodes in ("1", "2"):
        assert main(["eval", "AgentR1-Calculator-v0", "--policy", "random", "--episodes", episodes,
                     "--no-progress"]) == 0
    written = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert written == ["eval-AgentR1-Calculator-v0-random-1ep.jsonl", "eval-AgentR1-Calculator-v0-random-2ep.jsonl"]


def test_the_run_column_tells_apart_evals_whose_settings_differ_after_a_long_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for hops in (1, 2):
        assert main(["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--episodes", "1", "--no-progress",
                     *WORLD, "--env-kwarg", 'kinds=["bridge","comparison"]', "--env-kwarg", f"hops={hops}"]) == 0
    rows = [line.split(" | ")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("| oracle")]
    assert len(set(rows)) == 2 and "hops=1" in rows[0] and "hops=2" in rows[1]
