"""One library's run of ``agent-gym bench``, in a process of its own: ``python -m agent_gym.cli.bench_runner``.

The bench starts one per (library, seed), with this interpreter or the peer venv's (TRL), so the runs never
share memory or a library's pins.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from agent_gym.bench.runners import RUNNERS, BenchSettings, run

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one library's run of agent-gym bench (started by the bench)")
    parser.add_argument("--library", required=True, choices=sorted(RUNNERS))
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--settings", required=True, help="BenchSettings as JSON")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    run(args.library, BenchSettings(**json.loads(args.settings)), args.seed, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
