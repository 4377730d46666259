"""`agent-gym bench` builds no model for LLM libraries that cannot run; its wall-time panel reads plainly."""

from __future__ import annotations

import re

from agent_gym.bench.report import BenchRecord, draw_curves
from agent_gym.cli import main

SMALL = ["--env-kwarg", "hops=1", "--env-kwarg", "num_pages=200", "--env-kwarg", "num_questions=20"]


def test_no_model_is_built_when_no_requested_llm_library_is_installed(tmp_path, monkeypatch, capsys):
    import agent_gym.cli.bench as command

    built = []
    monkeypatch.setattr(command, "_build_default_model", lambda *args: built.append(args) or tmp_path)
    assert main(["bench", "--env", "AgentR1-SynthHop-v0", *SMALL, "--libraries", "trl-grpo", "--peer-python",
                 str(tmp_path / "no-python"), "--out", str(tmp_path / "bench")]) == 0
    assert built == []
    assert "| trl-grpo | | | not installed:" in capsys.readouterr().out


def test_the_wall_time_panel_has_a_legend_and_plain_tick_labels() -> None:
    records = [
        BenchRecord("ours-grpo", "0.1.0", 0, 0, 0.0, eval_em=0.0),
        BenchRecord("ours-grpo", "0.1.0", 0, 8, 0.4, train_reward=0.1, eval_em=0.2),
        BenchRecord("ours-grpo", "0.1.0", 0, 16, 0.6, train_reward=0.2, eval_em=0.3, final=True),
        BenchRecord("oracle", "0.1.0", 0, 0, 0.0, eval_em=1.0, final=True),
    ]
    figure = draw_curves(records, ["ours-grpo", "oracle"])
    figure.canvas.draw()
    episodes, wall = figure.axes
    assert [text.get_text() for text in wall.get_legend().get_texts()] == ["ours-grpo"]
    assert [text.get_text() for text in episodes.get_legend().get_texts()] == ["ours-grpo", "oracle"]
    labels = [label.get_text() for label in wall.get_xticklabels(which="both") if label.get_text()]
    assert labels and all(re.fullmatch(r"[−-]?\d+(\.\d+)?", label) for label in labels), labels
