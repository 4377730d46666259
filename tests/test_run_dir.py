"""One run per run directory: train, sft and pretrain refuse to start on top of an earlier run unless told to
(--overwrite), continue the run there when they can (and say so), and never mix two runs' files."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import TINY_SYNTHHOP

from agent_gym.cli import main
from agent_gym.trainers.checkpoint import list_checkpoints
from agent_gym.trainers.metrics import read_metrics


def _train(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["train", "--model", str(model_dir), "--env", "AgentR1-SynthHop-v0", "--env-kwargs",
            json.dumps(TINY_SYNTHHOP), "--group-size", "2", "--tasks-per-step", "1", "--max-new-tokens", "8",
            "--max-turns", "2", "--eval-every", "0", "--save-every", "1", "--device", "cpu", "--torch-threads", "1",
            "--no-tensorboard", "--no-show-progress", "--output-dir", str(run_dir), *extra]


@pytest.mark.slow
def test_train_never_mixes_two_runs_in_one_directory(tiny_model_dir_for_synthhop, tmp_path, capsys):
    model, run = tiny_model_dir_for_synthhop, tmp_path / "run"
    assert main(_train(model, run, "--total-steps", "2")) == 0
    old_metrics = (run / "metrics.jsonl").read_text()
    old_final = (run / "final" / "model.safetensors").read_bytes()
    capsys.readouterr()

    # a new run into it is refused, and the old run is left as it was
    assert main(_train(model, run, "--resume", "never", "--total-steps", "1")) == 2
    message = capsys.readouterr().out.strip()
    assert "already holds another run" in message and "--overwrite" in message and "\n" not in message
    assert (run / "metrics.jsonl").read_text() == old_metrics
    assert [p.name for p in list_checkpoints(run)] == ["step_000001", "step_000002"]

    # resuming a run that is past --total-steps would write its later weights as this run's final/
    assert main(_train(model, run, "--total-steps", "1")) == 2
    assert "step 2" in capsys.readouterr().out
    assert (run / "final" / "model.safetensors").read_bytes() == old_final

    assert main(_train(model, run, "--total-steps", "3")) == 0
    assert "resumed from step 2" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]

    # --overwrite replaces the old run: none of its checkpoints or metrics survive into the new one
    assert main(_train(model, run, "--resume", "never", "--overwrite", "--total-steps", "1")) == 0
    assert "resumed" not in capsys.readouterr().out
    assert [p.name for p in list_checkpoints(run)] == ["step_000001"]
    assert [r["step"] for r in read_metrics(run)] == [1]


def _sft(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["sft", "--env", "AgentR1-SynthHop-v0", "--env-kwargs", json.dumps(TINY_SYNTHHOP), "--policy", "oracle",
            "--model", str(model_dir), "--out", str(out), "--episodes", "2", "--epochs", "1", "--batch-size", "2",
            "--max-length", "2048", "--torch-threads", "1", *extra]


@pytest.mark.slow
def test_sft_into_a_used_directory_is_refused_unless_overwrite(tiny_model_dir_for_synthhop, tmp_path, capsys):
    out = tmp_path / "sft"
    out.mkdir()
    (out / "notes.txt").write_text("an earlier experiment")
    assert main(_sft(tiny_model_dir_for_synthhop, out)) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]

    # 2 steps, checkpointed after step 1 (the last step is saved as the model itself)
    assert main(_sft(tiny_model_dir_for_synthhop, out, "--overwrite", "--epochs", "2", "--save-every", "1")) == 0
    assert (out / "sft_summary.json").is_file() and (out / "notes.txt").is_file()  # not the run's: kept
    assert "resumed" not in capsys.readouterr().out
    assert main(_sft(tiny_model_dir_for_synthhop, out, "--epochs", "2", "--save-every", "1")) == 0
    assert "resumed from step 1" in capsys.readouterr().out
    # a checkpoint of other settings is not continued with these: that run would be neither
    assert main(_sft(tiny_model_dir_for_synthhop, out, "--epochs", "2", "--save-every", "1", "--lr", "0.5")) == 2
    assert "lr=" in capsys.readouterr().err


SYNTH = {"num_pages": 60, "kinds": ["bridge"], "hops": [1, 2], "top_k": 2, "split": "all", "num_questions": 8}


def _pretrainer(tiny_model, run_dir: Path, **overrides):
    """A pretrainer of a fresh copy of the shared tiny model (each run trains its own)."""
    from agent_gym.warmstart.pretrain import PretrainConfig, Pretrainer

    model, tokenizer = copy.deepcopy(tiny_model[0]), tiny_model[1]
    settings = dict(model="unused", output_dir=str(run_dir), env_kwargs=SYNTH, induction_steps=2, drill_steps=0,
                    batch_tokens=128, induction_width=64, induction_rows=2, eval_every=0, save_every=1,
                    show_progress=False, torch_threads=1)
    settings.update(overrides)
    return Pretrainer(PretrainConfig(**settings), model, tokenizer)


def test_pretrain_refuses_a_used_directory_and_another_runs_checkpoint(tiny_model, tmp_path):
    from agent_gym.trainers.checkpoint import CheckpointError
    from agent_gym.trainers.run_dir import RunDirectoryError

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 7, "time": 0}\n')  # a run killed before its first checkpoint
    with pytest.raises(RunDirectoryError, match="--overwrite"):
        _pretrainer(tiny_model, run).train()
    assert (run / "metrics.jsonl").read_text() == '{"step": 7, "time": 0}\n'

    _pretrainer(tiny_model, run, overwrite=True).train()
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    with pytest.raises(CheckpointError, match="seed"):
        _pretrainer(tiny_model, run, seed=1, induction_steps=3).train()
    with pytest.raises(CheckpointError, match="step 2"):
        _pretrainer(tiny_model, run, induction_steps=1).train()
