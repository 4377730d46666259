"""``agent-gym data``: fetch the datasets' official files, say where they go, export an env's tasks for verl."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent_gym.cli.args import UsageError, add_env_kwargs_arguments, cli_make_env, env_kwargs_from_args, user_errors
from agent_gym.cli.config_flags import add_dataclass_arguments

__all__ = ["add_data_arguments", "add_export_verl_arguments", "run_data_fetch", "run_data_where", "run_export_verl"]


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``data fetch`` and ``data where``: the fields of ``DatasetFileConfig``."""
    from agent_gym.envs.datasets.download import DatasetFileConfig

    add_dataclass_arguments(parser, DatasetFileConfig, explicit_only=False)


def run_data_fetch(args: argparse.Namespace) -> int:
    from agent_gym.envs.datasets import DatasetNotAvailable, fetch

    # An unknown name or split, or a file neither cached nor downloadable (DatasetNotAvailable, which says where
    # to put it): one line and exit 2, as every command reports a user's error.
    with user_errors(ValueError, DatasetNotAvailable):
        path = fetch(args.name, args.split, setting=args.setting)
    print(path)
    return 0


def run_data_where(args: argparse.Namespace) -> int:
    from agent_gym.envs.datasets import expected_path

    with user_errors(ValueError):
        print(expected_path(args.name, args.split, setting=args.setting))
    return 0


def add_export_verl_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``data export-verl``: the fields of ``VerlExportConfig``, then the env kwargs."""
    from agent_gym.adapters.verl_dataset import VerlExportConfig

    add_dataclass_arguments(parser, VerlExportConfig, explicit_only=False)
    add_env_kwargs_arguments(parser)


def run_export_verl(args: argparse.Namespace) -> int:
    from agent_gym.adapters.verl_dataset import verl_rows, write_verl_parquet

    env_kwargs = {**env_kwargs_from_args(args), "split": args.split}
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    cli_make_env(args.env_id, env_kwargs).close()  # an unknown id or a refused split fails here, with the reason
    with user_errors(ValueError, KeyError):
        rows = verl_rows(args.env_id, env_kwargs, limit=args.limit, max_tokens_per_turn=args.max_tokens_per_turn)
    out = Path(args.out or f"data/verl/{args.env_id}_{args.split}.parquet")
    write_verl_parquet(rows, out)
    print(f"{len(rows)} rows of {args.env_id} ({args.split}) written to {out}")
    return 0
