"""The agent-gym command: envs lists ids, eval prints a table and writes JSONL, play runs an episode from stdin."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import agent_gym
from agent_gym.cli import main, parse_env_kwargs

SMALL_WORLD_ARGS = ["--env-kwarg", "num_pages=2000", "--env-kwarg", "num_questions=50"]
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def feed_stdin(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> None:
    """Make input() return these lines, then raise EOFError as an exhausted stdin does."""
    remaining: Iterator[str] = iter(lines)

    def fake_input(prompt: str = "") -> str:
        try:
            return next(remaining)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)


# ---------------------------------------------------------------------------------------------- envs


def test_envs_lists_every_registered_id(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == sorted(agent_gym.registered_envs())


def test_envs_shows_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    main(["envs"])
    assert "arithmetic word problems" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- eval


def test_eval_prints_a_table_with_the_policy_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "oracle.jsonl"
    main(["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--episodes", "5", "--out", str(out),
          "--no-progress", *SMALL_WORLD_ARGS])
    table = capsys.readouterr().out
    assert "| run | episodes | em | f1 |" in table
    # the settings' short form, then the hash of all of them (the one in the default file name)
    assert re.search(r"^\| oracle num_pages=2000 num_questions=50 [0-9a-f]{8} \| 5 \| 1\.000 \|", table, re.M)


def test_eval_writes_one_jsonl_line_per_episode(tmp_path: Path) -> None:
    out = tmp_path / "oracle.jsonl"
    main(["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--episodes", "5", "--out", str(out),
          "--no-progress", *SMALL_WORLD_ARGS])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 5 and all(record["em"] == 1.0 for record in records)


def test_eval_exits_zero(tmp_path: Path) -> None:
    assert main(["eval", "AgentR1-Calculator-v0", "--policy", "random", "--episodes", "2",
                 "--out", str(tmp_path / "r.jsonl"), "--no-progress"]) == 0


def test_eval_of_several_policies_prints_one_row_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["eval", "AgentR1-SynthHop-v0", "--policy", "oracle,naive-rag", "--episodes", "3",
          "--out", str(tmp_path / "e.jsonl"), "--no-progress", *SMALL_WORLD_ARGS])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| oracle")
            or line.startswith("| naive-rag")]
    assert len(rows) == 2


# ---------------------------------------------------------------------------------------------- play


def test_play_runs_an_episode_to_the_end(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    feed_stdin(monkeypatch, ['<tool_call>{"name": "search", "arguments": {"query": "founded"}}</tool_call>', ".",
                             "<answer>nobody</answer>", "."])
    assert main(["play", "AgentR1-SynthHop-v0", "--seed", "0", *SMALL_WORLD_ARGS]) == 0
    output = capsys.readouterr().out
    assert "<tool_response>" in output and "episode over (answered)" in output


def test_play_shows_the_question(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    feed_stdin(monkeypatch, [":quit"])
    main(["play", "AgentR1-Calculator-v0"])
    assert "== question ==\n" in capsys.readouterr().out


def test_play_stops_cleanly_at_end_of_input(monkeypatch: pytest.MonkeyPatch) -> None:
    feed_stdin(monkeypatch, ["<tool_call>"])
    assert main(["play", "AgentR1-Calculator-v0"]) == 0


def test_play_through_real_stdin_in_a_subprocess() -> None:
    turns = "<answer>42</answer>\n.\n"
    completed = subprocess.run([sys.executable, "-m", "agent_gym.cli", "play", "AgentR1-Calculator-v0"],
                               input=turns, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert "episode over (answered)" in completed.stdout, completed.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- main


def test_unknown_command_exits_two_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "commands:" in capsys.readouterr().out


def test_env_kwargs_parse_json_values_and_keep_strings() -> None:
    assert parse_env_kwargs(["hops=3", "kinds=[\"bridge\"]", "tool_format=xml"]) == {
        "hops": 3, "kinds": ["bridge"], "tool_format": "xml"}


def test_env_kwarg_without_equals_sign_exits_with_message() -> None:
    with pytest.raises(SystemExit, match="--env-kwarg expects key=value, got 'hops'"):
        parse_env_kwargs(["hops"])


# ---------------------------------------------------------------------------------------------- help


@pytest.mark.parametrize(("group", "subcommands"), [("data", ["fetch", "where"]), ("index", ["build", "serve"]),
                                                    ("model", ["init"])])
def test_each_command_group_has_help_listing_its_subcommands(
    capsys: pytest.CaptureFixture[str], group: str, subcommands: list[str]
) -> None:
    assert main([group, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: agent-gym {group}")
    assert all(f"  {name} " in out for name in subcommands)


@pytest.mark.parametrize("group", ["data", "index", "model"])
def test_a_bare_command_group_prints_its_help_and_exits_2(capsys: pytest.CaptureFixture[str], group: str) -> None:
    assert main([group]) == 2
    assert f"usage: agent-gym {group}" in capsys.readouterr().err


def test_an_unknown_subcommand_of_a_group_names_the_group_and_its_subcommands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["index", "bulid"]) == 2
    assert "agent-gym index: unknown command 'bulid'; choose build or serve" in capsys.readouterr().err


def test_top_level_help_shows_the_command_argument_and_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: agent-gym [-h] COMMAND ...")
    assert "index build" in out and "model init" in out


@pytest.mark.parametrize("argv", [["--help"], ["data", "--help"], ["model", "--help"]])
def test_help_aligns_every_command_description_in_one_column(capsys: pytest.CaptureFixture[str],
                                                             argv: list[str]) -> None:
    from agent_gym.cli import COMMANDS

    assert main(argv) == 0
    listing = capsys.readouterr().out.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    helps = {help_ for help_, _, _ in COMMANDS.values()}
    columns = {line.index(help_) for line in listing for help_ in helps if line.endswith(help_)}
    assert len(listing) > 1 and len(columns) == 1, listing


def test_train_help_cites_nothing_a_user_does_not_have(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "DESIGN" not in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- user errors


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "NoSuchEnv-v0"], "agent-gym eval: Environment `NoSuchEnv` doesn't exist"),
        (["eval", "AgentR1-Calculator-v0", "--policy", "nope"], "agent-gym eval: unknown policy 'nope'"),
        (["eval", "AgentR1-SynthHop-v0", "--env-kwarg", "hops=99"], "agent-gym eval: cannot make AgentR1-SynthHop-v0"),
        (["eval", "AgentR1-Calculator-v0", "--env-kwarg", "hops"], "agent-gym eval: --env-kwarg expects key=value"),
        (["eval", "AgentR1-Calculator-v0", "--env-kwargs", "[1]"],
         "agent-gym eval: --env-kwargs expects a JSON object"),
        (["eval", "AgentR1-Calculator-v0", "--episodes", "0"], "agent-gym eval: --episodes must be at least 1, got 0"),
        (["eval", "AgentR1-Calculator-v0", "--episodes", "-3"], "agent-gym eval: --episodes must be at least 1"),
        (["play", "NoSuchEnv-v0"], "agent-gym play: Environment `NoSuchEnv` doesn't exist"),
        (["play", "AgentR1-Calculator-v0", "--task-id", "nope"], "agent-gym play: "),
        (["sft", "--env", "NoSuchEnv-v0", "--model", "m", "--out", "o"], "agent-gym sft: Environment `NoSuchEnv`"),
        (["sft", "--env", "AgentR1-Calculator-v0", "--policy", "nope", "--model", "m", "--out", "o"],
         "agent-gym sft: unknown policy 'nope'"),
        (["model", "init", "--corpus-from-env", "NoSuchEnv-v0", "--out", "o"],
         "agent-gym model init: Environment `NoSuchEnv`"),
        (["data", "where", "nope"], "agent-gym data where: unknown dataset 'nope'"),
        (["data", "fetch", "hotpotqa", "--split", "test"], "agent-gym data fetch: unknown split 'test'"),
    ],
)
def test_user_errors_print_one_line_naming_the_command_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*argv, *(["--no-progress"] if argv[0] == "eval" else [])]) == 2
    error = capsys.readouterr().err
    assert error.startswith(message) and error.count("\n") == 1, error


def test_data_fetch_of_a_file_it_cannot_download_says_where_to_put_it_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_GYM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("AGENT_GYM_OFFLINE", "1")
    assert main(["data", "fetch", "hotpotqa"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("agent-gym data fetch: hotpotqa dev: hotpot_dev_distractor_v1.json is not in the cache")
    assert error.count("\n") == 1 and str(tmp_path / "datasets" / "hotpotqa") in error


def test_play_of_an_unknown_task_id_says_which_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["play", "AgentR1-Calculator-v0", "--task-id", "nope"]) == 2
    assert "no task with id 'nope'" in capsys.readouterr().err


def test_train_with_an_env_kwarg_the_env_refuses_exits_2_before_loading_a_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status = main(["train", "--model", str(tmp_path / "no-model"), "--output-dir", str(tmp_path / "run"),
                   "--env-kwarg", "hops=99"])
    captured = capsys.readouterr()
    assert status == 2 and "cannot make AgentR1-SynthHop-v0" in captured.out + captured.err


def test_eval_says_when_the_env_has_fewer_tasks_than_episodes_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--episodes", "5", "--no-progress",
                 "--out", str(tmp_path / "o.jsonl"), "--env-kwarg", "num_pages=2000",
                 "--env-kwarg", "num_questions=3"]) == 0
    captured = capsys.readouterr()
    assert "has 3 tasks: running 3 episodes, not 5" in captured.err
    assert re.search(r"^\| oracle num_pages=2000 num_questions=3 [0-9a-f]{8} \| 3 \|", captured.out, re.M)


def test_oracle_refuses_an_env_without_gold_decompositions(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_gym import Task, register_tool_env, tool

    @tool
    def echo(text: str) -> str:
        """Repeat the text.

        Args:
            text: what to repeat.
        """
        return text

    register_tool_env("NoDecompositions-v0", tools=[echo], tasks=[Task("t1", "Say hi.", ("hi",))])
    monkeypatch.chdir(tmp_path)
    try:
        status = main(["eval", "NoDecompositions-v0", "--policy", "oracle", "--episodes", "1", "--no-progress"])
    finally:
        import gymnasium as gym

        gym.registry.pop("NoDecompositions-v0")
    error = capsys.readouterr().err
    assert status == 2 and "oracle" in error and "gold decomposition" in error and "gold-search" in error


def test_eval_output_file_names_have_no_colon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "agent_gym:AgentR1-Calculator-v0", "--policy", "random", "--episodes", "1",
                 "--no-progress"]) == 0
    written = [path.name for path in (tmp_path / "runs").iterdir()]
    assert written == ["eval-agent_gym_AgentR1-Calculator-v0-random-1ep.jsonl"]


def test_evals_with_other_env_kwargs_write_other_files_and_keep_the_run_column_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    long_text = "Answer " + "very " * 40 + "carefully."
    for hops in (1, 2):
        assert main(["eval", "AgentR1-SynthHop-v0", "--policy", "naive-rag", "--episodes", "1", "--no-progress",
                     *SMALL_WORLD_ARGS, "--env-kwarg", f"hops={hops}",
                     "--env-kwarg", f"instruction={long_text}"]) == 0
    written = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert len(written) == 2 and all("hops" in name for name in written)  # the second did not overwrite the first
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| naive-rag")]
    assert len(rows) == 2 and all(len(row.split(" | ")[0]) <= 64 for row in rows)


def test_short_settings_names_each_setting_within_the_limit() -> None:
    from agent_gym.eval_output import short_settings

    text = short_settings({"data_path": "/home/me/" + "deep/" * 30 + "hotpot_dev.json", "hops": 3})
    assert text.startswith("data_path=hotpot_dev.json") and "hops=3" in text and len(text) <= 48


@pytest.mark.slow
def test_evals_of_two_models_in_folders_of_the_same_name_write_two_files(
    tiny_model_dir_for_synthhop: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from conftest import TINY_SYNTHHOP

    for run in ("a", "b"):
        shutil.copytree(tiny_model_dir_for_synthhop, tmp_path / run / "final")
    monkeypatch.chdir(tmp_path)
    for run in ("a", "b"):
        assert main(["eval", "AgentR1-SynthHop-v0", "--model", f"{run}/final", "--episodes", "1", "--no-progress",
                     "--max-new-tokens", "4", "--env-kwargs", json.dumps(TINY_SYNTHHOP)]) == 0
    assert len(list((tmp_path / "runs").iterdir())) == 2


# ---------------------------------------------------------------------------------------------- env kwargs


def test_eval_takes_env_kwargs_as_json_and_as_pairs_with_pairs_winning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--episodes", "2", "--no-progress",
                 "--out", str(tmp_path / "o.jsonl"), "--env-kwargs", '{"num_pages": 2000, "num_questions": 9}',
                 "--env-kwarg", "num_questions=50"]) == 0
    assert re.search(r"^\| oracle num_pages=2000 num_questions=50 [0-9a-f]{8} \| 2 \|", capsys.readouterr().out, re.M)


@pytest.mark.parametrize("command", ["sft", "model init", "train", "eval", "play"])
def test_every_env_command_accepts_both_env_kwargs_forms(command: str) -> None:
    from agent_gym.cli import _build_parser
    from agent_gym.cli.args import env_kwargs_from_args

    required = {"sft": ["--env", "E", "--model", "m", "--out", "o"], "model init": ["--corpus-from-env", "E",
                "--out", "o"], "train": [], "eval": ["E"], "play": ["E"]}[command]
    namespace = _build_parser(command).parse_args(
        [*required, "--env-kwargs", '{"hops": 1, "split": "test"}', "--env-kwarg", "hops=3"])
    if command == "train":  # the JSON form is TrainConfig's own field
        from agent_gym.cli.train import config_from_train_args

        assert config_from_train_args(namespace).env_kwargs == {"hops": 3, "split": "test"}
    else:
        assert env_kwargs_from_args(namespace) == {"hops": 3, "split": "test"}


@pytest.mark.parametrize("port", ["99999", "65536", "-5"])
def test_index_serve_refuses_a_port_out_of_range(port: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["index", "serve", str(tmp_path), "--port", port])
    assert exited.value.code == 2
    assert "a port is a number from 0 to 65535" in capsys.readouterr().err


def test_envs_lists_the_remote_env_the_readme_uses(capsys: pytest.CaptureFixture[str]) -> None:
    main(["envs"])
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("AgentGym-Remote-v0 "))
    assert "agent-gym env serve" in line and "base_url=" in line


@pytest.mark.parametrize("command", ["sft", "train", "eval", "play", "model pretrain"])
def test_every_command_that_runs_a_model_takes_torch_threads(command: str) -> None:
    from agent_gym.cli import _build_parser

    required = {"sft": ["--env", "E", "--model", "m", "--out", "o"], "eval": ["E"], "play": ["E"]}.get(command, [])
    assert _build_parser(command).parse_args([*required, "--torch-threads", "3"]).torch_threads == 3


def test_play_applies_torch_threads_before_loading_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["play", "AgentR1-Calculator-v0", "--model", "smollm2-135m-instruct", "--torch-threads", "-1"]) == 2
    assert capsys.readouterr().err.startswith("agent-gym play: torch threads must be >= 0")
