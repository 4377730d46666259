"""``agent-gym train``, ``agent-gym sft`` and ``agent-gym model pretrain``: the three training loops' commands.

Each command's flags come from its config dataclass (`TrainConfig`, `SFTConfig` with `SFTRunArguments`,
`PretrainConfig`), so a field's help and default are written once. ``train --env-workers N`` is where the Ray
env pool is built and handed to the `Trainer`: the trainers never import ``agent_gym.distributed``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_gym.cli.args import (
    DefaultsHelpFormatter,
    UsageError,
    add_env_kwargs_arguments,
    env_kwargs_from_args,
    make_env,
    parse_env_kwarg_pairs,
    parse_json_object,
    user_errors,
)
from agent_gym.cli.config_flags import add_dataclass_arguments, config_from_namespace
from agent_gym.models.threads import DEFAULT_TORCH_THREADS
from agent_gym.trainers.config import TrainConfig
from agent_gym.warmstart.sft import SFT_DRILL_WORLD, SFTConfig

__all__ = [
    "SFTRunArguments",
    "add_pretrain_arguments",
    "add_sft_arguments",
    "add_train_arguments",
    "config_from_train_args",
    "run_pretrain",
    "run_sft",
    "run_train",
]


# ---------------------------------------------------------------------------------------------- train


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `agent-gym train`: ``--config YAML`` plus one flag per `TrainConfig` field."""
    parser.add_argument("--config", default=None, help="YAML file of TrainConfig fields; flags override it")
    parser.add_argument("--env", dest="env_id", default=argparse.SUPPRESS, help="alias of --env-id")
    add_dataclass_arguments(parser, TrainConfig)  # --env-kwargs JSON is a TrainConfig field
    add_env_kwargs_arguments(parser, json_flag=False)


def config_from_train_args(ns: argparse.Namespace) -> TrainConfig:
    """The config of `agent-gym train`: the YAML file, the flags on top, then each ``--env-kwarg`` on top of
    ``env_kwargs``."""
    config = config_from_namespace(ns, TrainConfig)
    pairs = parse_env_kwarg_pairs(getattr(ns, "env_kwarg", None))
    return dataclasses.replace(config, env_kwargs={**config.env_kwargs, **pairs}) if pairs else config


def run_train(ns: argparse.Namespace) -> int:
    """Entry point of `agent-gym train`; returns an exit code (2, with the reason, for bad settings)."""
    import gymnasium as gym

    from agent_gym.error import AgentGymError
    from agent_gym.trainers import metrics as m
    from agent_gym.trainers.checkpoint import CheckpointError
    from agent_gym.trainers.run_dir import RunDirectoryError
    from agent_gym.trainers.trainer import Trainer, TrainingInterrupted

    try:
        config = config_from_train_args(ns)
        make_env(config.env_id, config.env_kwargs).close()  # a refused env fails here, before a model loads
        make_envs, pool_errors = None, ()
        if config.env_workers:  # the Ray pool is one more env batch, built here and handed to the trainer
            from agent_gym.distributed import EnvPoolError, RayClusterError, ray_env_pool_factory

            pool_errors = (EnvPoolError, RayClusterError)
            make_envs = ray_env_pool_factory(config.env_workers, config.ray_address, config.env_step_timeout)
        trainer = Trainer(config, make_envs=make_envs)
    except (AgentGymError, gym.error.Error) as error:  # ConfigError, ModelInitError, the pool's errors
        print(f"agent-gym train: {error}")
        return 2
    out = Path(config.output_dir)
    try:
        if trainer.maybe_resume() is not None:
            print(f"resumed from step {trainer.step} ({trainer.resumed_from})", flush=True)
        started = trainer.step
        metrics = trainer.train()
    except (CheckpointError, RunDirectoryError, *pool_errors) as error:
        print(f"agent-gym train: {error}")
        return 2
    except TrainingInterrupted as stopped:
        print(f"agent-gym train: {stopped}; {_how_to_continue(config)}", flush=True)
        return stopped.exit_status
    finally:
        trainer.close()
    if not metrics:
        print(f"nothing left to train: the run in {out} already has {trainer.step} of {config.total_steps} steps; "
              f"its policy is in {out / 'final'}")
        return 0
    summary = ", ".join(f"{k}={metrics[k]:.3f}" for k in (m.REWARD, m.EM, m.EVAL_EM) if k in metrics)
    # a run stopped during an eval and continued may train nothing more, only finish that eval
    done = f"{trainer.step} step{'s' if trainer.step > 1 else ''}" if not started else (
        f"step {trainer.step}" if trainer.step == started + 1 else f"steps {started + 1}-{trainer.step}")
    done = f"trained {done}" if trainer.step > started else f"evaluated step {trainer.step}"
    print(f"{done} ({summary}); policy saved to {out / 'final'}")
    return 0


def _how_to_continue(config: TrainConfig) -> str:
    """What continues a run stopped by a signal: the same command, unless its flags start another run."""
    if config.overwrite:
        return "run the same command without --overwrite to continue"
    if config.resume != "auto":
        return "run the same command with --resume auto to continue"
    return "run the same command to continue"


# ---------------------------------------------------------------------------------------------- sft


@dataclass
class SFTRunArguments:
    """What `agent-gym sft` imitates and where it saves; `SFTConfig` holds how it trains."""

    env: str = field(default="", metadata={"help": "Gymnasium id of the env (e.g. AgentR1-SynthHop-v0)",
                                           "required": True})
    policy: str = field(default="naive-rag", metadata={"help": "scripted policy name (agent_gym.policies)"})
    model: str = field(default="", metadata={"help": "model directory to start from (agent-gym model init)",
                                             "required": True})
    # --output-dir, as `train` names it; --out, this command's earlier name, still works
    output_dir: str = field(default="", metadata={"help": "where to save the fine-tuned model (--out: the old name)",
                                                  "required": True, "aliases": ("--out",)})
    overwrite: bool = field(default=False, metadata={
        "help": "start a new run in OUTPUT_DIR even if it holds one, deleting the old run's model, checkpoints and "
                "summary first (without it, a non-empty OUTPUT_DIR with no checkpoint to continue is refused)"})
    episodes: int = field(default=256, metadata={"help": "scripted episodes to imitate"})
    task_offset: int = field(default=0, metadata={"help": "first task index to play"})
    min_reward: float | None = field(default=None, metadata={"help": "keep only episodes with reward >= this"})
    torch_threads: int = field(default=DEFAULT_TORCH_THREADS, metadata={
        "help": "torch.set_num_threads; 0: torch's own, one per core (agent_gym/models/threads.py has the "
                "measurements behind the default)"})
    drill_env_kwargs: str | None = field(default=None, metadata={
        "help": f"overrides of the env kwargs for drill envs (none: {SFT_DRILL_WORLD})", "metavar": "JSON"})
    drill_fresh_kwarg: str = field(default="fresh_world", metadata={
        "help": "env kwarg given a new value for every step's drills (never-seen names; SynthHop's fresh_world)"})
    # 1,000,000 on: other worlds than pretraining's drills (fresh_world 0 on), as before the option existed
    drill_fresh_start: int = field(default=1_000_000, metadata={"help": "first value of it"})


def add_sft_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `agent-gym sft`: one per `SFTRunArguments` and `SFTConfig` field, the env's and the policy's
    keyword arguments."""
    parser.formatter_class = DefaultsHelpFormatter  # --help shows every default
    add_dataclass_arguments(parser, SFTRunArguments, explicit_only=False)
    add_dataclass_arguments(parser, SFTConfig, explicit_only=False)
    add_env_kwargs_arguments(parser)
    parser.add_argument("--policy-kwarg", action="append", metavar="KEY=VALUE", default=[],
                        help="option of the scripted policy (repeatable), e.g. --policy-kwarg p_multihop=0.4")


def run_sft(ns: argparse.Namespace) -> int:
    """Entry point of `agent-gym sft`; returns an exit code."""
    import torch

    from agent_gym.evaluation import iter_episodes
    from agent_gym.models.model_init import ModelInitError, load_model_and_tokenizer, save_model
    from agent_gym.models.pretrained import PretrainedModelError
    from agent_gym.policies import PolicyError, make_policy
    from agent_gym.trainers.checkpoint import CheckpointError, latest_checkpoint
    from agent_gym.trainers.run_dir import RunDirectoryError, check_run_dir, clear_run_dir
    from agent_gym.trainers.token_episode import tokenize_episode
    from agent_gym.warmstart.sft import RUN_FILES, prepare_sft_model, sft_load_dtype, train_sft

    run = config_from_namespace(ns, SFTRunArguments)
    config = config_from_namespace(ns, SFTConfig)
    env_kwargs = env_kwargs_from_args(ns)
    if run.episodes < 1:
        raise UsageError(f"--episodes must be at least 1, got {run.episodes}")
    out = Path(run.output_dir)
    resume_from = None if run.overwrite else latest_checkpoint(out)  # --overwrite: a new run, whatever is there
    with user_errors(RunDirectoryError):  # before the episodes are played: fail in seconds, not minutes
        check_run_dir(out, continuing=resume_from is not None, overwrite=run.overwrite, fresh_flag="--output-dir")
    if run.torch_threads > 0:
        torch.set_num_threads(run.torch_threads)
    policy_options = parse_env_kwarg_pairs(ns.policy_kwarg)
    with user_errors(ValueError):
        policy = make_policy(run.policy, seed=config.seed, **policy_options)
    env = make_env(run.env, env_kwargs)  # registers the env ids; no concrete env import
    try:
        with user_errors(PolicyError):
            episodes = list(iter_episodes(env, policy, run.episodes, seed=config.seed, task_offset=run.task_offset,
                                          keep_messages=True, description="scripted episodes"))
    finally:
        env.close()
    if run.min_reward is not None:
        episodes = [episode for episode in episodes if episode.reward >= run.min_reward]
    with user_errors(ModelInitError, PretrainedModelError):
        model, tokenizer = load_model_and_tokenizer(run.model, dtype=sft_load_dtype(config))
    model = prepare_sft_model(model, config)
    examples = [tokenize_episode(tokenizer, episode.messages) for episode in episodes]
    drills = None
    if config.drill_tokens > 0:
        from agent_gym.warmstart.copy_drills import DrillSource

        overrides = parse_json_object(run.drill_env_kwargs, "--drill-env-kwargs")
        # The env's own questions, in small worlds made fresh every step (cheap to build).
        drill_kwargs = {**env_kwargs, **SFT_DRILL_WORLD, **overrides}
        # The drills are the teacher's own episodes on fresh worlds: the same behaviour, never-seen names.
        drills = DrillSource(tokenizer, run.env, drill_kwargs, run.drill_fresh_kwarg, run.drill_fresh_start,
                             policy=run.policy, seed=config.seed, policy_options=policy_options)
    if resume_from is None:
        clear_run_dir(out, RUN_FILES)  # only now: --model may be this very directory
    from agent_gym.trainers.stop_signals import TrainingInterrupted

    try:
        with user_errors(CheckpointError):
            losses = train_sft(model, tokenizer, examples, config, output_dir=out, drills=drills)
    except TrainingInterrupted as stopped:
        again = "without --overwrite " if run.overwrite else ""
        print(f"agent-gym sft: {stopped}; run the same command {again}to continue", flush=True)
        return stopped.exit_status
    save_model(model, tokenizer, out)  # weights as readable as their config
    mean_reward = sum(e.reward for e in episodes) / max(1, len(episodes))
    summary: dict[str, Any] = {
        "episodes": len(episodes),
        "policy_mean_reward": mean_reward,
        "steps": len(losses),
        "first_loss": losses[0],
        "final_loss": losses[-1],
    }
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"sft: {len(episodes)} episodes of {run.policy} (mean reward {mean_reward:.3f}), "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved to {out}"
    )
    return 0


# ---------------------------------------------------------------------------------------------- model pretrain


def add_pretrain_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `agent-gym model pretrain`: one per `PretrainConfig` field."""
    from agent_gym.warmstart.pretrain import PretrainConfig

    add_dataclass_arguments(parser, PretrainConfig)


def run_pretrain(ns: argparse.Namespace) -> int:
    """Entry point of `agent-gym model pretrain`; returns an exit code."""
    from agent_gym.error import AgentGymError
    from agent_gym.trainers.checkpoint import CheckpointError
    from agent_gym.trainers.run_dir import RunDirectoryError
    from agent_gym.trainers.stop_signals import TrainingInterrupted
    from agent_gym.warmstart.pretrain import PretrainConfig, Pretrainer

    try:
        config = config_from_namespace(ns, PretrainConfig)
        pretrainer = Pretrainer(config)
    except AgentGymError as error:  # ConfigError, ModelInitError
        raise UsageError(str(error)) from None
    try:
        if pretrainer._resume():
            print(f"resumed from step {pretrainer.step}", flush=True)
        scores = pretrainer.train()
    except (CheckpointError, RunDirectoryError) as error:
        raise UsageError(str(error)) from None
    except TrainingInterrupted as stopped:
        again = "without --overwrite " if config.overwrite else ""
        print(f"agent-gym model pretrain: {stopped}; run the same command {again}to continue", flush=True)
        return stopped.exit_status
    summary = json.dumps({key: round(value, 3) for key, value in scores.items() if key.endswith("exact")})
    print(f"pretrained {config.total_steps} steps; copy skill {summary}; saved to {Path(config.output_dir) / 'final'}")
    return 0
