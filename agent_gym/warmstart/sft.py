"""`agent-gym sft`: warm-start a policy on a scripted policy's episodes, with loss on assistant tokens only.

The episodes are tokenized by the rollout collector's own builder (`tokenize_episode`,
agent_gym/trainers/token_episode.py): the chat-template prompt, then each assistant turn's tokens followed by the
template's end-of-turn token (`loss_mask = 1`), then the rendered delta of the env's messages (`loss_mask = 0`).
So the warm-started model sees at RL time the very token layout it was fine-tuned on.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from agent_gym.error import InvalidValue
from agent_gym.trainers.lr_schedule import lr_lambda
from agent_gym.trainers.token_episode import SFTExample

# Drill worlds of `agent-gym sft --drill-tokens`: the SFT env's settings in a small world, all its questions.
SFT_DRILL_WORLD = {"num_pages": 300, "split": "all", "num_questions": 40}


@dataclass
class SFTConfig:
    """Supervised warm-start settings (defaults sized for the `tiny` preset on CPU); `agent-gym sft`'s flags."""

    epochs: int = field(default=3, metadata={"help": "passes over the episodes"})
    lr: float = field(default=1e-3, metadata={
        "help": "AdamW learning rate (from-scratch tiny models need a large one; ~1e-5 suits pretrained models)"})
    batch_size: int = field(default=16, metadata={"help": "episodes per step"})
    max_length: int = field(default=2048, metadata={
        "help": "tokens kept of each episode (longer ones are cut on the right)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    warmup_steps: int = field(default=10, metadata={"help": "steps of linear learning-rate warm-up"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    seed: int = field(default=0, metadata={"help": "seeds the policy, the shuffling and the drills"})
    # SFT on one fixed world alone erodes the copy skill (measured: turn-1 exact copy 0.15 -> 0.05 in 100 steps).
    drill_tokens: int = field(default=0, metadata={
        "help": "tokens of drills mixed into every step (0: none): the same policy's episodes on fresh worlds, "
                "cut short; they keep the copy skill that SFT on one fixed world erodes (see `agent-gym model "
                "pretrain`)"})
    drill_weight: float = field(default=1.0, metadata={
        "help": "loss weight of the drills (loss = SFT loss + drill_weight * drill loss)"})
    save_every: int = field(default=0, metadata={
        "help": "steps between checkpoints in OUT/checkpoints (0: none); a rerun resumes from the latest"})
    keep_checkpoints: int = field(default=2, metadata={"help": "checkpoints kept on disk"})
    dtype: str = field(default="auto", metadata={
        "choices": ("auto", "float32", "bfloat16"),
        "help": "auto: bfloat16 where the GPU supports it or the CPU (avx512_bf16/AMX) measured it faster than "
                "float32 at this thread count, else float32; with LoRA the frozen base is bf16, a full fine-tune "
                "runs under autocast with fp32 weights"})
    lora_rank: int = field(default=0, metadata={
        "help": "train LoRA adapters of this rank on every linear layer and save only them (0: full fine-tune); "
                "`agent-gym train --adapter OUT` continues them"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (scale alpha/rank)"})


def _epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    """The example order of one epoch: a function of (seed, epoch), so a resumed run sees the same batches."""
    order = list(range(size))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


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
                "these settings would mix two runs: pass --overwrite to replace it, or a fresh --output-dir"
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
    """AdamW on next-token cross-entropy over assistant tokens only; returns the loss of every step of the run
    (a resumed run's too: the checkpoint keeps them).

    Args:
        drills: a :class:`~agent_gym.warmstart.copy_drills.DrillSource`; with ``config.drill_tokens`` > 0, each
            step adds ``drill_weight`` x the loss of that many tokens of pointer drills (drill ``step``).
        output_dir: where checkpoints go (``config.save_every``); a run finds its latest one there and resumes.

    SIGINT or SIGTERM stops the run once the step under way is done: with an ``output_dir``, a checkpoint of it is
    written (whatever ``save_every``); then :class:`~agent_gym.trainers.stop_signals.TrainingInterrupted` is raised.
    """
    from agent_gym.trainers.checkpoint import (
        STATE_FILE,
        checkpoint_path,
        latest_checkpoint,
        load_checkpoint,
        load_trainable_state_dict,
        save_checkpoint,
        trainable_state_dict,
    )
    from agent_gym.trainers.stop_signals import StopOnSignal, StopRequested, TrainingInterrupted
    from agent_gym.warmstart.lm_loss import WeightedRow, weighted_lm_loss

    if not examples:
        raise InvalidValue("no SFT examples to train on")
    # An example cut at max_length before its first assistant token has nothing to learn from (and would
    # make the mean loss over zero tokens NaN).
    kept = [example for example in examples if any(example.loss_mask[: config.max_length])]
    if not kept:
        raise InvalidValue(f"no SFT example has an assistant token within max_length={config.max_length}")
    if len(kept) < len(examples):
        warnings.warn(
            f"{len(examples) - len(kept)} SFT examples have no assistant token within "
            f"max_length={config.max_length} and are skipped",
            stacklevel=2,
        )
    if config.drill_tokens > 0 and drills is None:
        raise InvalidValue("config.drill_tokens > 0 needs a DrillSource (drills=...)")
    rows = [WeightedRow(example.input_ids, [float(flag) for flag in example.loss_mask]) for example in kept]
    torch.manual_seed(config.seed)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    autocast = _autocast(model, config)
    steps_per_epoch = math.ceil(len(rows) / config.batch_size)
    steps = config.epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(warmup_steps=config.warmup_steps,
                                                                      total_steps=steps, warmup_overlaps=True))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    step = 0
    losses: list[float] = []
    run = _run_identity(config, len(rows))
    checkpoint = latest_checkpoint(output_dir) if output_dir is not None else None
    if checkpoint is not None:
        state = load_checkpoint(checkpoint)
        _check_same_run(checkpoint, state.get("run", {}), run)
        load_trainable_state_dict(model, state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["scheduler"])
        step = int(state["step"])
        losses = list(state.get("losses", []))  # checkpoints before 0.1 kept none: the history starts here
        if show_progress:
            tqdm.write(f"resumed from step {step} ({checkpoint})")
    model.train()
    progress = tqdm(total=steps, initial=step, desc="sft", unit="step", disable=not show_progress)

    def save() -> Path:
        state = {"step": step, "model": trainable_state_dict(model), "optimizer": optimizer.state_dict(),
                 "scheduler": schedule.state_dict(), "run": run, "losses": losses}
        return save_checkpoint(output_dir, step, state, keep=config.keep_checkpoints)

    with StopOnSignal() as stop:
        try:
            while step < steps:
                stop.check()  # steps are short: a signal waits for the one under way
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
                    save()
        except StopRequested as stopped:
            progress.close()
            path = None
            if output_dir is not None:
                saved = checkpoint_path(output_dir, step)
                path = saved if (saved / STATE_FILE).is_file() else save()
            raise TrainingInterrupted(stopped.signal_number, step, steps, path) from None
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


# What a run writes in --output-dir (the files of save_pretrained, LoRA's included): --overwrite deletes them, so an
# old run's weights or adapter never sit beside the new run's.
RUN_FILES = ("checkpoints", "sft_summary.json", "config.json", "generation_config.json", "*.safetensors",
              "*.safetensors.index.json", "pytorch_model*.bin", "adapter_config.json", "tokenizer*",
              "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja")
