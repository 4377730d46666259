"""``agent-gym bench``: several RL libraries on one env, under one budget, in one metrics schema.

Each (library, seed) runs in its own process, one after another so they never share the cores: ours and the
Stable-Baselines3 runners with this interpreter, TRL with the peer venv's (``scripts/make_peer_venv.sh``), since
its pins clash with the main install. A library that is not installed is reported as such in the table, with the
command that installs it. Without ``--model`` the LLM libraries start from a small model built here with the
existing path: ``agent-gym model init --preset tiny --corpus-from-env ENV`` then ``agent-gym sft --policy
weak-multihop`` (a warm start that sometimes searches twice, as in docs/RESULTS.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from agent_gym.bench.report import BenchRecord, format_table, plot_curves, read_records
from agent_gym.bench.runners import DEFAULT_PEER_PYTHON, RUNNERS, BenchConfig, BenchSettings, settings_json
from agent_gym.cli.args import (
    UsageError,
    add_env_kwargs_arguments,
    cli_make_env,
    env_kwargs_from_args,
    parse_json_object,
    user_errors,
)
from agent_gym.cli.config_flags import add_dataclass_arguments

__all__ = ["DEFAULT_PEER_PYTHON", "add_bench_arguments", "run_bench"]

LLM_LIBRARIES = ("ours-grpo", "ours-ppo", "ours-reinforce_pp", "trl-grpo")
# what each library needs, and how to get it
REQUIREMENTS = {
    "trl-grpo": ("trl", "bash scripts/make_peer_venv.sh (TRL's pins clash with the main install), or --peer-python"),
    "sb3-ppo": ("stable_baselines3", "pip install 'agent-gym[sb3]'"),
    "sb3-maskable-ppo": ("sb3_contrib", "pip install 'agent-gym[sb3]'"),
}


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bench``: the fields of ``agent_gym.bench.runners.BenchConfig``, then the env kwargs."""
    add_dataclass_arguments(parser, BenchConfig, explicit_only=False)
    add_env_kwargs_arguments(parser)


def _installed(library: str, peer_python: str) -> str | None:
    """None when the library can run here, else what to do about it."""
    module, hint = REQUIREMENTS.get(library, (None, ""))
    if module is None:
        return None
    if library == "trl-grpo":
        if not Path(peer_python).exists():
            return f"not installed: {hint}"
        probe = subprocess.run([peer_python, "-c", "import trl"], capture_output=True, check=False)
        return None if probe.returncode == 0 else f"not installed: {hint}"
    return None if importlib.util.find_spec(module) is not None else f"not installed: {hint}"


def _build_default_model(env_id: str, env_kwargs: dict, out: Path, sft_episodes: int) -> Path:
    """``agent-gym model init`` + ``agent-gym sft``, the documented path to a small warm-started model."""
    import json

    warm = out / "model-warm"
    if (warm / "config.json").exists():
        print(f"bench: reusing the warm start in {warm}", file=sys.stderr)
        return warm
    kwargs = ["--env-kwargs", json.dumps(env_kwargs)]
    commands = [
        ["model", "init", "--preset", "tiny", "--corpus-from-env", env_id, "--out", str(out / "model-init"), *kwargs],
        ["sft", "--env", env_id, "--policy", "weak-multihop", "--model", str(out / "model-init"), "--out",
         str(warm), "--episodes", str(sft_episodes), *kwargs],
    ]
    for command in commands:
        print(f"bench: agent-gym {' '.join(command)}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "agent_gym.cli", *command], check=True)
    return warm


def run_bench(args: argparse.Namespace) -> int:
    libraries = [name for name in args.libraries.split(",") if name]
    unknown = [name for name in libraries if name not in RUNNERS]
    if unknown or not libraries:
        raise UsageError(f"unknown librar{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown) or '(none)'}; "
                         f"choose from {', '.join(RUNNERS)}")
    if args.episodes < 1 or args.seeds < 1 or args.eval_every < 1 or args.eval_tasks < 1:
        raise UsageError("--episodes, --seeds, --eval-every and --eval-tasks must each be at least 1")
    env_kwargs = env_kwargs_from_args(args)
    eval_env_kwargs = parse_json_object(args.eval_env_kwargs, "--eval-env-kwargs")
    cli_make_env(args.env, {**env_kwargs, **eval_env_kwargs}).close()  # a bad id or kwarg fails here, in one line
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = args.model
    # only for an LLM library that will run: building and warm-starting the tiny model takes minutes on a CPU
    runnable_llms = [name for name in libraries if name in LLM_LIBRARIES and _installed(name, args.peer_python) is None]
    if model is None and runnable_llms:
        model = str(_build_default_model(args.env, env_kwargs, out, args.sft_episodes))
    elif model is not None and runnable_llms:
        from agent_gym.models.pretrained import PretrainedModelError, resolve_model

        with user_errors(PretrainedModelError):
            model = resolve_model(model)  # a known name (smollm2-135m-instruct) becomes its converted checkpoint
    settings = BenchSettings(
        env_id=args.env, env_kwargs=env_kwargs, eval_env_kwargs=eval_env_kwargs, episodes=args.episodes,
        eval_every=args.eval_every, eval_tasks=args.eval_tasks, model=model or "", tasks_per_step=args.tasks_per_step,
        group_size=args.group_size, max_new_tokens=args.max_new_tokens, max_turns=args.max_turns, lr=args.lr,
    )
    results = out / "results.jsonl"
    results.write_text("")
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                             os.environ.get("PYTHONPATH", "")]))}
    for library in libraries:
        problem = _installed(library, args.peer_python)
        if problem:
            print(f"bench: {library}: {problem}", file=sys.stderr)
            with results.open("a", encoding="utf-8") as handle:
                handle.write(BenchRecord(library, "", 0, 0, 0.0, status=problem).to_json() + "\n")
            continue
        python = args.peer_python if library == "trl-grpo" else sys.executable
        for seed in range(args.seeds):
            log = out / f"{library}-seed{seed}.jsonl"
            log.write_text("")
            started = time.perf_counter()
            print(f"bench: {library} seed {seed} ...", file=sys.stderr, flush=True)
            completed = subprocess.run(
                [python, "-m", "agent_gym.cli.bench_runner", "--library", library, "--seed", str(seed),
                 "--settings", settings_json(settings), "--out", str(log)], env=child_env, check=False)
            print(f"bench: {library} seed {seed}: exit {completed.returncode} after "
                  f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
            with results.open("a", encoding="utf-8") as handle:
                handle.write(log.read_text())
                if completed.returncode != 0:
                    failed = BenchRecord(library, "", seed, 0, 0.0, status=f"failed (exit {completed.returncode})")
                    handle.write(failed.to_json() + "\n")
    records = read_records([results])
    table = format_table(records, libraries)
    (out / "table.md").write_text(table + "\n")
    curves = plot_curves(records, libraries, out / "curves.png")
    print(table)
    print(f"bench: records in {results}, table in {out / 'table.md'}, curves in {curves}", file=sys.stderr)
    return 0
