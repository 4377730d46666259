"""The decision probe's records as curves (issue 25): for every RL run probed at two or more steps, the log-odds gap
between 2-hop and 1-hop questions and P(search again) on each hop count, by step, from its warm start's probe at
step 0. Greedy curves swing; these show whether the condition under them grows.

    python experiments/decision_curves.py                         # docs/results/decision_probe_e3.json
    python experiments/decision_curves.py RECORDS.json --out docs/results/decision_curves_e3.png

Records are `decision_probe.py --json-out`'s: one per adapter, named ``RUN step_0000NN`` for a run's checkpoint
and after the adapter's directory for a warm start (``sweep-e3-warm75``). A run named ``RECIPE-e3-warmNN-sS``
started from warm start NN, every other ``RECIPE-e3-sS`` from the sweep's choice (``--chosen``).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUN_STEP = re.compile(r"^(?P<recipe>.+?)-e3-(?:(?P<warm>warm\d+)-)?s(?P<seed>\d+) step_(?P<step>\d+)$")
PANELS = (("log-odds gap, 2-hop minus 1-hop", lambda r: r["log_odds_gap"]),
          ("P(search again), 1-hop questions", lambda r: r["1hop"]["p_search"]),
          ("P(search again), 2-hop questions", lambda r: r["2hop"]["p_search"]))


def run_curves(records: Mapping[str, Mapping[str, Any]], chosen: str = "warm75"
               ) -> dict[str, list[tuple[int, Mapping[str, Any]]]]:
    """Each probed run's records by step, its warm start's record at step 0 (when probed); runs probed at one step
    only are left out (no curve)."""
    runs: dict[str, dict[int, Mapping[str, Any]]] = {}
    for name, record in records.items():
        match = RUN_STEP.match(name)
        if match is None:
            continue
        run = name.split(" ")[0]
        runs.setdefault(run, {})[int(match["step"])] = record
        warm = records.get(f"sweep-e3-{match['warm'] or chosen}")
        if warm is not None:
            runs[run].setdefault(0, warm)
    return {run: sorted(points.items()) for run, points in sorted(runs.items()) if len(set(points) - {0}) > 1}


def plot(curves: Mapping[str, Sequence[tuple[int, Mapping[str, Any]]]], records: Mapping[str, Mapping[str, Any]],
         out: Path, chosen: str = "warm75") -> None:
    """Three panels, one line a run; the chosen warm start's value dashed, the 50 % warm start's dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a colour for each recipe (and warm start), a line style for each seed
    recipes = list(dict.fromkeys(run.rsplit("-s", 1)[0] for run in curves))
    colours = {recipe: plt.get_cmap("tab10")(index % 10) for index, recipe in enumerate(recipes)}
    styles = ("-", "--", "-.", ":")
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.6))
    for axis, (title, value_of) in zip(axes, PANELS, strict=True):
        for run, points in curves.items():
            recipe, seed = run.rsplit("-s", 1)
            axis.plot([step for step, _ in points], [value_of(record) for _, record in points], marker="o",
                      markersize=3, linewidth=1.2, color=colours[recipe], linestyle=styles[int(seed) % 4], label=run)
        for warm, style in ((chosen, "--"), ("warm50", ":")):
            record = records.get(f"sweep-e3-{warm}")
            if record is not None:
                axis.axhline(value_of(record), color="grey", linestyle=style, linewidth=0.9)
                axis.text(1.01, value_of(record), warm, transform=axis.get_yaxis_transform(), fontsize=7,
                          va="center")
        axis.set_title(title)
        axis.set_xlabel("RL step")
    for axis in axes[1:]:
        axis.set_ylim(-0.02, 1.02)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 * ((len(labels) + 2) // 3), 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", nargs="?", default=str(ROOT / "docs" / "results" / "decision_probe_e3.json"))
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "decision_curves_e3.png"))
    parser.add_argument("--chosen", default="warm75", help="the warm start of runs that do not name theirs")
    args = parser.parse_args(argv)
    records = json.loads(Path(args.records).read_text())
    curves = run_curves(records, args.chosen)
    plot(curves, records, Path(args.out), args.chosen)
    for run, points in curves.items():
        print(run, " ".join(f"{step}:{record['log_odds_gap']:.2f}" for step, record in points))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
