"""``agent-gym eval``: a scripted policy or a model on an env; a table, and one JSONL record per episode."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from agent_gym.cli.args import (
    UsageError,
    add_env_kwargs_arguments,
    cli_make_env,
    env_kwargs_from_args,
    parse_env_kwarg_pairs,
    user_errors,
)
from agent_gym.cli.config_flags import add_dataclass_arguments

__all__ = ["add_eval_arguments", "run_eval"]


def _file_safe(text: str) -> str:
    """A file-name part: ``module:Env-v0`` ids and model names keep only letters, digits, ``.``, ``_``, ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``eval``: the fields of ``agent_gym.evaluation.EvalConfig``, then the env kwargs."""
    from agent_gym.evaluation import EvalConfig

    add_dataclass_arguments(parser, EvalConfig, explicit_only=False)
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
    from agent_gym.evaluation import EvaluationInterrupted, evaluate, format_table, summarize
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
    env = cli_make_env(args.env_id, env_kwargs)
    if args.model:
        from agent_gym.agents.model_policy import ModelPolicy, ModelPolicyError
        from agent_gym.models.threads import set_torch_threads

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
                                                 max_new_tokens=args.max_new_tokens, progress=not args.no_progress)
        if args.naive_rag:
            from agent_gym.agents.model_naive_rag import ModelNaiveRAGPolicy

            policy, label = ModelNaiveRAGPolicy(policy), f"{label} naive-rag"
        runs = [(label, policy)]
    task_count = len(getattr(env.unwrapped, "tasks", ()))
    if 0 < task_count < args.episodes:
        print(f"{args.env_id} has {task_count} tasks: running {task_count} episodes, not {args.episodes}",
              file=sys.stderr)
    from agent_gym.eval_output import eval_output_path, settings_digest, short_settings

    episodes = min(args.episodes, task_count) if task_count else args.episodes
    identity = _eval_identity(args)
    # the hash names the file too, so a row whose short form is cut still says which run it is
    digest = settings_digest(identity) if identity else ""
    settings = " ".join(part for part in (short_settings(env_kwargs), digest) if part)
    rows = []
    try:
        for label, policy in runs:
            out = Path(args.out) if args.out else eval_output_path(args.env_id, label, identity, episodes=episodes)
            if args.out and len(runs) > 1:
                out = out.with_name(f"{out.stem}-{_file_safe(label)}{out.suffix}")
            try:
                with user_errors(PolicyError):
                    records = evaluate(env, policy, args.episodes, seed=args.seed, out_path=out,
                                       progress=not args.no_progress, description=f"{args.env_id} / {label}")
            except EvaluationInterrupted as stopped:
                # what finished is still a measurement: show it, marked partial, and say where it is
                rows.append((f"{label} {settings} (partial)".strip(), summarize(stopped.records)))
                print(format_table(rows))
                kept = f"; {out} keeps the earlier complete results" if out.exists() else ""
                print(f"agent-gym eval: interrupted after {len(stopped.records)} of {stopped.planned} episodes of "
                      f"{label}: their records are in {stopped.partial_path}{kept}", file=sys.stderr)
                return 130
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
