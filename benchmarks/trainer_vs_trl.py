"""Trainer throughput: our GRPO `Trainer` against TRL's `GRPOTrainer`, same tiny model, same batch, same run.

Both sides train the same locally built tiny Qwen2 model (saved once to a temp dir, so both load the same
weights) with GRPO on the same single-turn prompts and the same reward (a keyword/length score of the
completion text): ours through a one-step Gymnasium env defined here (DESIGN §2 contract), TRL through a
dataset of the same chat prompts and a reward function calling the same scorer. Matched settings:
prompts per step (TRL: generation batch / num_generations), group size (num_generations), max new tokens
(max_completion_length), temperature 1, top-p 1, top-k off, lr, constant schedule, no weight decay, grad
clip 1.0, float32, no gradient checkpointing, one optimizer step per rollout batch (TRL:
gradient_accumulation_steps x per_device_train_batch_size = batch, num_iterations=1), micro-batch size
(per_device_train_batch_size), no reference model (our kl_coef 0, TRL beta 0), clip 0.2 both sides (our
dual clip off), token-mean loss (TRL loss_type "dapo"), torch threads 1. Each side runs in its own
subprocess, one after the other; wall time is measured over `--steps` optimizer steps after one warm-up
step, and tokens are the generated completion tokens of those steps.

TRL must stay out of the main environment (it can move transformers/accelerate, which vLLM pins), so run
this with a separate venv that holds both TRL and agent-gym:

    python -m venv /tmp/trl-venv
    /tmp/trl-venv/bin/pip install torch==2.13.0          # the local CPU wheel; other pins download GBs
    echo "torch==2.13.0" > /tmp/trl-constraints.txt
    /tmp/trl-venv/bin/pip install -c /tmp/trl-constraints.txt trl transformers==5.19.0 \
        gymnasium numpy tqdm tantivy tokenizers safetensors pyyaml   # transformers as in the main env
    /tmp/trl-venv/bin/pip install -e . --no-deps          # from the repository root
    /tmp/trl-venv/bin/python benchmarks/trainer_vs_trl.py

`--side ours` runs only our trainer (no TRL needed); `--trl-python PATH` runs the TRL side with another
interpreter while ours uses the current one.

The SmolLM2 setting: `--model smollm2-135m-instruct` (a known name, converted in ~/.cache/agent-gym/models;
both sides load that checkpoint) with `--dtype bfloat16`: both sides hold the weights in bf16 (ours:
`TrainConfig.dtype`; TRL: the model loaded in bf16 and `bf16=True`), AdamW on the bf16 parameters. Each side
also reports its process's peak RSS (`ru_maxrss`, model loading included). On a busy 2-core machine keep the
work small, the same on both sides:

    bash scripts/make_peer_venv.sh .venv-peers
    OMP_NUM_THREADS=1 python benchmarks/trainer_vs_trl.py --trl-python .venv-peers/bin/python \
        --model smollm2-135m-instruct --dtype bfloat16 --tasks-per-step 2 --group-size 2 \
        --micro-batch-size 4 --max-new-tokens 32 --steps 1 --rounds 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

# Words the tokenizer is trained on and the prompts are made of; the first _NUM_KEYWORDS of them score.
_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
_NUM_WORDS = 3000
_NUM_KEYWORDS = 300
_SYSTEM = "Continue the text. Each listed keyword you write scores."


def _vocabulary(seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(2, 9))) for _ in range(_NUM_WORDS)]


def keyword_reward(text: str, keywords: frozenset[str]) -> float:
    """Keyword hits plus a small length term: varies across a group even for a random model."""
    words = text.split()
    return float(sum(word in keywords for word in words)) + 0.01 * len(words)


def make_prompts(num_prompts: int, seed: int) -> tuple[list[list[dict[str, str]]], frozenset[str]]:
    """Chat prompts (system + user) and the keyword set of the reward."""
    words = _vocabulary(seed)
    keywords = frozenset(words[:_NUM_KEYWORDS])
    rng = random.Random(seed + 1)
    prompts = []
    for _ in range(num_prompts):
        shown = " ".join(rng.sample(words[:_NUM_KEYWORDS], 5))
        text = " ".join(rng.choices(words, k=rng.randint(10, 30)))
        prompts.append(
            [{"role": "system", "content": f"{_SYSTEM} Keywords: {shown}"}, {"role": "user", "content": text}]
        )
    return prompts, keywords


class KeywordEnv(gym.Env):
    """A single-turn text env: reset shows a chat prompt, the first step scores the reply and ends."""

    metadata = {"render_modes": []}

    def __init__(self, prompts: Sequence[list[dict[str, str]]], keywords: frozenset[str]) -> None:
        from agent_gym.spaces import UnicodeText

        if not prompts:
            raise ValueError("KeywordEnv needs at least one prompt")
        self.prompts, self.keywords = list(prompts), keywords
        self.observation_space = UnicodeText(max_length=100_000)
        self.action_space = UnicodeText(max_length=100_000)
        self._index = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        if "task_index" in options:
            self._index = int(options["task_index"]) % len(self.prompts)
        else:
            self._index = int(self.np_random.integers(len(self.prompts)))
        messages = self.prompts[self._index]
        info = {"messages": list(messages), "tools": [], "task_id": str(self._index), "turn": 0}
        return messages[-1]["content"], info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reward = keyword_reward(action, self.keywords)
        messages = [*self.prompts[self._index], {"role": "assistant", "content": action}]
        info = {
            "messages": messages,
            "task_id": str(self._index),
            "turn": 1,
            "reward_components": {"outcome": reward},
            "tool_calls": [],
        }
        return "", reward, True, False, info


def build_model(out_dir: Path, preset: str, seed: int) -> Path:
    """The tiny model both sides load: a BPE tokenizer trained on the prompt vocabulary, random weights."""
    from agent_gym.models.model_init import init_model

    words = _vocabulary(seed)
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(words, k=40)) for _ in range(3000)] + [_SYSTEM]
    return init_model(texts, out_dir, preset=preset, seed=seed)


def _limit_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------- sides


def run_ours(args: argparse.Namespace) -> dict[str, float]:
    """Our `Trainer` on `KeywordEnv`; times `train_step` after one warm-up step."""
    from agent_gym.trainers import metrics as m
    from agent_gym.trainers.config import TrainConfig
    from agent_gym.trainers.trainer import Trainer

    prompts, keywords = make_prompts(args.num_prompts, args.seed)
    config = TrainConfig(
        model=args.model,
        algo="grpo",
        group_size=args.group_size,
        tasks_per_step=args.tasks_per_step,
        total_steps=args.steps + 1,
        ppo_epochs=1,
        num_mini_batches=1,
        micro_batch_size=args.micro_batch_size,
        kl_coef=0.0,
        dual_clip=None,  # TRL has no dual clip
        aggregation="token-mean",
        lr=args.lr,
        weight_decay=0.0,
        max_grad_norm=1.0,
        temperature=args.temperature,
        top_p=1.0,
        max_new_tokens=args.max_new_tokens,
        max_context_tokens=4096,
        max_turns=1,
        eval_every=0,
        save_every=0,
        resume="never",
        output_dir=args.scratch,
        tensorboard=False,
        show_progress=False,
        torch_threads=args.threads,
        dtype=args.dtype,
        device="cpu",
        seed=args.seed,
    )
    env_fns = [lambda: KeywordEnv(prompts, keywords)] * config.rollout_batch_size
    trainer = Trainer(config, env_fns=env_fns, eval_env_fns=[])
    tokens: list[int] = []
    collect = trainer.collector.collect

    def counting_collect(*a: Any, **k: Any) -> Any:  # completion tokens of each step (single turn: all model)
        trajectories = collect(*a, **k)
        tokens.append(sum(len(t.response_ids) for t in trajectories))
        return trajectories

    trainer.collector.collect = counting_collect
    trainer.train_step()  # warm-up: first-call allocations, lazy inits
    rollout_s = update_s = reward = 0.0
    started = time.perf_counter()
    for _ in range(args.steps):
        metrics = trainer.train_step()
        rollout_s += metrics[m.ROLLOUT_TIME]
        update_s += metrics[m.UPDATE_TIME]
        reward += metrics[m.REWARD]
    seconds = time.perf_counter() - started
    trainer.close()
    return _result(args.steps, seconds, sum(tokens[1:]), rollout_s, update_s, reward / args.steps, args)


def run_trl(args: argparse.Namespace) -> dict[str, float]:
    """TRL's `GRPOTrainer` on the same prompts and reward; times optimizer steps after one warm-up step."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prompts, keywords = make_prompts(args.num_prompts, args.seed)
    batch = args.tasks_per_step * args.group_size
    tokens: list[int] = []
    rewards: list[float] = []

    def reward_fn(completions: list, completion_ids: list[list[int]], **_: Any) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        scores = [
            keyword_reward(c[0]["content"] if isinstance(c, list) else c, keywords) for c in completions
        ]
        rewards.append(sum(scores) / len(scores))
        return scores

    step_ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_ends.append(time.perf_counter())

    class TimedGRPOTrainer(GRPOTrainer):
        """Adds up the rollout phase (generation, decoding, rewards, advantages) of each step."""

        rollout_s: list[float] = []

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            started = time.perf_counter()
            output = super()._generate_and_score_completions(inputs)
            self.rollout_s.append(time.perf_counter() - started)
            return output

    config = GRPOConfig(
        output_dir=args.scratch,
        per_device_train_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=batch // args.micro_batch_size,
        num_generations=args.group_size,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",  # token-mean over the batch, as our aggregation="token-mean"
        scale_rewards="group",  # GRPO's std-normalised advantages, as our algo="grpo"
        max_steps=args.steps + 1,
        # TRL's default is bf16 autocast and gradient checkpointing; we match our dtype, no recompute. With
        # --dtype bfloat16 the weights themselves are bf16, as ours.
        bf16=args.dtype == "bfloat16",
        gradient_checkpointing=False,
        use_cpu=True,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        dataloader_num_workers=0,
    )
    from agent_gym.models.pretrained import resolve_model

    location = resolve_model(args.model)  # a known name (smollm2-135m-instruct) or a directory
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(location)
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    trainer.train()
    if len(step_ends) != args.steps + 1:
        raise RuntimeError(f"TRL ran {len(step_ends)} optimizer steps, expected {args.steps + 1}")
    seconds = step_ends[-1] - step_ends[0]
    rollout_s = sum(trainer.rollout_s[1:])
    mean_reward = sum(rewards[1:]) / args.steps
    return _result(args.steps, seconds, sum(tokens[1:]), rollout_s, seconds - rollout_s, mean_reward, args)


def _result(
    steps: int, seconds: float, tokens: int, rollout_s: float, update_s: float, reward: float, args: Any
) -> dict[str, float]:
    """Totals of one side's timed steps (summed over rounds by `summarize`)."""
    import resource

    import torch

    return {
        "steps": steps,
        "seconds": seconds,
        "tokens": tokens,
        "rollout_s": rollout_s,
        "update_s": update_s,
        "reward_sum": reward * steps,
        "completions": steps * args.tasks_per_step * args.group_size,
        "torch_threads": torch.get_num_threads(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
    }


def summarize(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Rates over all timed steps of all rounds of one side."""
    total = {key: sum(run[key] for run in runs) for key in runs[0] if key not in ("torch_threads", "peak_rss_mb")}
    steps, seconds = total["steps"], total["seconds"]
    return {
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "tokens_per_s": total["tokens"] / seconds,
        "rollout_s_per_step": total["rollout_s"] / steps,
        "update_s_per_step": total["update_s"] / steps,
        "mean_completion_tokens": total["tokens"] / total["completions"],
        "mean_reward": total["reward_sum"] / steps,
        "peak_rss_mb": max(run.get("peak_rss_mb", 0.0) for run in runs),
    }


# ---------------------------------------------------------------------------------------------- driver


def _side_command(python: str, side: str, args: argparse.Namespace, out: Path) -> list[str]:
    flags = [
        "--steps", str(args.steps), "--tasks-per-step", str(args.tasks_per_step),
        "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
        "--micro-batch-size", str(args.micro_batch_size), "--lr", str(args.lr),
        "--temperature", str(args.temperature), "--threads", str(args.threads),
        "--num-prompts", str(args.num_prompts), "--seed", str(args.seed), "--dtype", args.dtype,
    ]  # fmt: skip
    command = [python, str(Path(__file__).resolve()), "--side", side, "--model", args.model]
    return [*command, "--json-out", str(out), *flags]


def _run_side(
    python: str, side: str, args: argparse.Namespace, workdir: Path, round_index: int
) -> dict[str, float]:
    out = workdir / f"{side}-{round_index}.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(f"round {round_index + 1}/{args.rounds}: {side} ({python}) ...", flush=True)
    completed = subprocess.run(_side_command(python, side, args, out), env=env, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"the {side} side failed (exit code {completed.returncode}); see its output above")
    return json.loads(out.read_text())


def _has_trl(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("trl") is not None
    probe = subprocess.run([python, "-c", "import trl"], capture_output=True, check=False)
    return probe.returncode == 0


def print_table(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    """One row per side; the last row is the speed-up of ours (a time's ratio is TRL's over ours)."""
    columns = (  # (name, key, format, higher is faster)
        ("steps/s", "steps_per_s", "{:.3f}", True),
        ("tokens/s", "tokens_per_s", "{:.0f}", True),
        ("s/step", "seconds_per_step", "{:.2f}", False),
        ("rollout s/step", "rollout_s_per_step", "{:.2f}", False),
        ("update s/step", "update_s_per_step", "{:.2f}", False),
        ("tokens/completion", "mean_completion_tokens", "{:.1f}", True),
        ("reward", "mean_reward", "{:.3f}", True),
        ("peak RSS MB", "peak_rss_mb", "{:.0f}", False),
    )
    for result in results.values():
        result["seconds_per_step"] = result["seconds"] / result["steps"]
    batch = args.tasks_per_step * args.group_size
    print(
        f"\nGRPO, {args.tasks_per_step} prompts x {args.group_size} = {batch} completions/step, "
        f"max {args.max_new_tokens} new tokens, micro-batch {args.micro_batch_size}, torch threads "
        f"{args.threads}, {args.dtype}; {args.rounds} round(s) x {args.steps} timed steps per side, each after 1 "
        "warm-up"
    )
    header = f"{'':<12}" + "".join(f"{name:>18}" for name, *_ in columns)
    print(header)
    print("-" * len(header))
    for side, result in results.items():
        print(f"{side:<12}" + "".join(f"{fmt.format(result[key]):>18}" for _, key, fmt, _ in columns))
    if {"ours", "trl"} <= results.keys():
        ours, trl = results["ours"], results["trl"]
        ratios = [ours[key] / trl[key] if up else trl[key] / ours[key] for _, key, _, up in columns]
        print(f"{'ours vs trl':<12}" + "".join(f"{ratio:>17.2f}x" for ratio in ratios))
        ratio = ours["steps_per_s"] / trl["steps_per_s"]
        memory = ours["peak_rss_mb"] / trl["peak_rss_mb"]
        print(f"\nsteps/s ratio {ratio:.2f}x: {'meets' if ratio >= 3 else 'misses'} the 3x goal (issue 18)")
        print(f"peak RSS ours / trl {memory:.2f}: {'meets' if memory <= 0.5 else 'misses'} the <= 1/2 goal")
    for side, result in results.items():
        rollout = result["rollout_s_per_step"] / result["seconds_per_step"]
        print(
            f"{side}: rollout {rollout:.0%} of step time, update (forward, backward, AdamW) {1 - rollout:.0%}"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--side", choices=("both", "ours", "trl"), default="both")
    parser.add_argument("--model", help="Hugging Face model dir (default: a fresh model of --preset)")
    parser.add_argument("--preset", default="tiny", help="model_init preset when --model is not given")
    parser.add_argument("--steps", type=int, default=5, help="timed optimizer steps (after 1 warm-up)")
    parser.add_argument("--tasks-per-step", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="max_completion_length")
    parser.add_argument("--micro-batch-size", type=int, default=16, help="per_device_train_batch_size")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each side (load noise)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on each side")
    parser.add_argument("--num-prompts", type=int, default=256, help="distinct prompts in the pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both sides")
    parser.add_argument("--trl-first", action="store_true", help="start the ABBA order with TRL")
    parser.add_argument("--json-summary", help="(driver) write both sides' summaries and the settings here")
    parser.add_argument("--trl-python", default=sys.executable, help="interpreter that has TRL installed")
    parser.add_argument("--json-out", help="(side runs) write the result here")
    args = parser.parse_args(argv)
    for name in (
        "steps",
        "rounds",
        "tasks_per_step",
        "micro_batch_size",
        "threads",
        "num_prompts",
        "max_new_tokens",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.group_size < 2:
        parser.error("--group-size must be >= 2 (GRPO compares completions within a group)")
    if (args.tasks_per_step * args.group_size) % args.micro_batch_size:
        parser.error("--tasks-per-step x --group-size must be a multiple of --micro-batch-size (TRL's batch)")
    if args.side != "both" and args.json_out and not args.model:
        parser.error("a side run needs --model")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.json_out:  # one side, in a subprocess of the driver
        _limit_threads(args.threads)
        with tempfile.TemporaryDirectory(prefix=f"bench-{args.side}-") as scratch:
            args.scratch = scratch  # the trainer's output_dir
            result = (run_ours if args.side == "ours" else run_trl)(args)
        Path(args.json_out).write_text(json.dumps(result))
        return 0
    if args.side in ("both", "trl") and not _has_trl(args.trl_python):
        print(f"TRL is not importable by {args.trl_python}; set up its venv as this script's docstring says.")
        return 2
    print(subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-trainer-vs-trl-") as name:
        workdir = Path(name)
        if args.model is None:
            args.model = str(build_model(workdir / "model", args.preset, args.seed))
            print(f"built a {args.preset} model in {args.model} (temporary)")
        sides = ("ours", "trl") if args.side == "both" else (args.side,)
        runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for round_index in range(args.rounds):  # sides alternate, one at a time: they never share the cores
            # ABBA order (ours, trl, trl, ours, ...): a load that drifts during the run favours neither side.
            for side in sides if (round_index + args.trl_first) % 2 == 0 else sides[::-1]:
                python = args.trl_python if side == "trl" else sys.executable
                runs[side].append(_run_side(python, side, args, workdir, round_index))
    if len(sides) == 2:
        per_round = [
            (o["steps"] / o["seconds"]) / (t["steps"] / t["seconds"])
            for o, t in zip(runs["ours"], runs["trl"], strict=True)
        ]
        print("steps/s ratio per round: " + ", ".join(f"{ratio:.2f}x" for ratio in per_round))
    results = {side: summarize(side_runs) for side, side_runs in runs.items()}
    print_table(results, args)
    print(subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip())
    if args.json_summary:
        settings = {key: value for key, value in vars(args).items() if key != "scratch"}
        Path(args.json_summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_summary).write_text(json.dumps({"settings": settings, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
