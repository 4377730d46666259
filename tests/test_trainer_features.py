"""The trainer's sampling and credit options end to end: dynamic sampling, the balance by task kind, GiGPO and
the LoRA critic, on a tiny model, a scripted backend and an env whose rewards the test sets.

The env's task t = task_index % 4 decides its hop count (1 for t < 2, else 2) and its rewards: tasks 0 and 2 pay
every episode the same, so their groups carry no contrast; tasks 1 and 3 pay 0 and 1 to alternate episodes, so
each of their groups holds a success and a failure.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import gymnasium as gym
import pytest
import torch
from support.backends import ScriptedBackend
from support.tiny_model import tiny_model_and_tokenizer

from agent_gym.spaces import UnicodeText
from agent_gym.tasks import Task
from agent_gym.trainers import metrics as m
from agent_gym.trainers.checkpoint import CheckpointError
from agent_gym.trainers.config import ConfigError, TrainConfig
from agent_gym.trainers.critic import LoraValueModel, ValueModel
from agent_gym.trainers.dynamic_sampling import informative_groups
from agent_gym.trainers.kind_balance import row_loss_weights, task_kinds
from agent_gym.trainers.trainer import Trainer

QUESTION = "What is the code of Arlo?"


class ScriptedRewardEnv(gym.Env):
    """Pays what the module docstring says after ``turns`` turns, whatever the agent writes."""

    metadata = {"render_modes": []}
    episodes = itertools.count()  # over every instance: neighbouring episodes of a group alternate
    tasks = [Task(id=f"task-{t}", question=QUESTION, answers=("blue",), metadata={"hops": 1 + t // 2})
             for t in range(4)]  # what reset plays for task_index t (mod 4); read by stratify_by

    def __init__(self, turns: int = 1, informative: bool = True) -> None:
        self.turns, self.informative = turns, informative
        self.observation_space = UnicodeText(max_length=4096)
        self.action_space = UnicodeText(max_length=4096)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task = int((options or {}).get("task_index", 0)) % 4
        alternate = next(self.episodes) % 2
        self.reward = float(alternate) if self.informative and task % 2 else float(task == 0)
        self.turn, self.task = 0, task
        self.messages = [{"role": "system", "content": "Answer."}, {"role": "user", "content": QUESTION}]
        info = {"messages": list(self.messages), "task_id": f"task-{task}", "turn": 0,
                "task_fields": {"hops": 1 + task // 2}}
        return QUESTION, info

    def step(self, action: str):
        self.turn += 1
        self.messages += [{"role": "assistant", "content": action}, {"role": "user", "content": "Go on."}]
        done = self.turn >= self.turns
        info = {"messages": list(self.messages), "task_id": f"task-{self.task}", "turn": self.turn}
        return "Go on.", self.reward if done else 0.0, done, False, info


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _trainer(tmp_path, env_kwargs=None, scripted_draws=True, **overrides) -> Trainer:
    values: dict[str, Any] = dict(
        dtype="float32", env_id="unused-in-tests", algo="grpo", group_size=2, tasks_per_step=2, total_steps=4,
        micro_batch_size=4, max_new_tokens=8, max_context_tokens=256, lr=1e-3, eval_every=0,
        output_dir=str(tmp_path / "run"), tensorboard=False, show_progress=False, device="cpu", seed=0,
    )
    values.update(overrides)
    config = TrainConfig(**values)
    model, tokenizer = tiny_model_and_tokenizer([QUESTION, "Answer.", "Go on.", "<answer>blue</answer>"])
    env = lambda: ScriptedRewardEnv(**(env_kwargs or {}))  # noqa: E731
    trainer = Trainer(config, model, tokenizer, env_fns=[env] * config.rollout_batch_size, eval_env_fns=[env],
                      backend=ScriptedBackend(tokenizer, ["<answer>blue</answer>"]))
    if not scripted_draws:
        return trainer
    tasks = itertools.count()  # tasks 0, 1, 2, 3, 0, ... in turn, so a test knows which groups it gets
    trainer.sampler.draw = lambda count: [
        {"seed": index, "options": {"task_index": index}} for index in itertools.islice(tasks, count)
    ]
    return trainer


class Spy:
    """Records what the collector returned (each call) and the batch each update trained on."""

    def __init__(self, trainer: Trainer) -> None:
        self.rounds: list[list[Any]] = []
        self.updates: list[Any] = []
        collect, update = trainer.collector.collect, trainer._update

        def spy_collect(*args: Any, **kwargs: Any) -> Any:
            self.rounds.append(collect(*args, **kwargs))
            return self.rounds[-1]

        def spy_update(batch: Any) -> Any:
            self.updates.append(batch)
            return update(batch)

        trainer.collector.collect, trainer._update = spy_collect, spy_update


def _groups_of(trajectories):
    groups: dict[str, list[float]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.group_id, []).append(trajectory.outcome)
    return groups


def test_dynamic_sampling_trains_on_informative_groups_only_and_logs_the_share_kept(tmp_path):
    trainer = _trainer(tmp_path, dynamic_sampling=True, max_sampling_rounds=8)
    spy = Spy(trainer)
    metrics = trainer.train_step()
    batch = spy.updates[0].tokens
    flags = informative_groups(batch.episode_returns, batch.group_index)
    assert flags.all() and len(flags) == 2  # a full batch of groups with a contrast
    sampled = [group for round_ in spy.rounds for group in _groups_of(round_).values()]
    informative = [max(group) > min(group) for group in sampled]
    assert metrics[m.SAMPLING_ROUNDS] == len(spy.rounds)
    assert metrics[m.INFORMATIVE_GROUPS] == pytest.approx(sum(informative) / len(informative))


def test_refill_is_bounded_and_a_step_without_contrast_still_trains(tmp_path):
    trainer = _trainer(tmp_path, env_kwargs={"informative": False}, dynamic_sampling=True, max_sampling_rounds=3)
    spy = Spy(trainer)
    metrics = trainer.train_step()
    assert len(spy.rounds) == 3 and metrics[m.SAMPLING_ROUNDS] == 3
    assert metrics[m.INFORMATIVE_GROUPS] == 0.0
    assert spy.updates[0].tokens.size == 4  # the last round as it is
    assert trainer.step == 1


def test_without_dynamic_sampling_one_round_trains_and_the_share_is_still_logged(tmp_path):
    trainer = _trainer(tmp_path)
    spy = Spy(trainer)
    metrics = trainer.train_step()
    assert len(spy.rounds) == 1 and spy.updates[0].tokens.size == 4
    assert m.SAMPLING_ROUNDS not in metrics and 0.0 <= metrics[m.INFORMATIVE_GROUPS] <= 1.0


def test_balance_by_hops_gives_each_hop_count_the_same_loss_weight_and_logs_its_share(tmp_path):
    trainer = _trainer(tmp_path, balance_by="hops", tasks_per_step=6)  # informative: two 1-hop groups, one 2-hop
    spy = Spy(trainer)
    metrics = trainer.train_step()
    trajectories = spy.rounds[0]
    for hops in ("1", "2"):
        groups = _groups_of([t for t in trajectories if str(t.episode.task_fields["hops"]) == hops]).values()
        share = sum(max(g) > min(g) for g in groups) / len(groups)
        assert metrics[f"{m.INFORMATIVE_GROUPS}/{hops}"] == pytest.approx(share)
    update = spy.updates[0]
    balanced = update.targets.advantages
    plain = Trainer.compute_advantages(trainer, update.tokens, update.scored)  # kinds omitted: no balance
    loss_tokens = trainer._loss_token_mask(update.tokens)
    rows = loss_tokens.sum(dim=1) > 0
    scale = (balanced.abs().sum(dim=1) / plain.advantages.abs().sum(dim=1).clamp(min=1e-12))[rows]
    kinds = task_kinds(trajectories, "hops")
    weight = scale * row_loss_weights(loss_tokens, trainer.config.aggregation)[rows]
    informative = plain.advantages.abs().sum(dim=1)[rows] > 0
    totals = {kind: float(sum(w for w, k, i in zip(weight, kinds, informative, strict=True) if k == kind and i))
              for kind in set(kinds)}
    assert len(totals) == 2 and totals["1"] == pytest.approx(totals["2"], rel=1e-5)
    assert metrics[f"{m.INFORMATIVE_GROUPS}/1"] == pytest.approx(2 / 4)


def test_stratify_by_hops_gives_every_step_each_hop_count_equally(tmp_path):
    trainer = _trainer(tmp_path, scripted_draws=False, stratify_by="hops", tasks_per_step=4)
    spy = Spy(trainer)
    for _ in range(3):
        trainer.train_step()
    assert [Counter(t.episode.task_fields["hops"] for t in trajectories) for trajectories in spy.rounds] == \
        [{1: 4, 2: 4}] * 3  # 2 tasks of each hop count a step, 2 episodes each


def _draws(trainer: Trainer, steps: int) -> list[tuple[list[int], int]]:
    """The task indices and the sampling seed of each of ``steps`` training steps."""
    draws: list[tuple[list[int], int]] = []
    collect = trainer.collector.collect

    def recording(specs, group_size, greedy, seed):
        draws.append(([spec["options"]["task_index"] for spec in specs], seed))
        return collect(specs, group_size, greedy=greedy, seed=seed)

    trainer.collector.collect = recording
    for _ in range(steps):
        trainer.train_step()
    return draws


@pytest.mark.parametrize("stratify_by", [None, "hops"])
def test_a_run_continued_with_a_step_offset_draws_on_instead_of_replaying_its_first_steps(tmp_path, stratify_by):
    whole = _draws(_trainer(tmp_path / "whole", scripted_draws=False, stratify_by=stratify_by, tasks_per_step=4), 3)
    fresh = _draws(_trainer(tmp_path / "fresh", scripted_draws=False, stratify_by=stratify_by, tasks_per_step=4), 1)
    continued = _trainer(tmp_path / "continued", scripted_draws=False, stratify_by=stratify_by, tasks_per_step=4,
                         step_offset=2)
    assert fresh == whole[:1]  # a run without the offset starts where every run does
    assert _draws(continued, 1) == whole[2:]  # the continuation's first step is the whole run's third
    assert whole[2] != whole[0]
    assert continued.step == 1  # its own steps still count from 1 (metrics, checkpoints, total_steps)


def test_stratify_by_refuses_a_field_the_tasks_lack_and_envs_without_a_task_list(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="stratify_by='level'.*hops"):
        _trainer(tmp_path, scripted_draws=False, stratify_by="level")
    monkeypatch.setattr(ScriptedRewardEnv, "tasks", None)
    with pytest.raises(ConfigError, match="stratify_by='hops' reads the task list"):
        _trainer(tmp_path, scripted_draws=False, stratify_by="hops")


def test_metrics_by_hops_splits_the_rollout_metrics_without_touching_the_update(tmp_path):
    trainer = _trainer(tmp_path, metrics_by="hops", tasks_per_step=6, env_kwargs={"turns": 2})
    spy = Spy(trainer)
    metrics = trainer.train_step()
    trajectories = spy.rounds[0]
    for hops in ("1", "2"):
        mine = [t for t in trajectories if str(t.episode.task_fields["hops"]) == hops]
        assert metrics[f"charts/reward/{hops}"] == pytest.approx(sum(t.episode.reward for t in mine) / len(mine))
        assert metrics[f"charts/turns/{hops}"] == pytest.approx(2.0)
        groups = list(_groups_of(mine).values())
        share = sum(max(g) > min(g) for g in groups) / len(groups)
        assert metrics[f"{m.INFORMATIVE_GROUPS}/{hops}"] == pytest.approx(share)
    update = spy.updates[0]
    plain = Trainer.compute_advantages(trainer, update.tokens, update.scored)
    assert torch.equal(update.targets.advantages, plain.advantages)  # a split of the logs, not a balance


def test_log_rollouts_writes_whole_groups_each_step_and_a_resumed_run_writes_each_step_once(tmp_path):
    import json

    trainer = _trainer(tmp_path, log_rollouts=1, tasks_per_step=2, total_steps=2, save_every=1)
    trainer.train()
    path = tmp_path / "run" / "rollouts.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 1, 2, 2]  # one group of group_size=2 episodes a step
    assert len({r["group"] for r in records if r["step"] == 1}) == 1
    first = records[0]
    assert first["task_fields"]["hops"] in (1, 2) and first["turns"] == 1 and QUESTION in first["prompt_tail"]
    assert isinstance(first["response"], str) and first["reward"] in (0.0, 1.0)
    (tmp_path / "run" / "rollouts.jsonl").open("a").write(json.dumps({**first, "step": 3}) + "\n")  # a killed run's
    resumed = _trainer(tmp_path, log_rollouts=1, tasks_per_step=2, total_steps=3, save_every=1)
    resumed.train()
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [1, 1, 2, 2, 3, 3]


def test_a_field_the_env_does_not_give_stops_the_step_with_its_name(tmp_path):
    trainer = _trainer(tmp_path, balance_by="level")
    with pytest.raises(ValueError, match="balance_by='level'"):
        trainer.train_step()


def test_gigpo_trains_a_multi_turn_step(tmp_path):
    trainer = _trainer(tmp_path, env_kwargs={"turns": 2}, algo="gigpo")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    metrics = trainer.train_step()
    assert torch.isfinite(torch.tensor(metrics[m.POLICY_LOSS]))
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_ppo_with_a_lora_critic_trains_both_and_resumes_the_critic(tmp_path):
    trainer = _trainer(tmp_path, algo="ppo", critic="lora", critic_lora_rank=4, lora_rank=4, critic_lr=1e-2)
    assert isinstance(trainer.critic, LoraValueModel)
    full = ValueModel.from_policy(trainer.model)
    assert sum(p.numel() for p in trainer.critic.parameters()) < sum(p.numel() for p in full.parameters()) / 2
    policy_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    critic_before = {n: p.detach().clone() for n, p in trainer.critic.named_parameters()}
    trainer.train_step()
    trainer.train_step()  # the head moves first; the adapters' B then gets a gradient through it
    policy_after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(policy_after[n], p) for n, p in policy_before.items() if "lora_" in n)
    assert all(torch.equal(policy_after[n], p) for n, p in policy_before.items() if "lora_" not in n)
    critic_after = dict(trainer.critic.named_parameters())
    assert not torch.equal(critic_after["value_head.weight"], critic_before["value_head.weight"])
    assert any(not torch.equal(critic_after[n], p) for n, p in critic_before.items() if "lora_B" in n)

    state = trainer.state_dict()
    assert set(state["critic"]) == set(critic_before)  # adapters and head: nothing of the base
    resumed = _trainer(tmp_path / "again", algo="ppo", critic="lora", critic_lora_rank=4, lora_rank=4)
    resumed.load_state_dict(state)
    assert all(torch.equal(p, critic_after[n]) for n, p in resumed.critic.named_parameters())


def test_a_checkpoint_exports_as_a_final_directory_whose_critic_starts_the_next_run(tmp_path):
    from agent_gym.trainers.checkpoint import export_checkpoint

    trainer = _trainer(tmp_path, algo="ppo", critic="lora", critic_lora_rank=4, lora_rank=4, critic_lr=1e-2)
    trainer.train_step()
    trainer.train_step()
    checkpoint = trainer.save_checkpoint()
    out, step = export_checkpoint(checkpoint, tmp_path / "exported")
    assert step == 2 and out == tmp_path / "exported"
    policy = checkpoint / "policy"
    assert sorted(f.name for f in policy.iterdir()) == sorted(f.name for f in out.iterdir() if f.name != "critic.pt")
    assert all((out / f.name).read_bytes() == f.read_bytes() for f in policy.iterdir() if f.is_file())
    # the critic file is the one `save` writes: the next run starts from the trained critic, not a zero head
    trained = dict(trainer.critic.named_parameters())
    started = _trainer(tmp_path / "next", algo="ppo", critic="lora", critic_lora_rank=4, lora_rank=4,
                       critic_init=str(out / "critic.pt"))
    assert all(torch.equal(parameter, trained[name]) for name, parameter in started.critic.named_parameters())
    # a critic-free run exports its policy alone
    grpo = _trainer(tmp_path / "grpo", lora_rank=4)
    grpo.train_step()
    exported, _ = export_checkpoint(grpo.save_checkpoint(), tmp_path / "grpo-exported")
    assert not (exported / "critic.pt").exists() and (exported / "adapter_config.json").is_file()
    with pytest.raises(CheckpointError, match="trainer_state.pt"):
        export_checkpoint(tmp_path / "exported", tmp_path / "again")  # a final/ directory is not a checkpoint


def test_critic_init_starts_ppo_from_a_published_bf16_critic_and_refuses_a_mismatch(tmp_path):
    trainer = _trainer(tmp_path, algo="ppo", critic="lora", critic_lora_rank=4, lora_rank=4, critic_lr=1e-2)
    trainer.train_step()
    trainer.train_step()
    saved = tmp_path / "critic.pt"
    trainer.critic.save(saved)
    state = torch.load(saved, weights_only=True)
    published = tmp_path / "published.pt"  # as the campaign commits it: bf16 weights, the rank kept
    torch.save({key: value.to(torch.bfloat16) if value.is_floating_point() else value for key, value in state.items()},
               published)
    trained = dict(trainer.critic.named_parameters())
    started = _trainer(tmp_path / "again", algo="ppo", critic="lora", critic_lora_rank=4, lora_rank=4,
                       critic_init=str(published))
    for name, parameter in started.critic.named_parameters():
        assert parameter.dtype == torch.float32
        assert torch.equal(parameter, trained[name].detach().to(torch.bfloat16).float())
    assert started.critic.value_head.weight.abs().sum() > 0  # not the zero head a fresh critic starts from
    with pytest.raises(ConfigError, match="rank 8"):
        _trainer(tmp_path / "rank", algo="ppo", critic="lora", critic_lora_rank=8, lora_rank=4,
                 critic_init=str(published))
    with pytest.raises(ConfigError, match="full"):
        _trainer(tmp_path / "full", algo="ppo", critic="full", lora_rank=4, critic_init=str(published))
    with pytest.raises(ConfigError, match="no critic file"):
        _trainer(tmp_path / "missing", algo="ppo", critic="lora", critic_lora_rank=4, lora_rank=4,
                 critic_init=str(tmp_path / "none.pt"))
    with pytest.raises(ConfigError, match="has none"):
        TrainConfig(algo="grpo", critic_init=str(published))


def test_the_critic_runs_in_the_updates_bf16_with_its_head_in_fp32_after_the_policys_backward(tmp_path):
    trainer = _trainer(tmp_path, algo="ppo", critic="lora", critic_lora_rank=4, lora_rank=4, dtype="bfloat16")
    critic = trainer.critic
    body_dtypes, head_dtypes, policy_grads_at_critic = [], [], []
    layer = next(module for name, module in trainer.model.named_modules()
                 if isinstance(module, torch.nn.Linear) and "lora_" not in name and "lm_head" not in name)
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]

    def in_the_critics_pass(module, args, out):
        if critic._active:
            body_dtypes.append(out.dtype)
            if torch.is_grad_enabled():  # the update's pass (scoring runs without grad, before any backward)
                policy_grads_at_critic.append(all(p.grad is not None for p in trainable))

    layer.register_forward_hook(in_the_critics_pass)
    critic.value_head.register_forward_hook(lambda module, args, out: head_dtypes.append(out.dtype))
    metrics = trainer.train_step()
    assert body_dtypes and set(body_dtypes) == {torch.bfloat16}  # the body at the update's precision
    assert head_dtypes and set(head_dtypes) == {torch.float32}  # the values in fp32
    # the policy's graph was backed (and freed) before the critic's forward: one graph held at a time
    assert policy_grads_at_critic and all(policy_grads_at_critic)
    assert torch.isfinite(torch.tensor(metrics[m.VALUE_LOSS]))


def test_a_run_with_a_full_critic_does_not_resume_with_a_lora_critic(tmp_path):
    trainer = _trainer(tmp_path, algo="ppo", critic="lora", critic_lora_rank=4, lora_rank=4)
    saved = {"step": 1, "config": {**trainer.config.to_dict(), "critic": "full"}}
    with pytest.raises(CheckpointError, match="critic='full'"):
        trainer._check_resumable(tmp_path / "step-1", saved)
