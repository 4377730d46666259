"""Data that must never be lost: an `eval` or a `train` stopped by Ctrl-C (SIGINT) or SIGTERM keeps what it
finished, says where it is, and leaves the results of earlier runs as they were; the same command continues."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_SYNTHHOP
from support.signals import sigint_as_at_a_terminal

from agent_gym.cli import main

WORLD = ["--env-kwarg", "num_pages=200", "--env-kwarg", "num_questions=20"]

# `agent-gym eval` in a child process, each episode made 0.2 s slower so that a signal lands mid-run.
_SLOW_EVAL = """
import sys, time
import agent_gym.evaluation as evaluation
from agent_gym.cli import main

play = evaluation.run_episode
def slow_episode(*args, **kwargs):
    time.sleep(0.2)
    return play(*args, **kwargs)
evaluation.run_episode = slow_episode
sys.exit(main(sys.argv[1:]))
"""


def _signal_when(child: subprocess.Popen[str], condition: Callable[[], bool], number: int) -> tuple[str, str]:
    """Send ``child`` the signal once ``condition`` holds; its output once it has ended (killed if it hangs)."""
    deadline = time.monotonic() + 300  # generous: a loaded CI machine
    try:
        while not condition():
            assert child.poll() is None, f"the child ended before the signal: {child.communicate()}"
            assert time.monotonic() < deadline, "timed out waiting for the child"
            time.sleep(0.05)
        child.send_signal(number)
        return child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


# ---------------------------------------------------------------------------------------------- eval


def test_an_interrupted_eval_rerun_keeps_the_earlier_results_and_reports_what_finished(tmp_path: Path) -> None:
    out = tmp_path / "oracle.jsonl"
    eval_args = ["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--out", str(out), "--no-progress", *WORLD]
    assert main([*eval_args, "--episodes", "3"]) == 0
    earlier = out.read_text(encoding="utf-8")

    child = subprocess.Popen([sys.executable, "-c", _SLOW_EVAL, *eval_args, "--episodes", "20"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=sigint_as_at_a_terminal)
    partial = tmp_path / "oracle.partial.jsonl"
    stdout, stderr = _signal_when(child, lambda: len(_lines(partial)) >= 2, signal.SIGINT)

    assert child.returncode == 130
    assert out.read_text(encoding="utf-8") == earlier  # the complete earlier result survived the rerun
    finished = len(_lines(partial))
    row = next(line for line in stdout.splitlines() if "(partial)" in line)
    assert row.split(" | ")[1] == str(finished)  # the summary of what finished, marked partial
    assert f"after {finished} of 20 episodes" in stderr and str(partial) in stderr


def test_a_finished_eval_replaces_the_earlier_file_and_leaves_no_partial_file(tmp_path: Path) -> None:
    out = tmp_path / "oracle.jsonl"
    for episodes in ("3", "2"):
        assert main(["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--out", str(out), "--no-progress",
                     "--episodes", episodes, *WORLD]) == 0
    assert len(_lines(out)) == 2 and sorted(path.name for path in tmp_path.iterdir()) == ["oracle.jsonl"]


def test_evals_of_different_episode_counts_write_different_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for episodes in ("1", "2"):
        assert main(["eval", "AgentR1-Calculator-v0", "--policy", "random", "--episodes", episodes,
                     "--no-progress"]) == 0
    written = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert written == ["eval-AgentR1-Calculator-v0-random-1ep.jsonl", "eval-AgentR1-Calculator-v0-random-2ep.jsonl"]


def test_the_run_column_tells_apart_evals_whose_settings_differ_after_a_long_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for hops in (1, 2):
        assert main(["eval", "AgentR1-SynthHop-v0", "--policy", "oracle", "--episodes", "1", "--no-progress",
                     *WORLD, "--env-kwarg", 'kinds=["bridge","comparison"]', "--env-kwarg", f"hops={hops}"]) == 0
    rows = [line.split(" | ")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("| oracle")]
    assert len(set(rows)) == 2 and "hops=1" in rows[0] and "hops=2" in rows[1]


# ---------------------------------------------------------------------------------------------- train


def _train_flags(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["train", "--model", str(model_dir), "--env", "AgentR1-SynthHop-v0", "--env-kwargs",
            json.dumps(TINY_SYNTHHOP), "--group-size", "2", "--tasks-per-step", "1", "--max-new-tokens", "8",
            "--max-turns", "2", "--eval-every", "0", "--save-every", "0", "--total-steps", "3", "--device", "cpu",
            "--torch-threads", "1", "--dtype", "float32", "--no-tensorboard", "--output-dir", str(run_dir), *extra]


def _config(model_dir: Path, run_dir: Path, **overrides: Any) -> Any:
    from agent_gym.trainers.config import TrainConfig

    settings = dict(model=str(model_dir), env_id="AgentR1-SynthHop-v0", env_kwargs=TINY_SYNTHHOP, group_size=2,
                    tasks_per_step=1, total_steps=3, max_new_tokens=8, max_turns=2, eval_every=0, eval_episodes=2,
                    save_every=0, output_dir=str(run_dir), tensorboard=False, show_progress=False, device="cpu",
                    torch_threads=1, dtype="float32", seed=0)
    settings.update(overrides)
    return TrainConfig(**settings)


class SignalAtReset:
    """Env factories whose envs send this process ``number`` at the ``at``-th reset among them all."""

    def __init__(self, number: int, at: int) -> None:
        self.number, self.at, self.resets = number, at, 0

    def factory(self, env_kwargs: dict[str, Any]) -> Callable[[], Any]:
        import gymnasium as gym

        outer = self

        class Signalling(gym.Wrapper):
            def reset(self, **kwargs: Any) -> Any:
                outer.resets += 1
                if outer.resets == outer.at:
                    os.kill(os.getpid(), outer.number)
                return self.env.reset(**kwargs)

        return lambda: Signalling(gym.make("AgentR1-SynthHop-v0", **env_kwargs))


def _trainer(config: Any, env_fns: Any = None, eval_env_fns: Any = None) -> Any:
    from agent_gym.trainers.trainer import Trainer

    return Trainer(config, env_fns=env_fns, eval_env_fns=eval_env_fns)


def _weights(run_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(run_dir / "final" / "model.safetensors")


def _steps(run_dir: Path) -> list[int]:
    from agent_gym.trainers.metrics import read_metrics

    return [record["step"] for record in read_metrics(run_dir)]


@pytest.fixture(scope="module")
def uninterrupted_run(tiny_model_dir_for_synthhop: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 steps of the tiny model, never stopped: what a stopped and continued run must end with."""
    run = tmp_path_factory.mktemp("straight")
    _trainer(_config(tiny_model_dir_for_synthhop, run)).train()
    return run


@pytest.mark.slow
def test_ctrl_c_during_train_saves_a_checkpoint_and_the_same_command_continues_it(
    tiny_model_dir_for_synthhop: Path, uninterrupted_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    run = tmp_path / "run"
    flags = _train_flags(tiny_model_dir_for_synthhop, run)  # --save-every 0: no checkpoint before the end
    child = subprocess.Popen([sys.executable, "-m", "agent_gym.cli", *flags, "--no-show-progress"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=sigint_as_at_a_terminal)
    # once step 1 is logged: step 2 is under way
    stdout, stderr = _signal_when(child, lambda: len(_lines(run / "metrics.jsonl")) >= 1, signal.SIGINT)

    assert child.returncode == 130, stderr
    message = stdout.strip().splitlines()[-1]
    stopped_at = len(_lines(run / "metrics.jsonl"))
    assert f"SIGINT at step {stopped_at} of 3" in message and "run the same command to continue" in message
    assert f"step_{stopped_at:06d}" in message

    assert main([*flags, "--no-show-progress"]) == 0  # the same command: not refused, continued
    assert f"resumed from step {stopped_at}" in capsys.readouterr().out
    assert _steps(run) == [1, 2, 3]
    for name, weight in _weights(uninterrupted_run).items():
        torch.testing.assert_close(_weights(run)[name], weight, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_signal_mid_rollout_abandons_it_and_the_continued_run_ends_as_an_uninterrupted_one(
    tiny_model_dir_for_synthhop: Path, uninterrupted_run: Path, tmp_path: Path
) -> None:
    import torch

    from agent_gym.trainers.trainer import TrainingInterrupted

    config = _config(tiny_model_dir_for_synthhop, tmp_path)
    sender = SignalAtReset(signal.SIGINT, at=3)  # 2 episodes a step: the first reset of step 2's rollout
    with pytest.raises(TrainingInterrupted) as stopped:
        _trainer(config, env_fns=[sender.factory(TINY_SYNTHHOP)] * 2).train()
    assert (stopped.value.step, stopped.value.checkpoint.name, stopped.value.exit_status) == (1, "step_000001", 130)

    _trainer(config).train()
    assert _steps(tmp_path) == [1, 2, 3]
    for name, weight in _weights(uninterrupted_run).items():  # step 2's draws were undone: the same samples
        torch.testing.assert_close(_weights(tmp_path)[name], weight, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_sigterm_during_an_update_lets_the_update_finish_before_saving(
    tiny_model_dir_for_synthhop: Path, tmp_path: Path
) -> None:
    from agent_gym.trainers.checkpoint import load_checkpoint
    from agent_gym.trainers.trainer import TrainingInterrupted

    trainer = _trainer(_config(tiny_model_dir_for_synthhop, tmp_path, ppo_epochs=2))

    sent: list[int] = []

    def signal_in_step_2(optimizer: Any, args: Any, kwargs: Any) -> None:
        if trainer.step == 1 and not sent:  # step 2's first optimizer step has just run; its second is to come
            sent.append(signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)

    trainer.optimizer.register_step_post_hook(signal_in_step_2)
    with pytest.raises(TrainingInterrupted) as stopped:
        trainer.train()
    assert (stopped.value.step, stopped.value.exit_status) == (2, 143)
    state = load_checkpoint(stopped.value.checkpoint)
    assert state["step"] == 2 and state["optimizer"]["state"][0]["step"].item() == 4  # both epochs of 2 steps


@pytest.mark.slow
def test_a_signal_during_an_eval_saves_the_step_and_the_continued_run_logs_it_with_its_eval(
    tiny_model_dir_for_synthhop: Path, tmp_path: Path
) -> None:
    from agent_gym.trainers import metrics as m
    from agent_gym.trainers.metrics import read_metrics
    from agent_gym.trainers.trainer import TrainingInterrupted

    config = _config(tiny_model_dir_for_synthhop, tmp_path, eval_every=1, total_steps=2)
    sender = SignalAtReset(signal.SIGINT, at=3)  # 2 episodes an eval: step 1's eval (step 0's is the start's)
    eval_env = {**TINY_SYNTHHOP, **config.eval_env_kwargs}
    with pytest.raises(TrainingInterrupted) as stopped:
        _trainer(config, eval_env_fns=[sender.factory(eval_env)] * 2).train()
    assert stopped.value.step == 1 and _steps(tmp_path) == [0]

    _trainer(config).train()
    records = read_metrics(tmp_path)
    assert [record["step"] for record in records] == [0, 1, 2]
    assert {m.REWARD, m.EVAL_EM} <= set(records[1])  # step 1's training metrics and its eval, in one record


@pytest.mark.slow
def test_train_says_when_nothing_is_left_and_names_train_and_eval_em_apart(
    tiny_model_dir_for_synthhop: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = _train_flags(tiny_model_dir_for_synthhop, tmp_path, "--total-steps", "1", "--eval-every", "1",
                         "--eval-episodes", "1")
    assert main(flags) == 0
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert any(", em=" in line and ", eval_em=" in line for line in bar)  # train EM, then held-out EM
    assert main(flags) == 0
    assert f"nothing left to train: the run in {tmp_path} already has 1 of 1 steps" in capsys.readouterr().out


def test_train_into_a_file_is_one_line_and_exit_2(tiny_model_dir_for_synthhop: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "notes.txt"
    taken.write_text("not a run directory")
    for run_dir in (taken, taken / "run"):
        assert main(_train_flags(tiny_model_dir_for_synthhop, run_dir, "--overwrite")) == 2
        captured = capsys.readouterr()
        assert captured.out.strip() == f"agent-gym train: {taken} is a file, not a directory; pass a directory as " \
                                       "--output-dir" and "Traceback" not in captured.err
    assert taken.read_text() == "not a run directory"


def test_train_help_says_how_model_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    usage, options = capsys.readouterr().out.split("options:", 1)
    assert "[--model MODEL]" in " ".join(usage.split())  # optional to argparse: --config may give it
    model_help = " ".join(options.split("\n  --model MODEL", 1)[1].split("\n  -", 1)[0].split())
    assert "Required" not in model_help and "--config" in model_help


# ---------------------------------------------------------------------------------------------- metrics.jsonl

_RESUME_WITH_A_FULL_DISK = """
import resource, signal, sys
from agent_gym.trainers.metrics import MetricsLogger

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
MetricsLogger(sys.argv[1], tensorboard=False, resume_step=50)
"""


def test_a_resume_that_fails_while_trimming_metrics_leaves_the_history_whole(tmp_path: Path) -> None:
    history = "".join(json.dumps({"step": step, "time": 0.0, "charts/reward": 0.5}) + "\n" for step in range(100))
    (tmp_path / "metrics.jsonl").write_text(history)
    child = subprocess.run([sys.executable, "-c", _RESUME_WITH_A_FULL_DISK, str(tmp_path)], capture_output=True)
    assert child.returncode != 0 and b"File too large" in child.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == history
    assert sorted(path.name for path in tmp_path.iterdir()) == ["metrics.jsonl"]


# ---------------------------------------------------------------------------------------------- sft and pretrain


@pytest.fixture
def sigint_at_first_optimizer_step() -> Any:
    """Sends this process SIGINT from inside the first optimizer step of the test (a step under way)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    sent: list[int] = []

    def send(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not sent:
            sent.append(signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    handle = register_optimizer_step_post_hook(send)
    yield sent
    handle.remove()


@pytest.mark.slow
def test_ctrl_c_during_sft_saves_the_step_and_the_same_command_continues(
    tiny_model_dir_for_synthhop: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    sigint_at_first_optimizer_step: list[int]
) -> None:
    flags = ["sft", "--env", "AgentR1-SynthHop-v0", "--env-kwargs", json.dumps(TINY_SYNTHHOP), "--policy", "oracle",
             "--model", str(tiny_model_dir_for_synthhop), "--out", str(tmp_path), "--episodes", "2", "--epochs", "2",
             "--batch-size", "2", "--max-length", "2048", "--torch-threads", "1"]  # 2 steps, no --save-every
    assert main(flags) == 130
    assert "SIGINT at step 1 of 2" in capsys.readouterr().out
    assert main(flags) == 0
    assert "resumed from step 1" in capsys.readouterr().out


def test_ctrl_c_during_pretrain_saves_the_step_and_a_new_pretrainer_continues(
    tiny_model: tuple[Any, Any], tmp_path: Path, sigint_at_first_optimizer_step: list[int]
) -> None:
    import copy

    from agent_gym.trainers.stop_signals import TrainingInterrupted
    from agent_gym.warmstart.pretrain import PretrainConfig, Pretrainer

    def pretrainer() -> Any:
        config = PretrainConfig(model="unused", output_dir=str(tmp_path), induction_steps=3, drill_steps=0,
                                batch_tokens=128, induction_width=64, induction_rows=2, eval_every=0, save_every=0,
                                show_progress=False, torch_threads=1, env_kwargs=dict(TINY_SYNTHHOP, split="all"))
        return Pretrainer(config, copy.deepcopy(tiny_model[0]), tiny_model[1])

    with pytest.raises(TrainingInterrupted) as stopped:
        pretrainer().train()
    assert (stopped.value.step, stopped.value.checkpoint.name) == (1, "step_000001")
    pretrainer().train()
    assert _steps(tmp_path) == [1, 2, 3]
