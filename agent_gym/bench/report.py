"""One metrics schema for every library of ``agent-gym bench``, and the table and curves made from it.

Every runner appends :class:`BenchRecord` lines to its JSONL file: one at each held-out evaluation (episode 0,
every ``--eval-every`` training episodes, and the end), the last one flagged ``final`` with the process's peak RSS.
A library that could not run leaves one record whose ``status`` says why (``not installed: ...``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

__all__ = ["BenchRecord", "read_records", "format_table", "plot_curves", "draw_curves"]


@dataclass
class BenchRecord:
    """One point of one library's run (the bench's JSONL schema).

    Attributes:
        library: the bench's name for it (``ours-grpo``, ``trl-grpo``, ``sb3-ppo``, ``random``, ...).
        version: the library's version (agent-gym's for ours and the scripted baselines).
        seed: the run's seed.
        episodes: training episodes played so far (the shared budget; 0 for the starting point).
        wall_s: seconds since the run started (model loading excluded, evaluations included).
        train_reward: mean return of the training episodes since the previous record (None at episode 0).
        eval_em: held-out exact match, greedy, one episode per held-out task (the same tasks for every library).
        eval_f1: held-out F1.
        tokens: tokens the policy generated in training so far (None for policies that generate none).
        final: the run's last record.
        peak_rss_mb: the process's peak resident memory (final record only).
        status: ``ok``, or why the library did not run.
    """

    library: str
    version: str
    seed: int
    episodes: int
    wall_s: float
    train_reward: float | None = None
    eval_em: float | None = None
    eval_f1: float | None = None
    tokens: int | None = None
    final: bool = False
    peak_rss_mb: float | None = None
    status: str = "ok"

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


def read_records(paths: Iterable[str | Path]) -> list[BenchRecord]:
    """Every record of the given JSONL files (a torn last line, from a killed run, is skipped)."""
    names = {field.name for field in fields(BenchRecord)}
    records = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            records.append(BenchRecord(**{key: value for key, value in data.items() if key in names}))
    return records


def _mean_spread(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def format_table(records: Sequence[BenchRecord], libraries: Sequence[str]) -> str:
    """Markdown: per library, final held-out EM (mean ± std over seeds), F1, episodes/s, wall time, peak RSS."""
    lines = ["| library | version | seeds | held-out EM | held-out F1 | train episodes | episodes/s | wall s "
             "| peak RSS MB | tokens |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by_library: dict[str, list[BenchRecord]] = defaultdict(list)
    for record in records:
        by_library[record.library].append(record)
    for library in libraries:
        rows = by_library.get(library, [])
        problem = next((row.status for row in rows if row.status != "ok"), None)
        finals = [row for row in rows if row.final and row.status == "ok"]
        if problem or not finals:
            lines.append(f"| {library} | | | {problem or 'no result (see its log)'} | | | | | | |")
            continue
        trains = any(row.train_reward is not None for row in finals)  # scripted policies play no training episode
        rates = [row.episodes / row.wall_s for row in finals if trains and row.wall_s > 0 and row.episodes]
        tokens = [row.tokens for row in finals if row.tokens is not None]
        cells = [
            library, finals[0].version, str(len(finals)),
            _mean_spread([row.eval_em for row in finals if row.eval_em is not None]),
            _mean_spread([row.eval_f1 for row in finals if row.eval_f1 is not None]),
            str(finals[0].episodes) if trains else "none (scripted)",
            f"{statistics.fmean(rates):.2f}" if rates else "n/a",
            f"{statistics.fmean(row.wall_s for row in finals):.1f}",
            f"{max(row.peak_rss_mb or 0.0 for row in finals):.0f}",
            f"{statistics.fmean(tokens):.0f}" if tokens else "n/a",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(records: Sequence[BenchRecord], libraries: Sequence[str], out: str | Path) -> Path:
    """Write :func:`draw_curves`'s figure to ``out`` (PNG)."""
    import matplotlib.pyplot as plt

    figure = draw_curves(records, libraries)
    out = Path(out)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def draw_curves(records: Sequence[BenchRecord], libraries: Sequence[str]):  # -> matplotlib Figure
    """Held-out EM by training episodes and by wall time: one line per library (mean over seeds), a min-max band.

    Scripted policies (no training) appear on the episodes panel only, as the flat line they are. Each panel
    has its own legend, since the wall-time panel holds only the libraries that train.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for library in libraries:
        runs: dict[int, list[BenchRecord]] = defaultdict(list)
        for record in records:
            if record.library == library and record.status == "ok" and record.eval_em is not None:
                runs[record.seed].append(record)
        if not runs:
            continue
        trains = any(record.train_reward is not None for seed_records in runs.values() for record in seed_records)
        for axis, key in zip(axes, ("episodes", "wall_s") if trains else ("episodes",), strict=False):
            points: dict[float, list[float]] = defaultdict(list)
            for seed_records in runs.values():
                for index, record in enumerate(sorted(seed_records, key=lambda r: r.episodes)):
                    # wall times differ across seeds: align them by evaluation index, at their mean time
                    x = float(record.episodes) if key == "episodes" else float(index)
                    points[x].append(record.eval_em)
            xs = sorted(points)
            if key == "wall_s":
                times: dict[int, list[float]] = defaultdict(list)
                for seed_records in runs.values():
                    for index, record in enumerate(sorted(seed_records, key=lambda r: r.episodes)):
                        times[index].append(record.wall_s)
                xs_plot = [statistics.fmean(times[int(x)]) for x in xs]
            else:
                xs_plot = xs
            means = [statistics.fmean(points[x]) for x in xs]
            line, = axis.plot(xs_plot, means, marker="o", label=library)
            if any(len(points[x]) > 1 for x in xs):
                axis.fill_between(xs_plot, [min(points[x]) for x in xs], [max(points[x]) for x in xs],
                                  color=line.get_color(), alpha=0.2)
    for axis, label in zip(axes, ("training episodes", "wall seconds"), strict=True):
        axis.set_xlabel(label)
        axis.set_ylabel("held-out EM")
        axis.grid(alpha=0.3)
        if not math.isnan(axis.get_ylim()[0]):
            axis.set_ylim(bottom=-0.02)
    axes[1].set_xscale("symlog", linthresh=1.0)  # SB3 and scripted runs take seconds, LLM runs minutes
    axes[1].set_xlim(left=0.0)  # times are never negative; symlog would otherwise label -10^1 and -10^0
    # plain numbers: symlog's own labels read "5.06262×10⁻¹" on a short run
    axes[1].xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
    axes[1].xaxis.set_minor_formatter(NullFormatter())
    for axis in axes:
        if axis.get_lines():
            axis.legend()
    figure.suptitle("agent-gym bench: held-out EM (line: mean over seeds; band: min to max)")
    figure.tight_layout()
    return figure
