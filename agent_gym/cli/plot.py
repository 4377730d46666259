"""``agent-gym plot``: draw training runs' curves to a PNG."""

from __future__ import annotations

import argparse

__all__ = ["add_plot_arguments", "run_plot"]


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `agent-gym plot`: the fields of ``agent_gym.trainers.plot.PlotConfig``."""
    from agent_gym.cli.config_flags import add_dataclass_arguments
    from agent_gym.trainers.plot import PlotConfig

    add_dataclass_arguments(parser, PlotConfig, explicit_only=False)


def run_plot(ns: argparse.Namespace) -> int:
    """Entry point of `agent-gym plot`; returns an exit code."""
    from agent_gym.cli.config_flags import config_from_namespace
    from agent_gym.trainers.plot import PlotConfig, plot_runs

    config = config_from_namespace(ns, PlotConfig)
    try:
        path = plot_runs(config.run_dirs, config.out, config.keys)
    except (FileNotFoundError, ValueError) as error:
        print(f"agent-gym plot: {error}")
        return 2
    print(f"wrote {path}")
    return 0
