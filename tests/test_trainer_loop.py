"""The trainer loop end to end on a tiny model and a tiny in-test env, plus its persistence pieces.

The env here is written against docs/DESIGN.md §2 only (no suite import), which is all the trainer may rely on.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from agent_gym.error import InvalidValue
from agent_gym.spaces import UnicodeText
from agent_gym.trainers import metrics as m
from agent_gym.trainers.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    restore_rng_state,
    save_checkpoint,
)
from agent_gym.trainers.metrics import MetricsLogger, read_metrics
from agent_gym.trainers.plot import plot_runs
from agent_gym.trainers.trainer import TaskSampler

CODES = {"Arlo": "blue", "Bexa": "green", "Cyra": "red", "Dune": "gold", "Ezra": "teal", "Fenn": "gray"}


class CodeLookupEnv(gym.Env):
    """ "What is the code of NAME?": the agent may call `lookup(name)` (hermes format), then answers.

    Reward (paid when the episode ends): 1.0 for the right code in <answer>; otherwise a small length shaping
    term, -len(action)/1000, so a random tiny model's episodes differ and group advantages are non-zero.
    """

    metadata = {"render_modes": []}
    TOOLS = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look up the secret code of a person.",
                "parameters": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                },
            },
        }
    ]

    def __init__(self, split: str = "train", max_turns: int = 2) -> None:
        self.names = sorted(CODES)[:4] if split == "train" else sorted(CODES)[4:]
        self.max_turns = max_turns
        self.observation_space = UnicodeText(max_length=4096)
        self.action_space = UnicodeText(max_length=4096)
        self.messages: list[dict[str, Any]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        index = int(options.get("task_index", self.np_random.integers(len(self.names))))
        self.name = self.names[index % len(self.names)]
        self.turn = 0
        question = f"What is the code of {self.name}?"
        self.messages = [
            {"role": "system", "content": "Use the lookup tool, then answer in <answer></answer>."},
            {"role": "user", "content": question},
        ]
        info = {
            "messages": list(self.messages),
            "tools": self.TOOLS,
            "task_id": f"code-{self.name}",
            "turn": 0,
            "stop_strings": ["</tool_call>", "</answer>"],
            "tool_format": "hermes",
        }
        return question, info

    def step(self, action: str):
        self.turn += 1
        self.messages.append({"role": "assistant", "content": action})
        answer = re.search(r"<answer>(.*?)</answer>", action, re.S)
        call = re.search(r"<tool_call>(.*?)</tool_call>", action, re.S)
        tool_calls: list[dict[str, Any]] = []
        observation = ""
        if answer is None and call is not None:
            try:
                name = json.loads(call.group(1))["arguments"]["name"]
                observation = f"The code of {name} is {CODES[name]}."
                tool_calls.append({"name": "lookup", "ok": True})
            except (json.JSONDecodeError, KeyError, TypeError):
                observation = "Error: could not parse the tool call."
                tool_calls.append({"name": "lookup", "ok": False})
            self.messages.append({"role": "tool", "content": observation})
        elif answer is None:
            observation = "Your turn had no tool call and no answer."
            self.messages.append({"role": "user", "content": observation})
        terminated = answer is not None
        truncated = not terminated and self.turn >= self.max_turns
        em = float(terminated and answer.group(1).strip() == CODES[self.name])
        reward = 0.0
        if terminated or truncated:
            reward = em if em else -len(action) / 1000
            observation = ""
        info = {
            "messages": list(self.messages),
            "task_id": f"code-{self.name}",
            "turn": self.turn,
            "tool_calls": tool_calls,
            "reward_components": {"outcome": reward, "em": em, "f1": em},
        }
        return observation, reward, terminated, truncated, info


def test_in_test_env_passes_the_gymnasium_checker():
    from gymnasium.utils.env_checker import check_env

    check_env(CodeLookupEnv(), skip_render_check=True)


# ---------------------------------------------------------------------------------------------- pieces


def test_task_sampler_draws_are_a_function_of_seed_and_position():
    first = TaskSampler(seed=3).draw(5)
    resumed = TaskSampler(seed=3, position=2)
    assert resumed.draw(3) == first[2:]


def test_task_sampler_seeds_differ_between_runs():
    assert TaskSampler(seed=0).draw(4) != TaskSampler(seed=1).draw(4)


def test_uniform_task_draws_stay_what_runs_already_on_disk_drew():
    # a run started before stratified draws resumes with the same tasks: seed, then task index, from (seed, position)
    expected = []
    for position in range(3):
        rng = np.random.default_rng([3, position])
        expected.append({"seed": int(rng.integers(2**31 - 1)), "options": {"task_index": int(rng.integers(2**31 - 1))}})
    assert TaskSampler(seed=3).draw(3) == expected


def test_stratified_draws_take_each_value_in_turn_uniformly_within_it_and_resume_the_same():
    strata = {2: [1, 3], 1: [0, 2, 4]}
    sampler = TaskSampler(seed=5, strata=strata)
    drawn = [spec["options"]["task_index"] for spec in sampler.draw(400)]
    assert all(index in strata[1] for index in drawn[0::2]) and all(index in strata[2] for index in drawn[1::2])
    assert set(drawn[0::2]) == {0, 2, 4} and set(drawn[1::2]) == {1, 3}  # every task of a stratum comes up
    resumed = TaskSampler(seed=5, strata=strata)
    resumed.load_state_dict({"seed": 5, "position": 150})
    assert [spec["options"]["task_index"] for spec in resumed.draw(10)] == drawn[150:160]
    with pytest.raises(InvalidValue, match="no empty one"):
        TaskSampler(seed=0, strata={1: [0], 2: []})


def test_task_strata_groups_task_indices_by_a_field_and_names_the_fields_when_one_is_missing():
    from agent_gym.tasks import Task
    from agent_gym.trainers.task_sampler import task_strata

    tasks = [Task(id=f"t{i}", question="q?", answers=("a",), kind="bridge", metadata={"hops": 1 + i % 2})
             for i in range(5)]
    assert task_strata(tasks, "hops") == {1: [0, 2, 4], 2: [1, 3]}
    assert task_strata(tasks, "kind") == {"bridge": [0, 1, 2, 3, 4]}
    with pytest.raises(InvalidValue, match="'level'.*5 of the 5 tasks.*hops, kind"):
        task_strata(tasks, "level")


def test_rng_state_roundtrip_replays_the_same_draws():
    state = capture_rng_state()
    expected = torch.rand(3)
    torch.rand(5)
    restore_rng_state(state)
    assert torch.equal(torch.rand(3), expected)


def test_checkpoints_are_pruned_to_the_newest(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"step": step}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002", "step_000003"]
    assert latest_checkpoint(tmp_path).name == "step_000003"


def test_half_written_checkpoint_is_ignored(tmp_path):
    save_checkpoint(tmp_path, 1, {"step": 1})
    (tmp_path / "checkpoints" / "step_000002.tmp").mkdir()  # a run killed while saving step 2
    assert latest_checkpoint(tmp_path).name == "step_000001"


_SAVE_AND_HANG = """
import sys, time
from pathlib import Path
from agent_gym.trainers.checkpoint import save_checkpoint

class SlowPolicy:  # stands for a large model: killed while its weights are being written
    def save_pretrained(self, path):
        Path(path).mkdir()
        (Path(path) / "model.safetensors").write_bytes(b"partial")
        Path(sys.argv[2]).touch()
        time.sleep(600)

run = sys.argv[1]
save_checkpoint(run, 1, {"step": 1})
save_checkpoint(run, 2, {"step": 2}, SlowPolicy())
"""


def test_checkpoint_killed_while_being_written_is_ignored_and_cleaned_up(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    run, writing = tmp_path / "run", tmp_path / "writing"
    child = subprocess.Popen([sys.executable, "-c", _SAVE_AND_HANG, str(run), str(writing)])
    try:
        deadline = time.monotonic() + 120
        while not writing.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child never started step 2"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert (run / "checkpoints" / "step_000002.tmp" / "trainer_state.pt").is_file()  # a kill -9 mid-write

    assert [p.name for p in list_checkpoints(run)] == ["step_000001"]
    assert latest_checkpoint(run).name == "step_000001"
    assert not (run / "checkpoints" / "step_000002.tmp").exists()  # cleaned up, not left to pile up
    save_checkpoint(run, 2, {"step": 2})
    assert [p.name for p in list_checkpoints(run)] == ["step_000001", "step_000002"]


def test_metrics_logger_on_resume_drops_steps_after_the_checkpoint(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in (1, 2, 3):
            logger.log(step, {m.REWARD: float(step)})
    with (tmp_path / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 4, "charts/rew')  # torn line of a killed run
    with MetricsLogger(tmp_path, tensorboard=False, resume_step=2) as logger:
        logger.log(3, {m.REWARD: 30.0})
    assert [(r["step"], r[m.REWARD]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def _trajectory(outcome, info, response_tokens=2, episode=None):
    from agent_gym.trainers.trajectory import Trajectory

    return Trajectory(
        prompt_ids=[1],
        response_ids=[5] * response_tokens,
        loss_mask=[1] * response_tokens,
        sampling_logprobs=[0.0] * response_tokens,
        turn_end_indices=[response_tokens - 1],
        turn_rewards=[outcome],
        outcome=outcome,
        group_id="g",
        info=info,
        episode=episode,
    )


def test_episode_metrics_count_an_episode_split_into_samples_once():
    from agent_gym.episode_summary import EpisodeSummary

    split = EpisodeSummary(reward=1.0, turns=3, em=1.0, tool_calls=2, valid_tool_calls=1, terminated=True)
    trajectories = [
        _trajectory(1.0, {"sample_index": 0}, episode=split),
        _trajectory(1.0, {"sample_index": 1}, 4, episode=split),
        _trajectory(0.0, {"sample_index": 0}, episode=EpisodeSummary(turns=1, em=0.0, terminated=True)),
    ]
    metrics = m.episode_metrics(trajectories)
    assert metrics[m.REWARD] == 0.5 and metrics[m.EM] == 0.5 and metrics[m.TURNS] == 2.0
    assert metrics[m.TOOL_CALL_VALIDITY] == 0.5  # only episodes that report it
    assert metrics[m.RESPONSE_LENGTH] == (2 + 4 + 2) / 3  # per step-level sample


def test_metrics_logger_writes_tensorboard_events(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=True) as logger:
        logger.log(1, {m.REWARD: 0.5})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_plot_draws_a_png_overlaying_runs(tmp_path):
    for name, offset in (("grpo", 0.0), ("ppo", 0.1)):
        with MetricsLogger(tmp_path / name, tensorboard=False) as logger:
            for step in range(1, 4):
                logger.log(step, {m.REWARD: step * 0.1 + offset, m.POLICY_LOSS: -offset})
    path = plot_runs([tmp_path / "grpo", tmp_path / "ppo"], out=tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_directory_without_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="agent-gym train"):
        plot_runs([tmp_path])


# ---------------------------------------------------------------------------------------------- the loop


class KillAfterStep:
    """A callback that stops a run the way a crash would, after a given step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def __call__(self, trainer, metrics) -> None:
        if trainer.step == self.step:
            raise KeyboardInterrupt(f"killed after step {self.step}")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny matrices run fastest on one thread; extra threads only contend on a shared CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _build_tiny_model(path, hidden_size: int, heads: int):
    """A 2-layer Qwen2 model with a BPE tokenizer trained on the env's texts (built in ~1 s)."""
    from agent_gym.models.model_init import ModelPreset, build_model, train_tokenizer

    env = CodeLookupEnv()
    texts = [json.dumps(CodeLookupEnv.TOOLS)]
    for name, code in CODES.items():
        _, info = env.reset(options={"task_index": 0})
        texts += [m["content"] for m in info["messages"]]
        texts += [
            f"What is the code of {name}?",
            f"The code of {name} is {code}.",
            f"<answer>{code}</answer>",
            f'<tool_call>{{"name": "lookup", "arguments": {{"name": "{name}"}}}}</tool_call>',
        ]
    tokenizer = train_tokenizer(texts * 4, vocab_size=320)
    model = build_model(ModelPreset(320, hidden_size, 2 * hidden_size, 2, heads, 1, 1024), tokenizer, seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return _build_tiny_model(tmp_path_factory.mktemp("tiny-model"), hidden_size=32, heads=2)


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    # head_dim 64: vLLM's CPU attention has no kernel for the head_dim 16 of the model above
    return _build_tiny_model(tmp_path_factory.mktemp("tiny-vllm-model"), hidden_size=64, heads=1)


def _config(model_dir, output_dir, **overrides):
    from agent_gym.trainers.config import TrainConfig

    values = dict(
        model=str(model_dir),
        dtype="float32",  # these tests check exact token-level agreement; bf16 (the default here) rounds it away
        env_id="unused-in-tests",
        algo="grpo",
        group_size=2,
        tasks_per_step=2,
        total_steps=2,
        micro_batch_size=2,
        max_new_tokens=12,
        max_context_tokens=256,
        lr=1e-3,
        eval_every=2,
        eval_episodes=2,
        save_every=1,
        output_dir=str(output_dir),
        tensorboard=False,
        show_progress=False,
        device="cpu",
        seed=0,
    )
    values.update(overrides)
    return TrainConfig(**values)


def _trainer(config):
    from functools import partial

    from agent_gym.trainers.trainer import Trainer

    return Trainer(
        config,
        env_fns=[CodeLookupEnv] * config.rollout_batch_size,
        eval_env_fns=[partial(CodeLookupEnv, split="test")] * 2,
    )


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


STABLE_NAMES = {
    m.REWARD,
    m.EM,
    m.TURNS,
    m.RESPONSE_LENGTH,
    m.POLICY_LOSS,
    m.APPROX_KL,
    m.CLIPFRAC,
    m.ENTROPY,
    m.TOKENS_PER_S,
    m.KL_REF,
    m.GRAD_NORM,
}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_training_updates_weights_and_logs_stable_metric_names(tiny_model_dir, tmp_path, algo):
    trainer = _trainer(_config(tiny_model_dir, tmp_path, algo=algo))
    before = _weights(trainer.model)
    trainer.train()
    changed = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    records = read_metrics(tmp_path)
    assert changed
    assert [r["step"] for r in records] == [0, 1, 2]  # step 0: eval of the starting policy
    expected = STABLE_NAMES | ({m.VALUE_LOSS} if algo == "ppo" else set())
    expected |= {m.RESIDENT_MB} if sys.platform == "linux" else set()  # read from /proc
    assert expected <= set(records[1])
    assert records[1].get(m.RESIDENT_MB, 100.0) > 50.0  # a process holding torch and a model
    assert {m.EVAL_REWARD, m.EVAL_EM} <= set(records[0]) & set(records[2])
    assert (tmp_path / "final" / "config.json").is_file()
    # the trained weights and the checkpoint's are as readable as the config beside them (safetensors wrote 0600)
    for folder in (tmp_path / "final", *(tmp_path / "checkpoints").glob("*/policy")):
        config_mode = (folder / "config.json").stat().st_mode & 0o777
        assert {(w.stat().st_mode & 0o777) for w in folder.glob("*.safetensors")} == {config_mode}


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint_like_an_uninterrupted_run(tiny_model_dir, tmp_path):
    settings = dict(algo="ppo", total_steps=4, save_every=2, eval_every=0, kl_coef=0.01)
    uninterrupted = _trainer(_config(tiny_model_dir, tmp_path / "straight", **settings))
    uninterrupted.train()

    killed = _trainer(_config(tiny_model_dir, tmp_path / "killed", **settings))
    with pytest.raises(KeyboardInterrupt):
        killed.train(callbacks=[KillAfterStep(3)])  # step 3 ran but was never checkpointed
    resumed = _trainer(_config(tiny_model_dir, tmp_path / "killed", **settings))
    assert resumed.maybe_resume().name == "step_000002"
    assert resumed.step == 2
    assert resumed.optimizer.state_dict()["state"][0]["step"].item() == 2
    resumed.train()

    assert resumed.step == 4
    for name, weight in _weights(uninterrupted.model).items():
        torch.testing.assert_close(resumed.model.get_parameter(name), weight, rtol=0, atol=1e-6)
    for name, weight in _weights(uninterrupted.critic).items():
        torch.testing.assert_close(resumed.critic.get_parameter(name), weight, rtol=0, atol=1e-6)
    straight, again = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "killed")
    assert [r["step"] for r in again] == [1, 2, 3, 4]
    assert (
        again[3][m.REWARD] == straight[3][m.REWARD]
    )  # the same tasks and samples after resume: RNG continued


def _collected_batch(trainer):
    from agent_gym.trainers.trajectory import collate

    trajectories = trainer.collector.collect(trainer.sampler.draw(2), 2, seed=0)
    return collate(trajectories, trainer.pad_id)


@pytest.mark.slow
@pytest.mark.parametrize("advantage_mask", [True, False])
def test_advantage_mask_decides_if_env_tokens_get_advantages(tiny_model_dir, tmp_path, advantage_mask):
    trainer = _trainer(_config(tiny_model_dir, tmp_path, use_advantage_mask=advantage_mask, kl_coef=0.0))
    batch = _collected_batch(trainer)
    targets = trainer.compute_advantages(batch, trainer.score(batch))
    env_tokens = (batch.response_mask - batch.loss_mask).bool()
    assert env_tokens.any()
    env_advantage = targets.advantages[env_tokens].abs().sum()
    assert (env_advantage > 0) == (not advantage_mask)


@pytest.mark.slow
def test_trainer_logprobs_match_the_samplers_on_model_tokens(tiny_model_dir, tmp_path):
    # token-in/token-out: the trainer scores exactly the tokens the backend sampled, at the same positions
    trainer = _trainer(_config(tiny_model_dir, tmp_path, total_steps=1, eval_every=0))
    trainer.train()
    assert read_metrics(tmp_path)[0][m.SAMPLER_LOGPROB_DIFF] < 1e-4


@pytest.mark.slow
def test_loss_mask_switch_changes_the_update(tiny_model_dir, tmp_path):
    grads = []
    for loss_mask in (True, False):
        config = _config(
            tiny_model_dir,
            tmp_path / str(loss_mask),
            total_steps=1,
            eval_every=0,
            use_loss_mask=loss_mask,
            use_advantage_mask=False,
            max_grad_norm=1e9,
        )
        trainer = _trainer(config)
        trainer.train()
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    assert not torch.allclose(grads[0], grads[1])


@pytest.mark.slow
def test_entropy_is_reported_over_model_tokens_whatever_the_loss_mask(tiny_model_dir, tmp_path):
    # Same seed, same first batch: only the loss mask differs, and the batch has env tokens (see above).
    entropies = []
    for use_loss_mask in (True, False):
        run_dir = tmp_path / str(use_loss_mask)
        _trainer(_config(tiny_model_dir, run_dir, total_steps=1, eval_every=0, use_loss_mask=use_loss_mask)).train()
        entropies.append(read_metrics(run_dir)[0][m.ENTROPY])
    assert entropies[0] == pytest.approx(entropies[1], rel=1e-5)


@pytest.mark.slow
def test_resuming_a_run_of_another_algorithm_is_refused(tiny_model_dir, tmp_path):
    from agent_gym.trainers.checkpoint import CheckpointError

    _trainer(_config(tiny_model_dir, tmp_path, total_steps=1, eval_every=0)).train()
    with pytest.raises(CheckpointError, match="algo='grpo'"):
        _trainer(_config(tiny_model_dir, tmp_path, algo="rloo", total_steps=2, eval_every=0)).train()


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dr_grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo"])
def test_every_estimator_runs_a_training_step(tiny_model_dir, tmp_path, algo):
    trainer = _trainer(
        _config(
            tiny_model_dir,
            tmp_path,
            algo=algo,
            total_steps=1,
            eval_every=0,
            kl_in_reward_coef=0.01 if algo.startswith("reinforce_pp") else 0.0,  # token-level algos only
            aggregation="seq-mean-token-sum-norm",
        )
    )
    before = _weights(trainer.model)
    trainer.train()
    assert any(not torch.equal(p, before[name]) for name, p in trainer.model.named_parameters())


@pytest.mark.slow
def test_lora_training_updates_only_adapters_and_uses_the_base_as_reference(tiny_model_dir, tmp_path):
    trainer = _trainer(
        _config(
            tiny_model_dir,
            tmp_path,
            lora_rank=4,
            lora_target_modules=["q_proj", "v_proj"],
            total_steps=2,
            eval_every=0,
            kl_coef=0.1,
        )
    )
    before = _weights(trainer.model)
    trainer.train()
    changed = {name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all("lora_" in name for name in changed)
    assert trainer.reference is None  # the adapter-disabled base model serves as the reference
    assert read_metrics(tmp_path)[1][m.KL_REF] > 0


@pytest.mark.slow
def test_micro_batch_size_does_not_change_the_update(tiny_model_dir, tmp_path):
    # Compare the accumulated gradients (left in .grad after the step): Adam's first step is ~sign(grad),
    # so equal weights alone would not catch a mis-scaled micro-batch.
    grads = []
    for micro_batch_size in (1, 4):
        config = _config(
            tiny_model_dir,
            tmp_path / str(micro_batch_size),
            total_steps=1,
            eval_every=0,
            micro_batch_size=micro_batch_size,
            max_grad_norm=1e9,
        )
        trainer = _trainer(config)
        trainer.train()
        grads.append({name: p.grad.clone() for name, p in trainer.model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_later_epochs_and_mini_batches_train_off_policy(tiny_model_dir, tmp_path):
    config = _config(
        tiny_model_dir,
        tmp_path,
        algo="ppo",
        total_steps=1,
        eval_every=0,
        ppo_epochs=2,
        num_mini_batches=2,
        lr=1e-2,
    )
    trainer = _trainer(config)
    trainer.train()
    assert read_metrics(tmp_path)[0][m.APPROX_KL] > 0
    assert trainer.optimizer.state_dict()["state"][0]["step"].item() == 4


def test_kl_in_reward_with_an_outcome_estimator_is_a_config_error():
    from agent_gym.trainers.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="kl_coef"):
        TrainConfig(algo="grpo", kl_in_reward_coef=0.1)


class ShortAnswerEnv(CodeLookupEnv):
    """One turn; the reward is minus the answer's length, so the best policy stops at once."""

    def step(self, action: str):
        self.messages.append({"role": "assistant", "content": action})
        reward = -len(action) / 50
        info = {
            "messages": list(self.messages),
            "task_id": f"code-{self.name}",
            "turn": 1,
            "tool_calls": [],
            "reward_components": {"outcome": reward},
        }
        return "", reward, True, False, info


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_training_raises_reward_when_length_is_penalised(tiny_model_dir, tmp_path, algo):
    # measured: both reach reward ~0 (one-token answers) from -0.4 within ~100 steps at lr 3e-3
    from agent_gym.trainers.trainer import Trainer

    config = _config(
        tiny_model_dir,
        tmp_path,
        algo=algo,
        group_size=4,
        tasks_per_step=4,
        total_steps=120,
        micro_batch_size=16,
        max_new_tokens=16,
        lr=3e-3,
        kl_coef=0.0,
        eval_every=0,
        save_every=0,
    )
    Trainer(config, env_fns=[ShortAnswerEnv] * 16, eval_env_fns=[ShortAnswerEnv]).train()
    rewards = [r[m.REWARD] for r in read_metrics(tmp_path)]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.25


def test_train_command_runs_from_flags_on_a_registered_env(tiny_model_dir, tmp_path):
    import argparse

    from agent_gym.cli.train import add_train_arguments, run_train

    gym.register("TestCodeLookup-v0", entry_point=CodeLookupEnv)
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    ns = parser.parse_args(
        [
            "--env",
            "TestCodeLookup-v0",
            "--model",
            str(tiny_model_dir),
            "--total-steps",
            "1",
            "--group-size",
            "2",
            "--tasks-per-step",
            "1",
            "--max-new-tokens",
            "8",
            "--eval-episodes",
            "1",
            "--output-dir",
            str(tmp_path),
            "--no-tensorboard",
            "--no-show-progress",
        ]
    )
    assert run_train(ns) == 0
    assert (tmp_path / "final" / "config.json").is_file()


def test_train_command_without_a_model_exits_with_a_clear_message(tmp_path, capsys):
    import argparse

    from agent_gym.cli.train import add_train_arguments, run_train

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    assert run_train(parser.parse_args(["--output-dir", str(tmp_path)])) == 2
    assert "--model" in capsys.readouterr().out


@pytest.mark.slow
def test_vllm_backend_samples_from_the_updated_policy_after_each_step(vllm_model_dir, tmp_path):
    from agent_gym.trainers.backends.vllm_backend import vllm_available

    if not vllm_available():  # a broken install raises more than ImportError
        pytest.skip("vllm is not importable here; on CPU this test runs in .venv-vllm (bash scripts/make_vllm_venv.sh)")
    from agent_gym.trainers.trainer import Trainer

    config = _config(
        vllm_model_dir,
        tmp_path,
        backend="vllm",
        group_size=4,
        tasks_per_step=4,
        total_steps=3,
        micro_batch_size=16,
        max_new_tokens=16,
        max_context_tokens=512,
        lr=3e-3,
        kl_coef=0.0,
        eval_every=0,
        save_every=0,
    )
    trainer = Trainer(config, env_fns=[ShortAnswerEnv] * 16, eval_env_fns=[ShortAnswerEnv])
    try:
        trainer.train()
    finally:
        trainer.close()
    records = read_metrics(tmp_path)
    assert all(r[m.GRAD_NORM] > 0 for r in records)  # the policy moved at every step...
    assert all(r[m.SAMPLER_LOGPROB_DIFF] < 1e-4 for r in records)  # ...and vLLM sampled from the moved policy


def test_vllm_backend_starts_from_the_warm_start_adapter(vllm_model_dir, tmp_path):
    from agent_gym.trainers.backends.vllm_backend import vllm_available

    if not vllm_available():
        pytest.skip("vllm is not importable here; on CPU this test runs in .venv-vllm (bash scripts/make_vllm_venv.sh)")
    from transformers import AutoModelForCausalLM

    from agent_gym.models.lora_setup import add_lora
    from agent_gym.trainers.trainer import Trainer

    # a warm start far from the base: LoRA's B matrices (zero when fresh) filled with noise
    warm = add_lora(AutoModelForCausalLM.from_pretrained(vllm_model_dir), rank=8, alpha=16)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in warm.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    warm.save_pretrained(tmp_path / "warm")
    config = _config(vllm_model_dir, tmp_path / "run", backend="vllm", adapter=str(tmp_path / "warm"), group_size=4,
                     tasks_per_step=4, total_steps=1, micro_batch_size=16, max_new_tokens=16,
                     max_context_tokens=512, kl_coef=0.0, eval_every=0, save_every=0)
    trainer = Trainer(config, env_fns=[ShortAnswerEnv] * 16, eval_env_fns=[ShortAnswerEnv])
    try:
        trainer.train()
    finally:
        trainer.close()
    (record,) = read_metrics(tmp_path / "run")
    assert record[m.SAMPLER_LOGPROB_DIFF] < 1e-4  # vLLM sampled the warm start, not the base it loaded


# --- a fast update (issue 26): the same loss and gradients with the shared prompt once and no padding ---


def _one_step_grads(model_dir, run_dir, like=None, **overrides):
    """One training step: the trainer, its gradients, its metrics and its starting weights; ``like``: starting
    weights (by name) for this run's trainable parameters."""
    config = _config(model_dir, run_dir, total_steps=1, eval_every=0, max_grad_norm=1e9, micro_batch_size=4,
                     **overrides)
    trainer = _trainer(config)
    if like is not None:
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if p.requires_grad:
                    p.copy_(like[name])
        trainer.backend.sync_weights(trainer.model)
    start = _weights(trainer.model)
    trainer.train()
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return trainer, grads, read_metrics(run_dir)[0], start


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_and_padding_free_update_equals_the_padded_one(tiny_model_dir, tmp_path, lora):
    lora_settings = dict(lora_rank=4, lora_target_modules=["all-linear"]) if lora else {}
    runs = {
        name: _one_step_grads(tiny_model_dir, tmp_path / name, share_prompt=share, padding_free=free,
                              entropy_coef=0.01, kl_coef=0.05, **lora_settings)
        for name, share, free in (("padded", False, False), ("packed", False, True), ("shared", True, True))
    }
    _, padded_grads, padded_metrics, _ = runs["padded"]
    assert padded_grads
    for name in ("packed", "shared"):
        _, grads, metrics, _ = runs[name]
        assert grads.keys() == padded_grads.keys()
        for key, grad in padded_grads.items():
            torch.testing.assert_close(grads[key], grad, rtol=1e-4, atol=1e-6)
        for key in (m.POLICY_LOSS, m.ENTROPY, m.KL_REF, m.GRAD_NORM, m.SAMPLER_LOGPROB_DIFF):
            assert metrics[key] == pytest.approx(padded_metrics[key], rel=1e-4, abs=1e-6)
    # the same batch, fewer positions run: no padding, then each group's prompt once
    tokens = {name: run[2][m.UPDATE_TOKENS] for name, run in runs.items()}
    assert tokens["shared"] < tokens["packed"] < tokens["padded"]
    assert padded_metrics[m.UPDATE_BF16] == 0.0  # dtype float32 in these tests


@pytest.mark.slow
def test_lora_on_top_layers_trains_them_alike_and_runs_no_backward_below(tiny_model_dir, tmp_path):
    settings = dict(lora_rank=4, lora_target_modules=["all-linear"])
    _, every_layer, _, every_start = _one_step_grads(tiny_model_dir, tmp_path / "all", **settings)
    # the top layer's adapters start from the every-layer run's (their random A draws differ otherwise)
    top, top_grads, _, _ = _one_step_grads(tiny_model_dir, tmp_path / "top", like=every_start, lora_layers=1,
                                           **settings)
    layers = top.model.get_base_model().model.layers
    assert len(layers) == 2
    trained = {name for name, p in top.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name and ".layers.1." in name for name in trained)
    assert set(top_grads) == trained  # no gradient for any frozen base weight
    for name, grad in top_grads.items():  # lora_B starts at 0: the lower adapters change nothing in a first step
        torch.testing.assert_close(grad, every_layer[name], rtol=1e-4, atol=1e-7)

    # no graph below the lowest trained layer: its input requires no grad, so backward stops there
    seen = []
    hook = layers[1].register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (kwargs.get("hidden_states", args[0] if args else None)).requires_grad), with_kwargs=True)
    batch = _collected_batch(top)
    top.model.train()
    logprobs = top._policy_logprobs(top.model, batch)[0]
    hook.remove()
    assert seen and not any(seen) and logprobs.requires_grad


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_lean_activations_make_the_same_update(tiny_model_dir, tmp_path, lora):
    settings = dict(lora_rank=4, lora_target_modules=["all-linear"]) if lora else {}
    _, grads, metrics, start = _one_step_grads(tiny_model_dir, tmp_path / "own", kl_coef=0.05, **settings)
    lean, lean_grads, lean_metrics, _ = _one_step_grads(tiny_model_dir, tmp_path / "lean", like=start, kl_coef=0.05,
                                                        lean_activations=True, **settings)
    assert any("forward" in module.__dict__ for module in lean.model.modules())  # installed on the trained model
    assert lean_grads.keys() == grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(lean_grads[name], grad, rtol=1e-4, atol=1e-6)
    for key in (m.POLICY_LOSS, m.KL_REF, m.GRAD_NORM, m.SAMPLER_LOGPROB_DIFF, m.UPDATE_TOKENS):
        assert lean_metrics[key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6)


def test_lora_layers_needs_lora():
    from agent_gym.trainers.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="lora_layers"):
        TrainConfig(lora_layers=2)
