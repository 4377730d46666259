"""docs/results/curves.png: the legend sits below the panels, clear of the curves, and every variant shows."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_learning_experiment import _learning_module

ROOT = Path(__file__).resolve().parent.parent




def test_the_legend_covers_no_panel_and_each_band_has_its_lines_colour(tmp_path: Path, monkeypatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = json.loads((ROOT / "docs" / "results" / "learning.json").read_text())
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to inspect it
    _learning_module().plot_curves(tmp_path, records, {"greedy": {"em": 0.185}})
    [figure] = figures
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    assert all(axis.get_legend() is None for axis in figure.axes) and len(figure.legends) == 1
    legend = figure.legends[0].get_window_extent(renderer)
    for axis in figure.axes:
        assert not legend.overlaps(axis.get_window_extent(renderer)), "the legend covers a panel"
    em = figure.axes[0]
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "GRPO" in " ".join(labels) and "warm start" in labels
    styles = {(line.get_linestyle(), line.get_marker()) for line in em.get_lines() if line.get_label() != "warm start"}
    assert len(styles) == len(em.get_lines()) - 1  # no two variants drawn alike
    widths = [line.get_linewidth() for line in em.get_lines() if line.get_label() != "warm start"]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == len(widths)  # coinciding means both show
    for line, band in zip([line for line in em.get_lines() if line.get_label() != "warm start"], em.collections,
                          strict=True):
        assert matplotlib.colors.same_color(line.get_color(), band.get_facecolor()[0][:3])


def test_agent_gym_plot_puts_the_runs_legend_below_the_panels(tmp_path: Path, monkeypatch) -> None:
    import matplotlib.pyplot as plt

    from agent_gym.trainers import metrics as m
    from agent_gym.trainers.metrics import MetricsLogger
    from agent_gym.trainers.plot import plot_runs

    for name, offset in (("grpo", 0.0), ("ppo", 0.1)):
        with MetricsLogger(tmp_path / name, tensorboard=False) as logger:
            for step in range(1, 4):
                logger.log(step, {m.REWARD: step * 0.1 + offset, m.POLICY_LOSS: -offset})
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot_runs([tmp_path / "grpo", tmp_path / "ppo"], out=tmp_path / "curves.png")
    [figure] = figures
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    assert len(figure.legends) == 1 and all(axis.get_legend() is None for axis in figure.axes)
    legend = figure.legends[0].get_window_extent(renderer)
    assert not any(legend.overlaps(axis.get_window_extent(renderer)) for axis in figure.axes if axis.get_visible())
