"""``agent-gym envs``, ``agent-gym play`` and ``agent-gym env serve``: list, play and serve the envs."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from agent_gym.cli.args import (
    UsageError,
    add_env_kwargs_arguments,
    cli_make_env,
    env_kwargs_from_args,
    port_number,
    user_errors,
)
from agent_gym.cli.config_flags import add_dataclass_arguments
from agent_gym.contract import GOLD_ANSWERS, MESSAGES, REWARD_COMPONENTS

__all__ = ["PlayConfig", "add_env_serve_arguments", "add_envs_arguments", "add_play_arguments", "run_env_serve",
           "run_envs", "run_play"]


def add_envs_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run_envs(args: argparse.Namespace) -> int:
    from agent_gym.registration import registered_envs

    envs = registered_envs()
    width = max(len(env_id) for env_id in envs)
    for env_id, description in envs.items():
        print(f"{env_id.ljust(width)}  {description}")
    return 0


# ---------------------------------------------------------------------------------------------- play


@dataclass
class PlayConfig:
    """The settings of ``agent-gym play`` (its flags come from these fields, beside the env kwargs)."""

    env_id: str = field(metadata={"positional": True, "help": "environment id, e.g. AgentR1-SynthHop-v0"})
    seed: int = field(default=0, metadata={"help": "the reset's seed"})
    task_id: str | None = field(default=None, metadata={"help": "play this task (default: drawn by the seed)"})
    model: str | None = field(default=None, metadata={
        "help": "let this model (a directory or a known name such as smollm2-135m-instruct) write the agent's "
                "turns, greedy, and watch; default: you type them"})
    adapter: str | None = field(default=None, metadata={
        "help": "with --model: a LoRA adapter directory merged into it"})
    max_new_tokens: int = field(default=256, metadata={"help": "with --model: tokens per model turn"})
    torch_threads: int | None = field(default=None, metadata={  # as eval's
        "help": "with --model: torch.set_num_threads (default: agent_gym.models.threads's measured default; 0 "
                "keeps torch's own)"})


def add_play_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``play``: the fields of `PlayConfig`, then the env kwargs."""
    add_dataclass_arguments(parser, PlayConfig, explicit_only=False)
    add_env_kwargs_arguments(parser)


def _model_turns(args: argparse.Namespace) -> Any:
    """The greedy ModelPolicy of ``--model``/``--adapter`` (bf16 where the machine runs it natively)."""
    from agent_gym.agents.model_policy import ModelPolicy, ModelPolicyError
    from agent_gym.models.model_init import ModelInitError
    from agent_gym.models.precision import resolve_dtype
    from agent_gym.models.pretrained import PretrainedModelError
    from agent_gym.models.threads import set_torch_threads

    with user_errors(ModelPolicyError, ModelInitError, PretrainedModelError, ValueError):
        set_torch_threads(args.torch_threads)
        return ModelPolicy.from_pretrained(args.model, adapter=args.adapter, dtype=resolve_dtype("auto"),
                                           max_new_tokens=args.max_new_tokens)


def run_play(args: argparse.Namespace) -> int:
    if args.adapter and not args.model:
        raise UsageError("--adapter needs --model")
    policy = _model_turns(args) if args.model else None
    env = cli_make_env(args.env_id, env_kwargs_from_args(args))
    options = {"task_id": args.task_id} if args.task_id else None
    try:
        with user_errors(KeyError, ValueError):  # a task id the env does not have
            observation, info = env.reset(seed=args.seed, options=options)
    except UsageError:
        env.close()
        raise
    print(f"== system ==\n{info[MESSAGES][0]['content']}\n\n== question ==\n{observation}")
    if policy is not None:
        policy.begin(env.unwrapped, observation, info)
    else:
        print("\nType your turn; end it with a line holding only '.', or type ':quit'.")
    total = 0.0
    while True:
        if policy is not None:
            action = policy.act(observation, info)
            print(f"\n== {args.model} ==\n{action}")
            observation, reward, terminated, truncated, info = env.step(action)
            total += reward
            print(f"\n== observation ==\n{observation}\n== reward {reward:+.3f} (total {total:+.3f})")
            if terminated or truncated:
                print(f"episode over ({'answered' if terminated else 'truncated'}); gold: {info[GOLD_ANSWERS]}")
                env.close()
                return 0
            continue
        lines: list[str] = []
        while True:
            try:
                line = input("> " if not lines else "  ")
            except EOFError:
                env.close()
                return 0
            if line.strip() == ":quit":
                env.close()
                return 0
            if line.strip() == ".":
                break
            lines.append(line)
        observation, reward, terminated, truncated, info = env.step("\n".join(lines))
        total += reward
        print(f"\n== observation ==\n{observation}\n== reward {reward:+.3f} (total {total:+.3f}) "
              f"{json.dumps(info[REWARD_COMPONENTS])}")
        if terminated or truncated:
            print(f"episode over ({'answered' if terminated else 'truncated'}); gold: {info[GOLD_ANSWERS]}")
            env.close()
            return 0


def add_env_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``env serve``: the fields of ``EnvServeConfig``, then the env kwargs."""
    from agent_gym.adapters.openenv_server import EnvServeConfig

    add_dataclass_arguments(parser, EnvServeConfig, explicit_only=False, types={"port": port_number})
    add_env_kwargs_arguments(parser)


def run_env_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agent_gym.adapters.openenv_server import create_env_app, env_server_config

    env_kwargs = env_kwargs_from_args(args)
    cli_make_env(args.env_id, env_kwargs).close()  # an unknown id or a refused kwarg is a usage error, before binding
    if args.max_sessions < 1 or not args.idle_timeout > 0 or args.max_message_bytes < 1024:
        raise UsageError("--max-sessions must be >= 1, --idle-timeout > 0 and --max-message-bytes >= 1024")
    from agent_gym.registration import registered_envs

    app = create_env_app(lambda: cli_make_env(args.env_id, env_kwargs), name=args.env_id,
                         description=registered_envs().get(args.env_id, ""), max_sessions=args.max_sessions,
                         idle_timeout_s=args.idle_timeout, max_message_bytes=args.max_message_bytes)
    from agent_gym.retrieval_index.service.server import bind_socket

    try:  # bind before saying "serving": a busy port is reported as such, not after the announcement
        sock = bind_socket(args.host, args.port)
    except OSError as error:
        raise UsageError(str(error)) from error
    port = sock.getsockname()[1]
    print(f"serving {args.env_id} over the OpenEnv protocol at ws://{args.host}:{port}/ws", flush=True)
    try:  # env_server_config: the message size, request-head deadline and idle-connection cap of the app
        uvicorn.Server(env_server_config(app)).run(sockets=[sock])
    finally:
        sock.close()
    return 0
