"""The learning experiment's script runs its pretraining stage end to end (a few steps, as CI can afford)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_learning_script_pretrains_for_a_few_steps_and_measures_the_copy_skill(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "experiments" / "learning.py"), "--out", str(tmp_path), "--stage",
               "pretrain", "--pretrained", "", "--induction-steps", "2", "--drill-steps", "2",
               "--skill-episodes", "4", "--threads", "1"]
    subprocess.run(command, check=True, cwd=tmp_path, timeout=600, capture_output=True)
    skill = json.loads((tmp_path / "copy_skill.json").read_text())
    assert {"turn1/exact", "turn2/exact", "turn3/exact", "min_exact"} <= set(skill)
    assert (tmp_path / "pretrain" / "final" / "config.json").is_file()
    metrics = [json.loads(line) for line in (tmp_path / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in metrics] == [1, 2, 3, 4]
    assert "copy/min_exact" in metrics[-1]
