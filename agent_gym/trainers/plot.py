"""`agent-gym plot RUN_DIR [RUN_DIR ...]`: training curves from metrics.jsonl to one PNG.

Several run directories are overlaid on the same axes (one line per run), so GRPO vs PPO, or loss mask on vs
off, read off one figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent_gym.error import InvalidValue
from agent_gym.trainers import metrics as m
from agent_gym.trainers.metrics import read_metrics

DEFAULT_KEYS = (
    m.REWARD,
    m.EM,
    m.EVAL_EM,
    m.EVAL_F1,
    m.TURNS,
    m.TOOL_CALL_VALIDITY,
    m.RESPONSE_LENGTH,
    m.POLICY_LOSS,
    m.VALUE_LOSS,
    m.ENTROPY,
    m.APPROX_KL,
    m.CLIPFRAC,
    m.KL_REF,
    m.TOKENS_PER_S,
)


@dataclass
class PlotConfig:
    """The settings of ``agent-gym plot`` (its flags come from these fields)."""

    run_dirs: list[str] = field(metadata={
        "positional": True, "metavar": "RUN_DIR", "help": "output directories of `agent-gym train`"})
    out: str | None = field(default=None, metadata={
        "help": "PNG path (default: RUN_DIR/curves.png, or ./curves.png)"})
    keys: list[str] | None = field(default=None, metadata={
        "help": f"metrics to draw (default: {', '.join(DEFAULT_KEYS)})"})


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def plot_runs(
    run_dirs: Sequence[str | Path], out: str | Path | None = None, keys: Sequence[str] | None = None
) -> Path:
    """Draw every key that any run logged, one panel per key; returns the PNG path.

    Default output: ``RUN_DIR/curves.png`` for one run, ``./curves.png`` for several.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on training machines
    import matplotlib.pyplot as plt

    if not run_dirs:
        raise InvalidValue("plot_runs needs at least one run directory")
    runs = {Path(run_dir): read_metrics(run_dir) for run_dir in run_dirs}
    wanted = list(keys) if keys else list(DEFAULT_KEYS)
    present = [k for k in wanted if any(_series(records, k)[0] for records in runs.values())]
    if not present:
        raise InvalidValue(f"none of the metrics {wanted} were logged in {', '.join(map(str, runs))}")
    columns = min(3, len(present))
    rows = math.ceil(len(present) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows), squeeze=False)
    for axis, key in zip(axes.flat, present, strict=False):
        for run_dir, records in runs.items():
            steps, values = _series(records, key)
            if steps:
                axis.plot(
                    steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=run_dir.name
                )
        axis.set_title(key, fontsize=10)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(present) :]:
        axis.set_visible(False)
    if len(runs) > 1:  # below the panels: inside the first one it covered its curves
        handles, labels = axes.flat[0].get_legend_handles_labels()
        legend_columns = min(len(labels), 4)
        legend_rows = -(-len(labels) // legend_columns)
        figure.legend(handles, labels, loc="lower center", ncol=legend_columns, fontsize=8, frameon=False)
        figure.tight_layout(rect=(0, min(0.4, (0.05 * legend_rows + 0.02) / rows), 1, 1))
    else:
        figure.tight_layout()
    path = Path(out) if out else (Path(run_dirs[0]) / "curves.png" if len(runs) == 1 else Path("curves.png"))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
