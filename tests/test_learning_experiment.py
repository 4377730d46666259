"""The learning experiment's script runs its pretraining stage end to end (a few steps, as CI can afford)."""

from __future__ import annotations

import argparse
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


def _learning_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("learning_experiment", ROOT / "experiments" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_hops_flag_mixes_hop_counts_in_train_and_eval_envs_and_keeps_the_held_out_world() -> None:
    learning = _learning_module()
    mixed, two = argparse.Namespace(hops=[1, 2]), argparse.Namespace(hops=[2])
    assert learning.train_env(mixed)["hops"] == [1, 2] and learning.eval_env(mixed)["hops"] == [1, 2]
    assert learning.train_env(two)["hops"] == 2 and learning.eval_env(two)["hops"] == 2
    assert learning.mixed_hops(mixed) and not learning.mixed_hops(two)
    # The eval world is never the training world, whatever the hops.
    assert learning.eval_env(mixed)["world_seed"] != learning.train_env(mixed)["world_seed"]
    assert learning.eval_env(mixed)["split"] == "test"


def test_a_run_killed_before_its_first_checkpoint_is_restarted_with_overwrite_and_a_checkpointed_one_resumes(
    tmp_path: Path,
) -> None:
    from agent_gym.trainers.checkpoint import CHECKPOINT_DIR, STATE_FILE

    learning = _learning_module()
    assert learning.fresh_flags(tmp_path / "never-started") == []
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')  # what a job killed during its first step leaves
    assert learning.fresh_flags(tmp_path) == ["--overwrite"]
    checkpoint = tmp_path / CHECKPOINT_DIR / "step_000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / STATE_FILE).write_bytes(b"state")
    assert learning.fresh_flags(tmp_path) == []  # resume it, never delete it


def test_a_train_process_killed_without_a_traceback_is_reported_with_the_likely_cause(tmp_path: Path) -> None:
    learning = _learning_module()
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    with pytest.raises(SystemExit, match=r"exit -9\): killed by SIGKILL.*out-of-memory.*--micro-batch-size"):
        learning._run(killed, tmp_path / "killed.log", "train x")
    # an ordinary failure keeps the plain message: its log holds the traceback
    with pytest.raises(SystemExit) as failed:
        learning._run([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "failed.log", "train y")
    assert str(failed.value) == f"train y failed (exit 3); see {tmp_path / 'failed.log'}"
