"""``agent-gym plot``: draw training runs' curves to a PNG."""

from __future__ import annotations

import argparse

__all__ = ["add_plot_arguments", "run_plot"]


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `agent-gym plot`."""
    from agent_gym.trainers.plot import DEFAULT_KEYS

    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="output directories of `agent-gym train`"
    )
    parser.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png, or ./curves.png)")
    parser.add_argument(
        "--keys", nargs="+", default=None, help=f"metrics to draw (default: {', '.join(DEFAULT_KEYS)})"
    )


def run_plot(ns: argparse.Namespace) -> int:
    """Entry point of `agent-gym plot`; returns an exit code."""
    from agent_gym.trainers.plot import plot_runs

    try:
        path = plot_runs(ns.run_dirs, ns.out, ns.keys)
    except (FileNotFoundError, ValueError) as error:
        print(f"agent-gym plot: {error}")
        return 2
    print(f"wrote {path}")
    return 0
