"""`agent-gym sft`: warm-start a policy on a scripted policy's episodes, with loss on assistant tokens only.

The episodes are tokenized exactly as the rollout collector builds contexts: the chat-template prompt, then
each assistant turn's tokens followed by the template's end-of-turn token (`loss_mask = 1`), then the
rendered delta of the env's messages (`loss_mask = 0`). So the warm-started model sees at RL time the very
token layout it was fine-tuned on.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from agent_gym.models.chat_template import encode_plain_text, render_delta, render_prompt
from agent_gym.models.model_init import ModelInitError, load_model_and_tokenizer


@dataclass
class SFTExample:
    input_ids: list[int]
    loss_mask: list[int]


# Drill worlds of `agent-gym sft --drill-tokens`: the SFT env's settings in a small world, all its questions.
SFT_DRILL_WORLD = {"num_pages": 300, "split": "all", "num_questions": 40}


@dataclass
class SFTConfig:
    """Supervised warm-start settings (defaults sized for the `tiny` preset on CPU)."""

    epochs: int = 3
    lr: float = 1e-3  # from-scratch tiny models need a large LR; use ~1e-5 for pretrained checkpoints
    batch_size: int = 16
    max_length: int = 2048  # longer examples are truncated on the right
    weight_decay: float = 0.0
    warmup_steps: int = 10
    max_grad_norm: float = 1.0
    seed: int = 0
    # Pointer drills mixed into every step (copy_drills.py), this many tokens a step; 0 turns them off.
    # SFT on one fixed world alone erodes the copy skill (measured: turn-1 exact copy 0.15 -> 0.05 in 100 steps).
    drill_tokens: int = 0
    drill_weight: float = 1.0  # loss = SFT loss + drill_weight * drill loss
    save_every: int = 0  # steps between checkpoints in output_dir/checkpoints (0: none)
    keep_checkpoints: int = 2
    # bfloat16 (auto: where the CPU or GPU runs it fast): with LoRA the frozen base is stored in bf16 and the
    # adapters train in fp32; a full fine-tune keeps fp32 master weights and runs forward/backward under autocast.
    dtype: str = "auto"
    lora_rank: int = 0  # 0: full fine-tune
    lora_alpha: int = 32


def tokenize_episode(
    tokenizer: Any, messages: Sequence[dict], tools: Sequence[dict] | None = None
) -> SFTExample:
    """Token ids and loss mask of a conversation, laid out as the rollout collector lays out contexts."""
    first_assistant = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first_assistant is None:
        raise ValueError("an SFT episode needs at least one assistant message")
    input_ids = render_prompt(tokenizer, messages[:first_assistant], tools)
    loss_mask = [0] * len(input_ids)
    end_of_turn = tokenizer.eos_token
    index = first_assistant
    while index < len(messages):
        # Plain text: a turn's "<|im_end|>" is not the end of the turn (only the template's markers are).
        turn = encode_plain_text(tokenizer, str(messages[index].get("content") or "")) + [tokenizer.eos_token_id]
        input_ids += turn
        loss_mask += [1] * len(turn)
        following = index + 1
        while following < len(messages) and messages[following].get("role") != "assistant":
            following += 1
        if following < len(messages) or following > index + 1:
            delta = render_delta(
                tokenizer,
                messages[index + 1 : following],
                end_of_turn,
                add_generation_prompt=following < len(messages),
            )
            input_ids += delta
            loss_mask += [0] * len(delta)
        index = following
    return SFTExample(input_ids, loss_mask)


def _epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    """The example order of one epoch: a function of (seed, epoch), so a resumed run sees the same batches."""
    order = list(range(size))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def _lr_factor(step: int, config: SFTConfig, steps: int) -> float:
    return min(1.0, (step + 1) / max(1, config.warmup_steps)) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))


# Settings that decide a run's batches and updates: a checkpoint is continued only by a run with the same.
_RUN_KEYS = ("epochs", "lr", "batch_size", "max_length", "seed", "lora_rank", "lora_alpha", "drill_tokens",
             "drill_weight")


def _run_identity(config: SFTConfig, examples: int) -> dict[str, Any]:
    return {**{key: getattr(config, key) for key in _RUN_KEYS if hasattr(config, key)}, "examples": examples}


def _check_same_run(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    from agent_gym.trainers.checkpoint import CheckpointError

    for key, value in saved.items():
        if key in current and current[key] != value:
            raise CheckpointError(
                f"{path} was saved by an sft run with {key}={value!r}, not {current[key]!r}; continuing it with "
                "these settings would mix two runs: pass --overwrite to replace it, or a fresh --out"
            )


def train_sft(
    model: torch.nn.Module,
    tokenizer: Any,
    examples: list[SFTExample],
    config: SFTConfig,
    output_dir: str | Path | None = None,
    drills: Any = None,
    show_progress: bool = True,
) -> list[float]:
    """AdamW on next-token cross-entropy over assistant tokens only; returns the loss of every step run.

    Args:
        drills: a :class:`~agent_gym.warmstart.copy_drills.DrillSource`; with ``config.drill_tokens`` > 0, each
            step adds ``drill_weight`` x the loss of that many tokens of pointer drills (drill ``step``).
        output_dir: where checkpoints go (``config.save_every``); a run finds its latest one there and resumes.
    """
    from agent_gym.trainers.checkpoint import (
        latest_checkpoint,
        load_checkpoint,
        load_trainable_state_dict,
        save_checkpoint,
        trainable_state_dict,
    )
    from agent_gym.warmstart.lm_loss import WeightedRow, weighted_lm_loss

    if not examples:
        raise ValueError("no SFT examples to train on")
    # An example cut at max_length before its first assistant token has nothing to learn from (and would
    # make the mean loss over zero tokens NaN).
    kept = [example for example in examples if any(example.loss_mask[: config.max_length])]
    if not kept:
        raise ValueError(f"no SFT example has an assistant token within max_length={config.max_length}")
    if len(kept) < len(examples):
        warnings.warn(
            f"{len(examples) - len(kept)} SFT examples have no assistant token within "
            f"max_length={config.max_length} and are skipped",
            stacklevel=2,
        )
    if config.drill_tokens > 0 and drills is None:
        raise ValueError("config.drill_tokens > 0 needs a DrillSource (drills=...)")
    rows = [WeightedRow(example.input_ids, [float(flag) for flag in example.loss_mask]) for example in kept]
    torch.manual_seed(config.seed)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    autocast = _autocast(model, config)
    steps_per_epoch = math.ceil(len(rows) / config.batch_size)
    steps = config.epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, config, steps))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    step = 0
    run = _run_identity(config, len(rows))
    checkpoint = latest_checkpoint(output_dir) if output_dir is not None else None
    if checkpoint is not None:
        state = load_checkpoint(checkpoint)
        _check_same_run(checkpoint, state.get("run", {}), run)
        load_trainable_state_dict(model, state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["scheduler"])
        step = int(state["step"])
        if show_progress:
            tqdm.write(f"resumed from step {step} ({checkpoint})")
    model.train()
    losses: list[float] = []
    progress = tqdm(total=steps, initial=step, desc="sft", unit="step", disable=not show_progress)
    while step < steps:
        epoch, position = divmod(step, steps_per_epoch)
        order = _epoch_order(len(rows), config.seed, epoch)
        batch = [rows[i] for i in order[position * config.batch_size : (position + 1) * config.batch_size]]
        with autocast:
            loss = weighted_lm_loss(model, batch, pad_id, config.max_length)
            if config.drill_tokens > 0:
                drill_rows = drills.rows(step, config.drill_tokens)
                loss = loss + config.drill_weight * weighted_lm_loss(model, drill_rows, pad_id)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
        optimizer.step()
        schedule.step()
        step += 1
        losses.append(loss.item())
        progress.update(1)
        progress.set_postfix(loss=f"{losses[-1]:.3f}")
        if output_dir is not None and config.save_every and step % config.save_every == 0 and step < steps:
            state = {"step": step, "model": trainable_state_dict(model), "optimizer": optimizer.state_dict(),
                     "scheduler": schedule.state_dict(), "run": run}
            save_checkpoint(output_dir, step, state, keep=config.keep_checkpoints)
    progress.close()
    model.eval()
    return losses


def _autocast(model: torch.nn.Module, config: SFTConfig) -> Any:
    """bf16 autocast for a full fine-tune whose weights are fp32 and whose dtype is bf16; a no-op otherwise."""
    import contextlib

    from agent_gym.models.precision import resolve_dtype

    device = next(model.parameters()).device
    wanted = resolve_dtype(config.dtype, device)
    if config.lora_rank or wanted != torch.bfloat16:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def prepare_sft_model(model: torch.nn.Module, config: SFTConfig) -> torch.nn.Module:
    """With ``config.lora_rank``: the model wrapped with fresh LoRA adapters on every linear layer (peft keeps them
    in fp32 over a bf16 base); otherwise the model itself, every weight trained."""
    if not config.lora_rank:
        return model
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules="all-linear",
                      task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def sft_load_dtype(config: SFTConfig) -> torch.dtype:
    """The dtype to load the model in: bf16 only for a frozen LoRA base (full fine-tunes keep fp32 masters)."""
    from agent_gym.models.precision import resolve_dtype

    return resolve_dtype(config.dtype) if config.lora_rank else torch.float32


def add_sft_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `agent-gym sft`."""
    from agent_gym.cli_args import DefaultsHelpFormatter, add_env_kwargs_arguments
    from agent_gym.models.threads import DEFAULT_TORCH_THREADS

    parser.formatter_class = DefaultsHelpFormatter  # --help shows every default
    parser.add_argument("--env", required=True, help="Gymnasium id of the env (e.g. AgentR1-SynthHop-v0)")
    add_env_kwargs_arguments(parser)
    parser.add_argument("--policy", default="naive-rag", help="scripted policy name (agent_gym.policies)")
    parser.add_argument("--model", required=True, help="model directory to start from (agent-gym model init)")
    parser.add_argument("--out", required=True, help="where to save the fine-tuned model")
    parser.add_argument("--overwrite", action="store_true",
                        help="start a new run in OUT even if it holds one, deleting the old run's model, checkpoints "
                             "and summary first (without it, a non-empty OUT with no checkpoint to continue is "
                             "refused)")
    parser.add_argument("--episodes", type=int, default=256, help="scripted episodes to imitate")
    parser.add_argument("--task-offset", type=int, default=0, help="first task index to play")
    parser.add_argument(
        "--min-reward", type=float, default=None, help="keep only episodes with reward >= this"
    )
    parser.add_argument("--epochs", type=int, default=SFTConfig.epochs, help="passes over the episodes")
    parser.add_argument("--lr", type=float, default=SFTConfig.lr, help="AdamW learning rate")
    parser.add_argument("--batch-size", type=int, default=SFTConfig.batch_size, help="episodes per step")
    parser.add_argument("--max-length", type=int, default=SFTConfig.max_length,
                        help="tokens kept of each episode")
    parser.add_argument("--seed", type=int, default=0, help="seeds the policy, the shuffling and the drills")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default=SFTConfig.dtype,
                        help="auto: bfloat16 where the GPU supports it or the CPU (avx512_bf16/AMX) measured it "
                             "faster than float32 at this thread count, else float32; with LoRA the frozen base is "
                             "bf16, a full fine-tune runs under autocast with fp32 weights")
    parser.add_argument("--lora-rank", type=int, default=SFTConfig.lora_rank,
                        help="train LoRA adapters of this rank on every linear layer and save only them (0: full "
                             "fine-tune); `agent-gym train --adapter OUT` continues them")
    parser.add_argument("--lora-alpha", type=int, default=SFTConfig.lora_alpha, help="LoRA alpha (scale alpha/rank)")
    parser.add_argument("--policy-kwarg", action="append", metavar="KEY=VALUE", default=[],
                        help="option of the scripted policy (repeatable), e.g. --policy-kwarg p_multihop=0.4")
    parser.add_argument("--torch-threads", type=int, default=DEFAULT_TORCH_THREADS,
                        help="torch.set_num_threads; 0: torch's own, one per core (agent_gym/models/threads.py "
                             "has the measurements behind the default)")
    parser.add_argument("--save-every", type=int, default=0,
                        help="steps between checkpoints in OUT/checkpoints; a rerun resumes from the latest")
    parser.add_argument("--drill-tokens", type=int, default=0,
                        help="tokens of drills mixed into every step (0: none): the same policy's episodes on "
                             "fresh worlds, cut short; they keep the copy skill that SFT on one fixed world erodes "
                             "(see `agent-gym model pretrain`)")
    parser.add_argument("--drill-weight", type=float, default=SFTConfig.drill_weight,
                        help="loss weight of the drills")
    parser.add_argument("--drill-env-kwargs", default=None, metavar="JSON",
                        help=f"overrides of the env kwargs for drill envs (none: {SFT_DRILL_WORLD})")
    parser.add_argument("--drill-fresh-kwarg", default="world_seed",
                        help="env kwarg given a new value for every step's drills (never-seen names)")
    parser.add_argument("--drill-fresh-start", type=int, default=2_000_000, help="first value of it")


# What a run writes in --out (the files of save_pretrained, LoRA's included): --overwrite deletes them, so an
# old run's weights or adapter never sit beside the new run's.
_RUN_FILES = ("checkpoints", "sft_summary.json", "config.json", "generation_config.json", "*.safetensors",
              "*.safetensors.index.json", "pytorch_model*.bin", "adapter_config.json", "tokenizer*",
              "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja")


def run_sft(ns: argparse.Namespace) -> int:
    """Entry point of `agent-gym sft`; returns an exit code."""
    from agent_gym.cli_args import UsageError, env_kwargs_from_args, make_env, user_errors
    from agent_gym.evaluation import iter_episodes
    from agent_gym.policies import PolicyError, make_policy
    from agent_gym.trainers.checkpoint import CheckpointError, latest_checkpoint
    from agent_gym.trainers.run_dir import RunDirectoryError, check_run_dir, clear_run_dir

    env_kwargs = env_kwargs_from_args(ns)
    if ns.episodes < 1:
        raise UsageError(f"--episodes must be at least 1, got {ns.episodes}")
    out = Path(ns.out)
    resume_from = None if ns.overwrite else latest_checkpoint(out)  # --overwrite: a new run, whatever is there
    with user_errors(RunDirectoryError):  # before the episodes are played: fail in seconds, not minutes
        check_run_dir(out, continuing=resume_from is not None, overwrite=ns.overwrite, fresh_flag="--out")
    from agent_gym.cli_args import parse_env_kwarg_pairs, parse_json_object

    if ns.torch_threads > 0:
        torch.set_num_threads(ns.torch_threads)
    policy_options = parse_env_kwarg_pairs(ns.policy_kwarg)
    with user_errors(ValueError):
        policy = make_policy(ns.policy, seed=ns.seed, **policy_options)
    env = make_env(ns.env, env_kwargs)  # registers the env ids; no concrete env import
    try:
        with user_errors(PolicyError):
            episodes = list(iter_episodes(env, policy, ns.episodes, seed=ns.seed, task_offset=ns.task_offset,
                                          keep_messages=True, description="scripted episodes"))
    finally:
        env.close()
    if ns.min_reward is not None:
        episodes = [episode for episode in episodes if episode.reward >= ns.min_reward]
    config = SFTConfig(
        epochs=ns.epochs, lr=ns.lr, batch_size=ns.batch_size, max_length=ns.max_length, seed=ns.seed,
        drill_tokens=ns.drill_tokens, drill_weight=ns.drill_weight, save_every=ns.save_every,
        dtype=ns.dtype, lora_rank=ns.lora_rank, lora_alpha=ns.lora_alpha,
    )
    from agent_gym.models.pretrained import PretrainedModelError

    with user_errors(ModelInitError, PretrainedModelError):
        model, tokenizer = load_model_and_tokenizer(ns.model, dtype=sft_load_dtype(config))
    model = prepare_sft_model(model, config)
    examples = [tokenize_episode(tokenizer, episode.messages) for episode in episodes]
    drills = None
    if ns.drill_tokens > 0:
        from agent_gym.warmstart.copy_drills import DrillSource

        overrides = parse_json_object(ns.drill_env_kwargs, "--drill-env-kwargs")
        # The env's own questions, in small worlds made fresh every step (cheap to build).
        drill_kwargs = {**env_kwargs, **SFT_DRILL_WORLD, **overrides}
        # The drills are the teacher's own episodes on fresh worlds: the same behaviour, never-seen names.
        drills = DrillSource(tokenizer, ns.env, drill_kwargs, ns.drill_fresh_kwarg, ns.drill_fresh_start,
                             policy=ns.policy, seed=ns.seed, policy_options=policy_options)
    if resume_from is None:
        clear_run_dir(out, _RUN_FILES)  # only now: --model may be this very directory
    with user_errors(CheckpointError):
        losses = train_sft(model, tokenizer, examples, config, output_dir=out, drills=drills)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    mean_reward = sum(e.reward for e in episodes) / max(1, len(episodes))
    summary = {
        "episodes": len(episodes),
        "policy_mean_reward": mean_reward,
        "steps": len(losses),
        "first_loss": losses[0],
        "final_loss": losses[-1],
    }
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"sft: {len(episodes)} episodes of {ns.policy} (mean reward {mean_reward:.3f}), "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved to {out}"
    )
    return 0
