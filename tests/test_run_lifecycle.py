"""One run lifecycle for `train`, `sft` and `model pretrain` (issue 28): each run directory records its settings in
``run_config.json``, one check refuses to continue a checkpoint with settings that change the experiment (naming
every one), the settings that may change on resume are listed in one place, and run directories written before
records existed still continue (checked as their own code checked them), then get a record."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from conftest import TINY_SYNTHHOP
from support.backends import ScriptedBackend
from support.tiny_model import tiny_model_and_tokenizer

from agent_gym.spaces import UnicodeText
from agent_gym.trainers import metrics as m
from agent_gym.trainers.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from agent_gym.trainers.config import TrainConfig
from agent_gym.trainers.losses import PolicyLossOutput
from agent_gym.trainers.metrics import read_metrics
from agent_gym.trainers.run_record import (
    MAY_CHANGE_ON_RESUME,
    RECORD_FILE,
    RECORD_KEY,
    RunMismatchError,
    RunRecord,
    check_resume,
    differing_settings,
    read_run_record,
    write_run_record,
)
from agent_gym.trainers.trainer import Trainer
from agent_gym.warmstart.pretrain import PretrainConfig, Pretrainer
from agent_gym.warmstart.sft import SFTConfig, SFTTrainer

# ---------------------------------------------------------------------------------------------- the check


def test_the_check_names_every_setting_that_changes_the_experiment_and_ignores_those_that_may_change() -> None:
    recorded = RunRecord("train", {"lr": 1e-4, "group_size": 5, "env_kwargs": {"hops": 1, "split": "train"},
                                   "total_steps": 10, "eval_every": 5, "torch_threads": 1, "show_progress": True})
    same = RunRecord("train", {**recorded.settings, "total_steps": 50, "eval_every": 0, "torch_threads": 2,
                               "show_progress": False})
    assert differing_settings(recorded, same) == []
    other = RunRecord("train", {**same.settings, "lr": 1e-3, "group_size": 8,
                                "env_kwargs": {"hops": 2, "split": "train", "world_seed": 3}})
    assert differing_settings(recorded, other) == [
        "lr=0.0001 (now 0.001)", "group_size=5 (now 8)", "env_kwargs['hops']=1 (now 2)",
        "env_kwargs['world_seed']=unset (now 3)"]
    assert differing_settings(recorded, RunRecord("sft", recorded.settings)) == ["kind='train' (now 'sft')"]
    # a setting one side lacks (added in a later release) is not compared
    assert differing_settings(recorded, RunRecord("train", {**recorded.settings, "new_knob": 1})) == []


def test_one_error_type_and_one_message_format(tmp_path: Path) -> None:
    recorded = RunRecord("pretrain", {"lr": 0.003, "seed": 0})
    state = {"step": 3, RECORD_KEY: recorded.to_dict()}
    with pytest.raises(RunMismatchError) as refused:
        check_resume(tmp_path / "step_000003", state, RunRecord("pretrain", {"lr": 0.01, "seed": 1}))
    assert isinstance(refused.value, CheckpointError)  # what callers caught before: still caught
    assert str(refused.value) == (
        f"{tmp_path / 'step_000003'} was saved by a run with other settings: lr=0.003 (now 0.01), seed=0 (now 1); "
        "continuing it with these would mix two experiments in one run: pass --overwrite to replace it, or a "
        "fresh --output-dir")
    with pytest.raises(RunMismatchError, match="at step 3, past the 2 steps of this run; raise --epochs"):
        check_resume(tmp_path, state, recorded, total_steps=2, steps_setting="--epochs")
    check_resume(tmp_path, state, recorded, total_steps=3)


def test_a_checkpoint_without_a_record_is_checked_on_its_legacy_settings(tmp_path: Path) -> None:
    current = RunRecord("train", {"model": "m", "algo": "grpo", "lr": 1e-3})
    check_resume(tmp_path, {"step": 1}, current, legacy={"model": "m", "algo": "grpo"})  # lr was never compared
    with pytest.raises(RunMismatchError, match=r"algo='ppo' \(now 'grpo'\)"):
        check_resume(tmp_path, {"step": 1}, current, legacy={"model": "m", "algo": "ppo"})


def test_the_record_is_readable_json_and_reads_back(tmp_path: Path) -> None:
    record = RunRecord.of("train", TrainConfig(model="m", env_kwargs={"hops": 2}))
    path = write_run_record(tmp_path / "run", record)
    assert path.name == RECORD_FILE == "run_config.json"
    assert json.loads(path.read_text())["settings"]["env_kwargs"] == {"hops": 2}
    assert read_run_record(tmp_path / "run") == record
    assert read_run_record(tmp_path) is None


def test_every_setting_that_may_change_on_resume_is_a_field_of_a_trainer_config() -> None:
    fields = {f.name for cls in (TrainConfig, SFTConfig, PretrainConfig) for f in dataclasses.fields(cls)}
    assert set(MAY_CHANGE_ON_RESUME) <= fields
    # the experiment itself is never among them
    assert not {"lr", "env_id", "env", "env_kwargs", "algo", "group_size", "model", "adapter", "seed", "lora_rank",
                "max_new_tokens", "max_context_tokens", "policy", "episodes"} & set(MAY_CHANGE_ON_RESUME)


def _as_before_run_records(run_dir: Path) -> None:
    """Make ``run_dir`` what the code before run records wrote: no run_config.json, no record in a checkpoint."""
    (run_dir / RECORD_FILE).unlink()
    for checkpoint in list_checkpoints(run_dir):
        state = load_checkpoint(checkpoint)
        del state[RECORD_KEY]
        torch.save(state, checkpoint / "trainer_state.pt")


# ---------------------------------------------------------------------------------------------- train


class OneTurnEnv(gym.Env):
    """Pays 1 for any answer, in one turn."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = UnicodeText(max_length=4096)
        self.action_space = UnicodeText(max_length=4096)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        messages = [{"role": "user", "content": "Say blue."}]
        return "Say blue.", {"messages": messages, "task_id": "t", "turn": 0}

    def step(self, action: str):
        messages = [{"role": "user", "content": "Say blue."}, {"role": "assistant", "content": action}]
        return "", 1.0, True, False, {"messages": messages, "task_id": "t", "turn": 1}


def _trainer(run_dir: Path, **overrides: Any) -> Trainer:
    values: dict[str, Any] = dict(
        dtype="float32", env_id="unused-in-tests", env_kwargs={"hops": 1}, algo="grpo", group_size=2,
        tasks_per_step=1, total_steps=1, max_new_tokens=4, max_context_tokens=128, lr=1e-3, eval_every=0,
        output_dir=str(run_dir), tensorboard=False, show_progress=False, device="cpu", torch_threads=1)
    values.update(overrides)
    config = TrainConfig(**values)
    model, tokenizer = tiny_model_and_tokenizer(["Say blue.", "blue"])
    envs = [OneTurnEnv] * config.rollout_batch_size
    return Trainer(config, model, tokenizer, env_fns=envs, eval_env_fns=[OneTurnEnv],
                   backend=ScriptedBackend(tokenizer, ["blue"]))


def test_a_train_run_continues_only_with_its_own_settings(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _trainer(run).train()
    recorded = read_run_record(run)
    assert recorded is not None and recorded.kind == "train" and recorded.settings["env_kwargs"] == {"hops": 1}

    # --env-kwarg hops=2, another lr and group size: refused, each named, nothing of the run touched
    with pytest.raises(RunMismatchError) as refused:
        _trainer(run, total_steps=2, env_kwargs={"hops": 2}, lr=1e-2, group_size=3).maybe_resume()
    message = str(refused.value)
    assert "env_kwargs['hops']=1 (now 2)" in message and "lr=0.001 (now 0.01)" in message
    assert "group_size=2 (now 3)" in message and "total_steps" not in message
    assert [r["step"] for r in read_metrics(run)] == [1]

    # more steps, another eval and save cadence: the same experiment, continued
    more = _trainer(run, total_steps=2, eval_every=5, save_every=2, keep_checkpoints=3)
    more.train()
    assert more.resumed_from is not None and [r["step"] for r in read_metrics(run)] == [1, 2]
    assert read_run_record(run) == more.run_record  # the record says how the run goes on now
    assert load_checkpoint(list_checkpoints(run)[-1])[RECORD_KEY] == more.run_record.to_dict()


def test_a_train_run_from_before_run_records_continues_and_gets_a_record(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _trainer(run).train()
    _as_before_run_records(run)
    # what the old check compared is still checked
    with pytest.raises(RunMismatchError, match=r"algo='grpo' \(now 'rloo'\)"):
        _trainer(run, total_steps=2, algo="rloo").maybe_resume()
    assert not (run / RECORD_FILE).exists()
    resumed = _trainer(run, total_steps=2)
    resumed.train()
    assert resumed.resumed_from is not None and [r["step"] for r in read_metrics(run)] == [1, 2]
    assert read_run_record(run) == resumed.run_record


# ---------------------------------------------------------------------------------------------- sft


def _sft(tiny_model: tuple[Any, Any], out: Path, **overrides: Any) -> SFTTrainer:
    values: dict[str, Any] = dict(env="AgentR1-SynthHop-v0", env_kwargs=TINY_SYNTHHOP, policy="oracle", model="unused",
                                  output_dir=str(out), episodes=2, epochs=2, batch_size=2, max_length=2048,
                                  save_every=1, warmup_steps=1, torch_threads=1, show_progress=False)
    values.update(overrides)
    return SFTTrainer(SFTConfig(**values), copy.deepcopy(tiny_model[0]), tiny_model[1])


def test_sft_runs_from_python_as_train_does_and_continues_only_with_its_settings(tiny_model, tmp_path: Path) -> None:
    out = tmp_path / "sft"
    summary = _sft(tiny_model, out).train()
    assert summary["episodes"] == 2 and summary["steps"] == 2
    assert json.loads((out / "sft_summary.json").read_text()) == summary
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()  # the model's own config
    recorded = read_run_record(out)
    assert recorded is not None and recorded.kind == "sft" and recorded.settings["env_kwargs"] == TINY_SYNTHHOP
    assert recorded.settings["examples"] == 2

    with pytest.raises(RunMismatchError) as refused:
        _sft(tiny_model, out, epochs=3, env_kwargs={**TINY_SYNTHHOP, "hops": 1}, policy="naive-rag").train()
    assert "env_kwargs['hops']=2 (now 1)" in str(refused.value) and "policy='oracle'" in str(refused.value)
    longer = _sft(tiny_model, out, epochs=3)  # one more epoch: the same run, continued from its step-1 checkpoint
    assert longer.train()["steps"] == 3


def test_an_sft_run_from_before_run_records_continues_and_gets_a_record(tiny_model, tmp_path: Path) -> None:
    out = tmp_path / "sft"
    _sft(tiny_model, out).train()
    _as_before_run_records(out)
    with pytest.raises(RunMismatchError, match=r"lr=0.001 \(now 0.5\)"):  # the old check compared lr
        _sft(tiny_model, out, lr=0.5).train()
    again = _sft(tiny_model, out)
    assert again.train()["steps"] == 2  # resumed at step 1: the losses of step 1 come from the checkpoint
    assert read_run_record(out) == RunRecord.of("sft", again.config, examples=2)


# ---------------------------------------------------------------------------------------------- pretrain


def _pretrainer(tiny_model: tuple[Any, Any], run_dir: Path, **overrides: Any) -> Pretrainer:
    settings: dict[str, Any] = dict(
        model="unused", output_dir=str(run_dir), env_kwargs=dict(TINY_SYNTHHOP, split="all"), induction_steps=2,
        drill_steps=0, batch_tokens=128, induction_width=64, induction_rows=2, eval_every=0, save_every=1,
        show_progress=False, torch_threads=1)
    settings.update(overrides)
    return Pretrainer(PretrainConfig(**settings), copy.deepcopy(tiny_model[0]), tiny_model[1])


def test_a_pretrain_run_from_before_run_records_continues_and_then_checks_every_setting(tiny_model, tmp_path) -> None:
    run = tmp_path / "run"
    _pretrainer(tiny_model, run).train()
    _as_before_run_records(run)
    _pretrainer(tiny_model, run, induction_steps=3).train()  # the old check compared neither
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    recorded = read_run_record(run)
    assert recorded is not None and recorded.kind == "pretrain" and recorded.settings["induction_steps"] == 3
    with pytest.raises(RunMismatchError, match=r"lr=0.003 \(now 0.01\)"):
        _pretrainer(tiny_model, run, induction_steps=4, lr=0.01).maybe_resume()


# ---------------------------------------------------------------------------------------------- update metrics


def test_update_stats_weigh_token_averages_by_each_micro_batch_share() -> None:
    loss_tokens = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    stats = m.UpdateStats(loss_tokens, loss_tokens)
    for row, clipped in ((0, 1.0), (1, 0.0)):  # 3 of the 4 loss tokens, then 1
        mask = loss_tokens[row : row + 1]
        policy = PolicyLossOutput(torch.tensor(0.5), torch.tensor(clipped), torch.tensor(0.0), torch.tensor(0.0))
        stats.add(loss_tokens=mask, model_tokens=mask, policy=policy, entropy=torch.ones(1, 3),
                  old_logprobs=torch.zeros(1, 3), sampling_logprobs=torch.zeros(1, 3), tokens_computed=3)
    result = stats.result(grad_norm=2.0)
    assert result[m.CLIPFRAC] == pytest.approx(0.75) and result[m.POLICY_LOSS] == pytest.approx(1.0)
    assert result[m.ENTROPY] == pytest.approx(1.0) and result[m.UPDATE_TOKENS] == 6 and result[m.GRAD_NORM] == 2.0
    assert m.VALUE_LOSS not in result and m.KL_REF not in result


def test_the_three_trainers_and_their_configs_are_public_api() -> None:
    import agent_gym

    assert agent_gym.SFTTrainer is SFTTrainer and agent_gym.SFTConfig is SFTConfig
    assert agent_gym.Trainer is Trainer and agent_gym.TrainConfig is TrainConfig
    assert agent_gym.Pretrainer is Pretrainer and agent_gym.PretrainConfig is PretrainConfig
    assert {"Trainer", "SFTTrainer", "Pretrainer"} <= set(agent_gym.__all__)
