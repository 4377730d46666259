"""The agent learns (issue 7): a from-scratch model that copies, a warm start, then RL; tables and curves.

Stages, each skipped when its output exists (so a killed run resumes; every training command also resumes from
its own last checkpoint):

  1. pretrain: `agent-gym model init` (letters tokenizer) + `agent-gym model pretrain` (induction warm-up,
     pointer drills on never-seen names). Skipped when ``--pretrained DIR`` is given: the committed checkpoint
     ``experiments/checkpoints/copy-tiny`` is the default, so the RL demonstration fits its time budget.
  2. copy skill of the pretrained model on held-out worlds (the gate: >= 0.9 exact on every turn);
  3. warm start: `agent-gym sft` on `weak-multihop` episodes, with drills mixed in;
  4. warm-start check: held-out EM greedy and sampled at temperature 1, beside the teacher's own, and how often
     it searches hop by hop;
  5. RL: `agent-gym train` for each (variant, seed), ``--parallel`` processes with one thread each;
  6. final held-out EM of every run, greedy and sampled (>= 200 questions of a held-out world);
  7. value-guided decoding: greedy vs best-of-N by log-likelihood vs the PPO critic's choice;
  8. the table (OUT/table.md), one record per run (OUT/learning.json, copied to docs/results/), the curves.

    python experiments/learning.py --out runs/learning                 # everything
    python experiments/learning.py --out runs/learning --only core     # warm start, GRPO and PPO x 3 seeds
    python experiments/learning.py --copy-skill MODEL_DIR [...]        # the copy-skill gate only
    python experiments/learning.py --model smollm2-135m-instruct --out runs/real   # a real model (real_model.py)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV_ID = "AgentR1-SynthHop-v0"
PRETRAINED = ROOT / "experiments" / "checkpoints" / "copy-tiny"
# 2-hop bridge questions about a 20,000-page world (so names rarely repeat between training episodes), 3 hits a
# search, 4 turns at most (the env's own limit: an unanswered episode pays the paper's format penalty).
TRAIN_ENV = {"num_pages": 20_000, "world_seed": 0, "kinds": ["bridge"], "hops": 2, "top_k": 3, "max_turns": 4,
             "split": "train", "num_questions": 4000}
# Held out: another world, so no name of an eval question was ever seen in training.
EVAL_ENV = {**TRAIN_ENV, "world_seed": 1, "split": "test", "num_questions": 400}
COPY_SKILL_ENV = {**EVAL_ENV, "num_pages": 2000, "world_seed": 424_242}
TEACHER = "weak-multihop"


def train_env(args: argparse.Namespace) -> dict[str, Any]:
    """TRAIN_ENV with ``--hops`` (one count, or a mix such as 1 2: the issue's fallback when 2-hop is out of reach)."""
    return {**TRAIN_ENV, "hops": args.hops[0] if len(args.hops) == 1 else list(args.hops)}


def eval_env(args: argparse.Namespace) -> dict[str, Any]:
    return {**EVAL_ENV, "hops": train_env(args)["hops"]}


def mixed_hops(args: argparse.Namespace) -> bool:
    """Whether training mixes hop counts; the 2-hop row is then measured on its own as well."""
    return train_env(args)["hops"] != 2


@dataclass(frozen=True)
class Variant:
    """One row of the table: an estimator and the flags that make it differ from the shared settings."""

    name: str
    label: str
    algo: str
    flags: tuple[str, ...] = ()
    ablation: str = ""
    reward: str = "paper"  # the env's reward spec: paper (Eq. 6, sparse), dense (process rewards too), dense_charged


VARIANTS = {
    v.name: v
    for v in (
        Variant("grpo", "GRPO", "grpo"),
        # verl's critic lr (1e-5) is for a pretrained 3B backbone; this small critic needs a larger one.
        Variant("ppo", "PPO", "ppo", ("--critic-lr", "1e-3")),
        Variant("reinforce_pp", "REINFORCE++", "reinforce_pp"),
        Variant("rloo", "RLOO", "rloo"),
        Variant("grpo_no_loss_mask", "GRPO, loss mask off", "grpo", ("--no-use-loss-mask",), "loss mask off"),
        Variant("grpo_no_advantage_mask", "GRPO, advantage mask off", "grpo", ("--no-use-advantage-mask",),
                "advantage mask off"),
        # GRPO broadcasts one outcome advantage per episode, so with the loss mask on its advantage mask is a
        # no-op; GAE is where env tokens would enter the credit chain (values, discount), as in the paper.
        Variant("ppo_no_advantage_mask", "PPO, advantage mask off", "ppo",
                ("--critic-lr", "1e-3", "--no-use-advantage-mask"), "advantage mask off"),
    )
}
GROUPS = {"core": ["grpo", "ppo"], "all": list(VARIANTS)}


# ---------------------------------------------------------------------------------------------- commands


def _command_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _start(command: Sequence[str], log: Path, threads: int = 1) -> subprocess.Popen:
    """Start `command` with `threads` torch/OpenMP threads, stdout+stderr appended to `log`."""
    print("$", shlex.join(command), flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("a", encoding="utf-8")
    return subprocess.Popen(list(command), stdout=handle, stderr=subprocess.STDOUT, env=_command_env(threads))


def _run(command: Sequence[str], log: Path, what: str, threads: int = 1) -> None:
    process = _start(command, log, threads)
    if process.wait() != 0:
        raise SystemExit(f"{what} failed (exit {process.returncode}){_kill_hint(process.returncode)}; see {log}")


def _kill_hint(returncode: int) -> str:
    """Why a process may have died without a traceback: a SIGKILL is, on Linux, most often the out-of-memory
    killer (fp32 updates on a CPU without native bf16 take about twice bf16's memory)."""
    if returncode != -signal.SIGKILL:
        return ""
    return (": killed by SIGKILL, on Linux usually the out-of-memory killer (`dmesg | grep -i oom`); a smaller "
            "--micro-batch-size lowers the update's peak memory (gradients accumulate to the same batch)")


def fresh_flags(directory: Path) -> list[str]:
    """``--overwrite`` for a run directory that a killed job left without a checkpoint (the CLI refuses a non-empty
    directory it cannot continue); nothing where there is a checkpoint to resume from, or no directory yet."""
    from agent_gym.trainers.checkpoint import list_checkpoints

    left_over = directory.is_dir() and any(directory.iterdir())
    return ["--overwrite"] if left_over and not list_checkpoints(directory) else []


def _agent_gym(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent_gym.cli", *args]


class Timings:
    """Wall seconds of each stage, kept in OUT/timings.json across resumed runs."""

    def __init__(self, out: Path) -> None:
        self.path = out / "timings.json"
        self.values: dict[str, float] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def record(self, stage: str, seconds: float) -> None:
        if self.path.is_file():  # another process of the same experiment may have recorded a stage meanwhile
            self.values = json.loads(self.path.read_text())
        self.values[stage] = round(self.values.get(stage, 0.0) + seconds, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.values, indent=2))
        print(f"[{stage}] {seconds:.0f} s", flush=True)


# ---------------------------------------------------------------------------------------------- stages


def pretrain(args: argparse.Namespace, timings: Timings) -> Path:
    """Stage 1: the pretrained model directory (given, committed, or built here)."""
    if args.pretrained:
        return Path(args.pretrained)
    out = Path(args.out)
    init_dir, run_dir = out / "init", out / "pretrain"
    started = time.perf_counter()
    if not (init_dir / "config.json").is_file():
        _run(_agent_gym("model", "init", "--preset", "tiny", "--out", str(init_dir), "--corpus-from-env", ENV_ID,
                        "--env-kwarg", "num_pages=20000", "--vocab-size", "3000", "--seed", "0"),
             out / "logs" / "init.log", "model init", args.threads)
    if not (run_dir / "final" / "config.json").is_file():
        _run(_agent_gym("model", "pretrain", "--model", str(init_dir), "--output-dir", str(run_dir),
                        *fresh_flags(run_dir), "--induction-steps", str(args.induction_steps),
                        "--drill-steps", str(args.drill_steps),
                        "--eval-episodes", str(min(64, args.skill_episodes)),
                        "--torch-threads", str(args.threads), "--no-show-progress"),
             out / "logs" / "pretrain.log", "model pretrain", args.threads)
        timings.record("pretrain", time.perf_counter() - started)
    return run_dir / "final"


def copy_skill(model_dir: str | Path, episodes: int = 200) -> dict[str, float]:
    """Teacher-forced exactness of each turn of the oracle's held-out episodes (copy_skill.py)."""
    from agent_gym.models.model_init import load_model_and_tokenizer
    from agent_gym.warmstart.copy_skill import copy_skill as measure

    model, tokenizer = load_model_and_tokenizer(model_dir)
    return measure(model, tokenizer, ENV_ID, {**COPY_SKILL_ENV, "num_questions": episodes}, episodes)


def warm_start(args: argparse.Namespace, pretrained: Path, timings: Timings) -> Path:
    """Stage 3: SFT on the teacher's episodes, drills mixed in (they keep the copy skill SFT would erode)."""
    out_dir = Path(args.out) / "warmstart"
    if (out_dir / "sft_summary.json").is_file():
        return out_dir
    started = time.perf_counter()
    _run(_agent_gym("sft", "--env", ENV_ID, "--env-kwargs", json.dumps(train_env(args)), "--policy", TEACHER,
                    "--policy-kwarg", f"p_multihop={args.p_multihop}", "--model", str(pretrained),
                    "--out", str(out_dir), *fresh_flags(out_dir), "--episodes", str(args.sft_episodes), "--epochs", "1",
                    "--batch-size", "4", "--lr", str(args.sft_lr), "--drill-tokens", str(args.sft_drill_tokens),
                    "--save-every", "100", "--torch-threads", str(args.threads), "--seed", "0"),
         Path(args.out) / "logs" / "sft.log", "sft", args.threads)
    timings.record("warm start (sft)", time.perf_counter() - started)
    return out_dir


def heldout(model_dir: Path | None, temperature: float, episodes: int, env_kwargs: dict[str, Any], seed: int = 0,
            policy_options: dict[str, Any] | None = None) -> dict[str, float]:
    """EM on the held-out world's first ``episodes`` questions (``env_kwargs``: EVAL_ENV or a variant of it), of a
    model (batched rollouts) or of the teacher.

    ``multihop`` is the share of episodes that searched more than once (the teacher's hop-by-hop branch).
    """

    from agent_gym.make import make_env

    if model_dir is None:  # the scripted teacher
        from agent_gym.evaluation import evaluate
        from agent_gym.policies import make_policy

        env = make_env(ENV_ID, env_kwargs)
        records = evaluate(env, make_policy(TEACHER, seed=seed, **(policy_options or {})), episodes, seed=seed,
                           progress=False)
        env.close()
        return {"em": statistics.mean(r.em for r in records), "episodes": len(records),
                "multihop": statistics.mean(float(r.tool_calls > 1) for r in records)}
    from agent_gym.models.model_init import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(model_dir)
    firsts = play_heldout(model, tokenizer, ENV_ID, env_kwargs, episodes, temperature, seed, max_new_tokens=40)
    # A naive episode takes 2 turns (search the question, answer); a hop-by-hop one at least 3.
    return {"em": statistics.mean(float(t.episode.em or 0.0) for t in firsts), "episodes": len(firsts),
            "turns": statistics.mean(t.episode.turns for t in firsts),
            "multihop": statistics.mean(float(t.episode.turns > 2) for t in firsts)}


def play_heldout(model: Any, tokenizer: Any, env_id: str, env_kwargs: dict[str, Any], episodes: int,
                 temperature: float, seed: int, max_new_tokens: int) -> list[Any]:
    """One trajectory per task ``0 .. episodes-1`` (batched rollouts, 32 envs; greedy at temperature 0)."""
    from agent_gym.make import make_env
    from agent_gym.trainers.backends import TransformersBackend
    from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig

    envs = [make_env(env_id, env_kwargs) for _ in range(min(32, episodes))]
    config = RolloutConfig(max_new_tokens=max_new_tokens, max_context_tokens=2048, temperature=temperature or 1.0,
                           show_progress=False)
    collector = RolloutCollector(envs, TransformersBackend(model, tokenizer), tokenizer, config)
    specs = [{"seed": index, "options": {"task_index": index}} for index in range(episodes)]
    trajectories = collector.collect(specs, group_size=1, greedy=temperature == 0, seed=seed)
    collector.close()
    return [t for t in trajectories if t.info.get("sample_index", 0) == 0]


def check_warm_start(args: argparse.Namespace, model_dir: Path, timings: Timings) -> dict[str, Any]:
    """Stage 4: the warm start against its teacher, greedy and at temperature 1 (cached in OUT)."""
    path = Path(args.out) / "warmstart_eval.json"
    if path.is_file():
        return json.loads(path.read_text())
    started = time.perf_counter()
    # The teacher's "greedy" is its likelier branch every time: hop by hop only if p_multihop > 0.5.
    greedy_teacher = {"p_multihop": 1.0 if args.p_multihop > 0.5 else 0.0}
    sampled_teacher = {"p_multihop": args.p_multihop}
    env, episodes = eval_env(args), args.eval_episodes
    result = {
        "p_multihop": args.p_multihop, "hops": env["hops"],
        "teacher": {"greedy": heldout(None, 0.0, episodes, env, policy_options=greedy_teacher),
                    "sampled": heldout(None, 1.0, episodes, env, policy_options=sampled_teacher)},
        "warm_start": {"greedy": heldout(model_dir, 0.0, episodes, env),
                       "sampled": heldout(model_dir, 1.0, episodes, env, seed=1)},
    }
    if mixed_hops(args):
        result["teacher"]["greedy_2hop"] = heldout(None, 0.0, episodes, EVAL_ENV, policy_options=greedy_teacher)
        result["warm_start"]["greedy_2hop"] = heldout(model_dir, 0.0, episodes, EVAL_ENV)
    path.write_text(json.dumps(result, indent=2))
    timings.record("warm-start check", time.perf_counter() - started)
    return result


def train_command(args: argparse.Namespace, model: Path, variant: Variant, seed: int) -> list[str]:
    """The `agent-gym train` command of one (variant, seed)."""
    return _agent_gym(
        "train", "--env", ENV_ID, "--model", str(model),
        "--env-kwargs", json.dumps(train_env(args)), "--eval-env-kwargs", json.dumps(eval_env(args)),
        "--algo", variant.algo, *variant.flags,
        "--seed", str(seed), "--total-steps", str(args.steps),
        "--tasks-per-step", str(args.tasks_per_step), "--group-size", str(args.group_size),
        "--lr", str(args.lr), "--temperature", "1.0", "--max-new-tokens", "40", "--max-context-tokens", "2048",
        # No reference model: the KL term (verl's 0.001) is negligible at this lr and costs a forward pass.
        "--kl-coef", "0",
        "--eval-every", str(args.eval_every), "--eval-episodes", str(args.curve_episodes),
        "--save-every", str(args.eval_every), "--torch-threads", "1",
        "--output-dir", str(Path(args.out) / "rl" / f"{variant.name}-s{seed}"),
        *fresh_flags(Path(args.out) / "rl" / f"{variant.name}-s{seed}"),
        "--no-show-progress", "--no-tensorboard",
    )


def run_rl(args: argparse.Namespace, model: Path, variants: Sequence[str], timings: Timings) -> None:
    """Stage 5: every (variant, seed) not yet finished, at most ``args.parallel`` at a time."""
    jobs = []
    for seed in args.seeds:
        for name in variants:
            run_dir = Path(args.out) / "rl" / f"{name}-s{seed}"
            if not (run_dir / "final" / "config.json").is_file():
                jobs.append((f"{name}-s{seed}", train_command(args, model, VARIANTS[name], seed)))
    run_jobs(jobs, args.parallel, Path(args.out), timings)


def run_jobs(jobs: list[tuple[str, list[str]]], parallel: int, out: Path, timings: Timings) -> None:
    """Run (label, command) training jobs, at most ``parallel`` at a time, each logging to OUT/logs/LABEL.log."""
    if not jobs:
        return
    jobs = list(jobs)
    started = time.perf_counter()
    running: list[tuple[str, subprocess.Popen, float]] = []
    failed = []
    while jobs or running:
        while jobs and len(running) < parallel:
            label, command = jobs.pop(0)
            running.append((label, _start(command, out / "logs" / f"{label}.log"), time.perf_counter()))
        time.sleep(2)
        for entry in list(running):
            label, process, begun = entry
            if process.poll() is not None:
                running.remove(entry)
                status = "done" if process.returncode == 0 else f"FAILED (exit {process.returncode})"
                print(f"{label}: {status} in {time.perf_counter() - begun:.0f} s", flush=True)
                timings.record(f"rl {label}", time.perf_counter() - begun)
                if process.returncode != 0:
                    failed.append(label)
    timings.record("rl grid (wall)", time.perf_counter() - started)
    if failed:
        raise SystemExit(f"RL runs failed: {failed}; see their logs in {out / 'logs'}")


def final_evals(args: argparse.Namespace, variants: Sequence[str], timings: Timings) -> None:
    """Stage 6: greedy and sampled held-out EM of every finished run (cached in the run's directory)."""
    started = time.perf_counter()
    for seed in args.seeds:
        for name in variants:
            run_dir = Path(args.out) / "rl" / f"{name}-s{seed}"
            path = run_dir / "final_eval.json"
            if path.is_file() or not (run_dir / "final" / "config.json").is_file():
                continue
            env, episodes = eval_env(args), args.eval_episodes
            result = {"greedy": heldout(run_dir / "final", 0.0, episodes, env),
                      "sampled": heldout(run_dir / "final", 1.0, episodes, env, seed=1)}
            if mixed_hops(args):
                result["greedy_2hop"] = heldout(run_dir / "final", 0.0, episodes, EVAL_ENV)
            path.write_text(json.dumps(result, indent=2))
            print(f"{name}-s{seed}: {json.dumps(result)}", flush=True)
    timings.record("final evals", time.perf_counter() - started)


def value_guided(args: argparse.Namespace, timings: Timings) -> dict[str, Any]:
    """Stage 7: on each PPO run, the same questions decoded greedily, best-of-N by log-likelihood, and
    value-guided (N candidates, the critic's pick); EM and cost."""
    path = Path(args.out) / "value_guided.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    started = time.perf_counter()
    for seed in args.seeds:
        run_dir = Path(args.out) / "rl" / f"ppo-s{seed}"
        if f"ppo-s{seed}" in results or not (run_dir / "final" / "critic.pt").is_file():
            continue
        rows = {}
        for label, flags in (("greedy", []), (f"best-of-{args.candidates}", ["--best-of", str(args.candidates)]),
                             (f"value-guided-{args.candidates}", ["--value-guided", str(args.candidates)])):
            out = Path(args.out) / "value_guided" / f"ppo-s{seed}-{label}.jsonl"
            _run(_agent_gym("eval", ENV_ID, "--model", str(run_dir), *flags, "--episodes", str(args.vg_episodes),
                            "--env-kwargs", json.dumps(eval_env(args)), "--out", str(out), "--no-progress"),
                 Path(args.out) / "logs" / "value_guided.log", f"eval {label}", 1)
            records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
            rows[label] = {"em": statistics.mean(r["em"] for r in records), "episodes": len(records),
                           "tokens_per_episode": statistics.mean(r["generated_tokens"] for r in records),
                           "seconds_per_episode": statistics.mean(r["seconds"] for r in records)}
        results[f"ppo-s{seed}"] = rows
        path.write_text(json.dumps(results, indent=2))
    timings.record("value-guided decoding", time.perf_counter() - started)
    return results


# ---------------------------------------------------------------------------------------------- summary


def _curve(run_dir: Path, key: str) -> list[tuple[int, float]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(int(row["step"]), float(row[key])) for row in rows if row.get(key) is not None]


def _mean_spread(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    return f"{100 * statistics.mean(values):.1f} ± {100 * (max(values) - min(values)) / 2:.1f} (n={len(values)})"


def summarize(args: argparse.Namespace, variants: Sequence[str]) -> list[dict[str, Any]]:
    """Stage 8: one record per run, the Markdown table, the curves."""
    out = Path(args.out)
    warm = json.loads((out / "warmstart_eval.json").read_text())["warm_start"]
    records = []
    for name in variants:
        for seed in args.seeds:
            run_dir = out / "rl" / f"{name}-s{seed}"
            final_path = run_dir / "final_eval.json"
            if not final_path.is_file():
                continue
            final = json.loads(final_path.read_text())
            variant = VARIANTS[name]
            records.append({
                "run": f"{name}-s{seed}", "algorithm": variant.algo, "seed": seed, "ablation": variant.ablation,
                "warm_start_em": {"greedy": warm["greedy"]["em"], "sampled": warm["sampled"]["em"],
                                  **({"greedy_2hop": warm["greedy_2hop"]["em"]} if "greedy_2hop" in warm else {})},
                "final_em": {"greedy": final["greedy"]["em"], "sampled": final["sampled"]["em"],
                             **({"greedy_2hop": final["greedy_2hop"]["em"]} if "greedy_2hop" in final else {})},
                "final_multihop": {"greedy": final["greedy"]["multihop"], "sampled": final["sampled"]["multihop"]},
                "eval_episodes": final["greedy"]["episodes"],
                "em_curve": _curve(run_dir, "eval/em"), "reward_curve": _curve(run_dir, "charts/reward"),
                "entropy_curve": _curve(run_dir, "losses/entropy"),
            })
    columns = ["greedy", "sampled"] + (["greedy_2hop"] if "greedy_2hop" in warm else [])
    titles = {"greedy": "greedy EM (%), mean ± half-range", "sampled": "sampled EM (%)",
              "greedy_2hop": "2-hop greedy EM (%)"}
    lines = ["| agent | " + " | ".join(f"{titles[c]} | gain (points)" for c in columns) + " |",
             "|---" * (1 + 2 * len(columns)) + "|",
             "| warm start | " + " | ".join(f"{100 * warm[c]['em']:.1f} | —" for c in columns) + " |"]
    for name in variants:
        rows = [r for r in records if r["run"].startswith(f"{name}-s")]
        if not rows:
            continue
        cells = []
        for column in columns:
            values = [r["final_em"][column] for r in rows]
            cells.append(f"{_mean_spread(values)} | {100 * (statistics.mean(values) - warm[column]['em']):+.1f}")
        lines.append(f"| {VARIANTS[name].label} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n", encoding="utf-8")
    (out / "learning.json").write_text(json.dumps(records, indent=2))
    print(table, flush=True)
    plot_curves(out, records, warm)
    return records


def plot_curves(out: Path, records: Sequence[dict[str, Any]], warm: dict[str, Any]) -> None:
    """EM and reward by step: per variant the mean over seeds and a band (min-max), the warm start marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    styles = ("-", "--", "-.", ":")
    markers = "os^vD<>"
    for key, axis, title in (("em_curve", axes[0], "held-out greedy EM"), ("reward_curve", axes[1], "train reward"),
                             ("entropy_curve", axes[2], "entropy (model tokens)")):
        by_variant: dict[str, list[dict[int, float]]] = {}
        for record in records:
            variant = record["run"].rsplit("-s", 1)[0]
            # this study's variants only: learning.json also holds the real model's runs (rl_campaign.py plots
            # those), and the sweep's SFT records (algorithm "sft") have no training curve
            if key in record and variant in VARIANTS:
                by_variant.setdefault(variant, []).append(dict(record[key]))
        for index, (name, curves) in enumerate(by_variant.items()):
            steps = sorted(set.intersection(*(set(curve) for curve in curves)))
            if not steps:
                continue
            values = np.array([[curve[step] for step in steps] for curve in curves])
            # a style and marker each, above every band, and earlier variants wider: where two means coincide
            # (GRPO's EM and its advantage-mask ablation's), the later line is drawn inside the earlier one
            wider = len(by_variant) - 1 - index
            line, = axis.plot(steps, values.mean(0), label=VARIANTS[name].label, linestyle=styles[index % 4],
                              marker=markers[index % len(markers)], markersize=3 + 0.4 * wider,
                              linewidth=1.2 + 0.35 * wider, zorder=3)
            axis.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.12, zorder=1)
        if key == "em_curve":
            axis.axhline(warm["greedy"]["em"], color="grey", linestyle="--", label="warm start", zorder=2)
        axis.set_title(title)
        axis.set_xlabel("RL step")
    # one legend below the panels: inside the EM panel it covered the curves
    handles, labels = axes[0].get_legend_handles_labels()
    columns = min(len(labels), 4) or 1
    legend_rows = -(-len(labels) // columns)
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.045 * legend_rows + 0.02, 1, 1))
    fig.savefig(out / "curves.png", dpi=80)
    plt.close(fig)


def plot_copy_curve(run_dir: Path, png: Path) -> None:
    """The copy skill against pretraining steps, one line per turn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    fig, axis = plt.subplots(figsize=(6, 4))
    for turn in (1, 2, 3):
        points = [(r["step"], r[f"copy/turn{turn}_exact"]) for r in rows if f"copy/turn{turn}_exact" in r]
        if points:
            axis.plot(*zip(*points, strict=True), marker="o", label=f"turn {turn} exact")
    axis.set_xlabel("pretraining step")
    axis.set_ylabel("held-out exact copy")
    axis.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(arg == "--model" or arg.startswith("--model=") for arg in argv):  # a real pretrained model: issue 18
        # run as a script, not imported: real_model.py imports this module's helpers, and imports go one way
        script = Path(__file__).resolve().with_name("real_model.py")
        return subprocess.run([sys.executable, str(script), *argv], check=False).returncode
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/learning", help="experiment directory")
    parser.add_argument("--only", choices=sorted(GROUPS), default="all", help="core: GRPO and PPO only")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--parallel", type=int, default=2, help="training processes at a time (2 cores)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the single-process stages")
    parser.add_argument("--pretrained", default=str(PRETRAINED) if (PRETRAINED / "config.json").is_file() else None,
                        help="pretrained model (default: the committed checkpoint, if present; else pretrain here)")
    parser.add_argument("--induction-steps", type=int, default=1200, help="pretraining stage 1 steps")
    parser.add_argument("--drill-steps", type=int, default=3000, help="pretraining stage 2 steps")
    parser.add_argument("--hops", nargs="+", type=int, default=[2],
                        help="hop counts of the train and eval questions; several mix them, and the 2-hop greedy "
                             "row is then measured on its own")
    parser.add_argument("--p-multihop", type=float, default=0.3, help="teacher's share of hop-by-hop episodes")
    parser.add_argument("--sft-episodes", type=int, default=3000)
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument("--sft-drill-tokens", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=40, help="RL steps per run")
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-4, help="RL learning rate")
    parser.add_argument("--eval-every", type=int, default=10, help="RL steps between curve points")
    parser.add_argument("--curve-episodes", type=int, default=100, help="held-out questions per curve point")
    parser.add_argument("--eval-episodes", type=int, default=200, help="held-out questions of the final evals")
    parser.add_argument("--candidates", type=int, default=4, help="N of best-of-N and value-guided decoding")
    parser.add_argument("--vg-episodes", type=int, default=100, help="questions of the value-guided comparison")
    parser.add_argument("--stage", choices=["pretrain", "all"], default="all", help="pretrain: stop after stage 2")
    parser.add_argument("--skill-episodes", type=int, default=200, help="held-out episodes of the copy-skill gate")
    parser.add_argument("--copy-skill", nargs="+", metavar="MODEL_DIR", default=None,
                        help="only measure the copy skill of these models")
    args = parser.parse_args(argv)
    if args.copy_skill:
        for model_dir in args.copy_skill:
            skill = copy_skill(model_dir, args.skill_episodes)
            print(model_dir, json.dumps({k: round(v, 3) for k, v in skill.items()}), flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timings = Timings(out)
    pretrained = pretrain(args, timings)
    skill_path = out / "copy_skill.json"
    if not skill_path.is_file():
        skill = copy_skill(pretrained, args.skill_episodes)
        skill_path.write_text(json.dumps({"model": str(pretrained), **skill}, indent=2))
    print("copy skill:", skill_path.read_text(), flush=True)
    if args.stage == "pretrain":
        return 0
    variants = GROUPS[args.only]
    model = warm_start(args, pretrained, timings)
    print("warm start:", json.dumps(check_warm_start(args, model, timings)), flush=True)
    run_rl(args, model, variants, timings)
    final_evals(args, variants, timings)
    if "ppo" in variants:
        print("value-guided:", json.dumps(value_guided(args, timings)), flush=True)
    summarize(args, variants)
    results = ROOT / "docs" / "results"
    results.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "learning.json", results / "learning.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
