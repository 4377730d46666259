"""The `agent_gym.cli` package: flags generated from config dataclasses, library errors as one-line exit-2
messages, and the command line kept out of the library."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent_gym.cli import main
from agent_gym.cli.args import DefaultsHelpFormatter
from agent_gym.cli.config_flags import add_dataclass_arguments, config_from_namespace

PACKAGE = Path(__file__).resolve().parents[1] / "agent_gym"


@dataclass
class _Settings:
    steps: int = field(default=7, metadata={"help": "optimizer steps to run"})
    name: str = field(default="run", metadata={"help": "what the run is called"})
    fast: bool = field(default=False, metadata={"help": "skip the slow checks"})
    limit: float | None = field(default=None, metadata={"help": "stop at this reward"})


def _help_of(parser: argparse.ArgumentParser, flag: str) -> str:
    action = next(action for action in parser._actions if flag in action.option_strings)
    return parser._get_formatter()._expand_help(action)


@pytest.mark.parametrize("explicit_only", [True, False])
def test_each_flags_help_and_default_come_from_its_field(explicit_only: bool) -> None:
    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    add_dataclass_arguments(parser, _Settings, explicit_only=explicit_only)
    help_ = _help_of(parser, "--steps")
    assert "optimizer steps to run" in help_ and "7" in help_
    assert config_from_namespace(parser.parse_args([]), _Settings) == _Settings()
    parsed = config_from_namespace(parser.parse_args(["--steps", "3", "--fast", "--limit", "0.5"]), _Settings)
    assert parsed == _Settings(steps=3, fast=True, limit=0.5)


def test_sft_flags_are_generated_from_sft_config_with_its_defaults() -> None:
    from agent_gym.cli import _build_parser
    from agent_gym.cli.train import config_from_sft_args
    from agent_gym.warmstart.sft import SFTConfig

    parser = _build_parser("sft")
    namespace = parser.parse_args(["--env", "E", "--model", "m", "--out", "o"])
    # every field one flag, every default the field's: the one config SFTTrainer runs on
    assert config_from_sft_args(namespace) == SFTConfig(env="E", model="m", output_dir="o")
    for config_field in dataclasses.fields(SFTConfig):
        flag = "--" + config_field.name.replace("_", "-")
        assert config_field.metadata["help"] in _help_of(parser, flag).replace("%%", "%"), flag
    pairs = parser.parse_args(["--env", "E", "--model", "m", "--out", "o", "--env-kwargs", '{"hops": 1, "split": "x"}',
                               "--env-kwarg", "hops=2", "--policy-kwarg", "p_multihop=0.4"])
    config = config_from_sft_args(pairs)
    assert (config.env_kwargs, config.policy_kwargs) == ({"hops": 2, "split": "x"}, {"p_multihop": 0.4})


def test_sft_names_its_output_folder_output_dir_as_train_does_and_still_takes_out() -> None:
    from agent_gym.cli import _build_parser

    parser = _build_parser("sft")
    assert parser.parse_args(["--env", "E", "--model", "m", "--output-dir", "o"]).output_dir == "o"
    assert parser.parse_args(["--env", "E", "--model", "m", "--out", "o"]).output_dir == "o"
    assert "--output-dir OUTPUT_DIR, --out OUTPUT_DIR" in parser.format_help()
    assert "--output-dir" in _build_parser("train").format_help()


def test_model_init_needs_exactly_one_corpus_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["model", "init", "--corpus", "a.txt", "--corpus-from-env", "E", "--out", "o"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_library_error_becomes_one_line_naming_the_command_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-corpus.txt"
    assert main(["model", "init", "--corpus", str(missing), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err == f"agent-gym model init: corpus file {missing} does not exist\n"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_module_outside_cli_imports_argparse_or_the_cli() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(name for name in _imports(path)
                                               if name == "argparse" or name.startswith(("agent_gym.cli", "argparse.")))
        for path in PACKAGE.rglob("*.py") if "cli" not in path.relative_to(PACKAGE).parts[:1]
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_listing_the_envs_imports_no_torch() -> None:
    code = "import sys; from agent_gym.cli import main; main(['envs']); print('torch' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                               cwd=PACKAGE.parent)
    assert completed.stdout.splitlines()[-1] == "False", completed.stderr[-2000:]


def test_python_dash_m_agent_gym_cli_runs_the_command() -> None:
    completed = subprocess.run([sys.executable, "-m", "agent_gym.cli", "--help"], capture_output=True, text=True,
                               timeout=120, cwd=PACKAGE.parent)
    assert completed.returncode == 0 and completed.stdout.startswith("usage: agent-gym")
