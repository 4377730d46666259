"""``agent-gym train``, ``agent-gym sft`` and ``agent-gym model pretrain``: the three training loops' commands.

Each command's flags come from its config dataclass (`TrainConfig`, `SFTConfig`, `PretrainConfig`), so a field's
help and default are written once, and each runs its library trainer (`Trainer`, `SFTTrainer`, `Pretrainer`).
``train --env-workers N`` is where the Ray env pool is built and handed to the `Trainer`: the trainers never
import ``agent_gym.distributed``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from agent_gym.cli.args import (
    DefaultsHelpFormatter,
    UsageError,
    add_env_kwargs_arguments,
    cli_make_env,
    parse_env_kwarg_pairs,
)
from agent_gym.cli.config_flags import add_dataclass_arguments, config_from_namespace
from agent_gym.trainers.config import TrainConfig
from agent_gym.warmstart.sft import SFTConfig

__all__ = [
    "add_pretrain_arguments",
    "add_sft_arguments",
    "add_train_arguments",
    "config_from_train_args",
    "config_from_sft_args",
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
    from agent_gym.trainers.backends.base import GenerationError
    from agent_gym.trainers.checkpoint import CheckpointError
    from agent_gym.trainers.run_dir import RunDirectoryError
    from agent_gym.trainers.trainer import Trainer, TrainingInterrupted

    try:
        config = config_from_train_args(ns)
        cli_make_env(config.env_id, config.env_kwargs).close()  # a refused env fails here, before a model loads
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
    except (CheckpointError, RunDirectoryError, GenerationError, *pool_errors) as error:
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


def add_sft_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `agent-gym sft`: one per `SFTConfig` field, ``--env-kwarg`` and ``--policy-kwarg`` pairs."""
    parser.formatter_class = DefaultsHelpFormatter  # --help shows every default
    add_dataclass_arguments(parser, SFTConfig, explicit_only=False)  # --env-kwargs JSON is an SFTConfig field
    add_env_kwargs_arguments(parser, json_flag=False)
    parser.add_argument("--policy-kwarg", action="append", metavar="KEY=VALUE", default=[],
                        help="option of the scripted policy (repeatable), e.g. --policy-kwarg p_multihop=0.4")


def config_from_sft_args(ns: argparse.Namespace) -> SFTConfig:
    """The config of `agent-gym sft`: the flags, then each ``--env-kwarg`` / ``--policy-kwarg`` on top of the JSON
    forms."""
    config = config_from_namespace(ns, SFTConfig)
    env_pairs = parse_env_kwarg_pairs(getattr(ns, "env_kwarg", None))
    policy_pairs = parse_env_kwarg_pairs(getattr(ns, "policy_kwarg", None))
    return dataclasses.replace(config, env_kwargs={**config.env_kwargs, **env_pairs},
                               policy_kwargs={**config.policy_kwargs, **policy_pairs})


def run_sft(ns: argparse.Namespace) -> int:
    """Entry point of `agent-gym sft`: `SFTTrainer` on the flags' config; returns an exit code."""
    from agent_gym.trainers.stop_signals import TrainingInterrupted
    from agent_gym.warmstart.sft import SFTTrainer

    config = config_from_sft_args(ns)
    trainer = SFTTrainer(config)
    trainer.claim_run_dir()  # a used --output-dir fails in seconds, before the env is built
    cli_make_env(config.env, config.env_kwargs).close()  # an unknown id or refused kwarg: a one-line usage error
    try:
        summary = trainer.train()
    except TrainingInterrupted as stopped:
        again = "without --overwrite " if config.overwrite else ""
        print(f"agent-gym sft: {stopped}; run the same command {again}to continue", flush=True)
        return stopped.exit_status
    print(
        f"sft: {summary['episodes']} episodes of {config.policy} (mean reward {summary['policy_mean_reward']:.3f}), "
        f"loss {summary['first_loss']:.3f} -> {summary['final_loss']:.3f}; saved to {config.output_dir}"
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
        if pretrainer.maybe_resume():
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
