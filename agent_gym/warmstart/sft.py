"""`agent-gym sft`: warm-start a policy on a scripted policy's episodes, with loss on assistant tokens only.

`SFTTrainer` runs it as `Trainer` runs RL: it plays the episodes, fine-tunes (`train_sft`), and keeps the run
directory (checkpoints, resume, ``run_config.json``, the model, ``sft_summary.json``); the command is a thin wrapper.
The episodes are tokenized by the rollout collector's own builder (`tokenize_episode`,
agent_gym/trainers/token_episode.py): the chat-template prompt, then each assistant turn's tokens followed by the
template's end-of-turn token (`loss_mask = 1`), then the rendered delta of the env's messages (`loss_mask = 0`).
So the warm-started model sees at RL time the very token layout it was fine-tuned on.
"""

from __future__ import annotations

import json
import math
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from agent_gym.error import InvalidValue
from agent_gym.models.host_memory import release_freed_memory
from agent_gym.models.threads import DEFAULT_TORCH_THREADS
from agent_gym.trainers.config import ConfigError
from agent_gym.trainers.lr_schedule import lr_lambda
from agent_gym.trainers.run_record import RECORD_FILE, RECORD_KEY, RunRecord, check_resume, write_run_record
from agent_gym.trainers.token_episode import SFTExample

__all__ = ["SFTConfig", "SFTTrainer", "prepare_sft_model", "sft_load_dtype", "train_sft"]

# Drill worlds of `agent-gym sft --drill-tokens`: the SFT env's settings in a small world, all its questions.
SFT_DRILL_WORLD = {"num_pages": 300, "split": "all", "num_questions": 40}


@dataclass
class SFTConfig:
    """Everything `SFTTrainer` (and `agent-gym sft`, one flag per field) needs: what to imitate, where the run goes,
    and how it trains. Defaults are sized for the `tiny` preset on CPU.

    `train_sft` reads only the training fields (``epochs`` on), so ``SFTConfig(epochs=2, lr=1e-3)`` suits it alone.
    """

    # --- what to imitate, and where the run goes ---
    env: str = field(default="", metadata={"help": "Gymnasium id of the env (e.g. AgentR1-SynthHop-v0)",
                                           "required": True})
    env_kwargs: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "keyword arguments for the env as one JSON object, e.g. '{\"hops\": 3}'"})
    policy: str = field(default="naive-rag", metadata={"help": "scripted policy name (agent_gym.policies)"})
    policy_kwargs: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "options of the scripted policy as one JSON object (--policy-kwarg KEY=VALUE sets one)"})
    model: str = field(default="", metadata={"help": "model directory to start from (agent-gym model init)",
                                             "required": True})
    # --output-dir, as `train` names it; --out, this command's earlier name, still works
    output_dir: str = field(default="", metadata={"help": "where to save the fine-tuned model (--out: the old name)",
                                                  "required": True, "aliases": ("--out",)})
    overwrite: bool = field(default=False, metadata={
        "help": "start a new run in OUTPUT_DIR even if it holds one, deleting the old run's model, checkpoints and "
                "summary first (without it, a non-empty OUTPUT_DIR with no checkpoint to continue is refused)"})
    episodes: int = field(default=256, metadata={"help": "scripted episodes to imitate"})
    task_offset: int = field(default=0, metadata={"help": "first task index to play"})
    min_reward: float | None = field(default=None, metadata={"help": "keep only episodes with reward >= this"})
    torch_threads: int = field(default=DEFAULT_TORCH_THREADS, metadata={
        "help": "torch.set_num_threads; 0: torch's own, one per core (agent_gym/models/threads.py has the "
                "measurements behind the default)"})
    drill_env_kwargs: dict[str, Any] | None = field(default=None, metadata={
        "help": f"overrides of the env kwargs for drill envs (none: {SFT_DRILL_WORLD})"})
    drill_fresh_kwarg: str = field(default="fresh_world", metadata={
        "help": "env kwarg given a new value for every step's drills (never-seen names; SynthHop's fresh_world)"})
    # 1,000,000 on: other worlds than pretraining's drills (fresh_world 0 on), as before the option existed
    drill_fresh_start: int = field(default=1_000_000, metadata={"help": "first value of it"})
    show_progress: bool = field(default=True, metadata={"help": "show progress bars"})

    # --- how it trains ---
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
    lora_layers: int = field(default=0, metadata={
        "help": "with lora_rank: adapters on the top N decoder layers only, so the backward pass stops there "
                "(0: every layer); `train --adapter` continues them as they are"})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "recompute each layer's activations in the backward pass: long episodes in a fraction of the "
                "memory (SmolLM2, LoRA, 4 rows of 1,200 tokens: 1.3x the time in a probe, up to 2x in the sweep), "
                "the same updates"})

    def validate(self) -> None:
        """Raise `ConfigError` naming the first invalid field; `SFTTrainer` calls it."""
        for name in ("env", "model", "output_dir"):
            if not getattr(self, name):
                raise ConfigError(f"{name} is required (--{name.replace('_', '-')})")
        for name in ("episodes", "epochs", "batch_size", "max_length", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.lora_layers < 0 or (self.lora_layers and not self.lora_rank):
            raise ConfigError(f"lora_layers needs lora_rank > 0 and must be >= 0, got {self.lora_layers}")


def _epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    """The example order of one epoch: a function of (seed, epoch), so a resumed run sees the same batches."""
    order = list(range(size))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


# What checkpoints from before run records were checked on (saved as their "run"; still written, for that code).
_LEGACY_RUN_KEYS = ("epochs", "lr", "batch_size", "max_length", "seed", "lora_rank", "lora_alpha", "drill_tokens",
                    "drill_weight")


def _legacy_identity(config: SFTConfig, examples: int) -> dict[str, Any]:
    return {**{key: getattr(config, key) for key in _LEGACY_RUN_KEYS}, "examples": examples}


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
    # the run's settings: every field and the number of examples (run_record.py)
    record = RunRecord.of("sft", config, examples=len(rows))
    checkpoint = latest_checkpoint(output_dir) if output_dir is not None else None
    if checkpoint is not None:
        state = load_checkpoint(checkpoint)
        check_resume(checkpoint, state, record, legacy=state.get("run", {}), total_steps=steps,
                     steps_setting="--epochs")
        load_trainable_state_dict(model, state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["scheduler"])
        step = int(state["step"])
        losses = list(state.get("losses", []))  # checkpoints before 0.1 kept none: the history starts here
        if show_progress:
            tqdm.write(f"resumed from step {step} ({checkpoint})")
    if output_dir is not None:
        write_run_record(output_dir, record)  # a run continued from before records gets one now
    if config.gradient_checkpointing:  # non-reentrant: a frozen base's inputs need no grad for LoRA's to flow
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    progress = tqdm(total=steps, initial=step, desc="sft", unit="step", disable=not show_progress)

    def save() -> Path:
        state = {"step": step, "model": trainable_state_dict(model), "optimizer": optimizer.state_dict(),
                 "scheduler": schedule.state_dict(), "run": _legacy_identity(config, len(rows)), "losses": losses,
                 RECORD_KEY: record.to_dict()}
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
                del loss
                release_freed_memory()  # rows of many lengths fragment the heap (host_memory.py)
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
    if config.gradient_checkpointing:
        model.gradient_checkpointing_disable()
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
    """With ``config.lora_rank``: the model wrapped with fresh LoRA adapters on every linear layer, or those of the
    top ``config.lora_layers`` layers (peft keeps them in fp32 over a bf16 base); otherwise the model itself, every
    weight trained."""
    if not config.lora_rank:
        return model
    from agent_gym.models.lora_setup import add_lora

    try:
        return add_lora(model, rank=config.lora_rank, alpha=config.lora_alpha, top_layers=config.lora_layers)
    except InvalidValue as error:
        raise ConfigError(str(error)) from error


def sft_load_dtype(config: SFTConfig) -> torch.dtype:
    """The dtype to load the model in: bf16 only for a frozen LoRA base (full fine-tunes keep fp32 masters)."""
    from agent_gym.models.precision import resolve_dtype

    return resolve_dtype(config.dtype) if config.lora_rank else torch.float32


# What a run writes in --output-dir (the files of save_pretrained, LoRA's included): --overwrite deletes them, so an
# old run's weights or adapter never sit beside the new run's.
RUN_FILES = ("checkpoints", "sft_summary.json", RECORD_FILE, "config.json", "generation_config.json", "*.safetensors",
              "*.safetensors.index.json", "pytorch_model*.bin", "adapter_config.json", "tokenizer*",
              "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja")


SUMMARY_FILE = "sft_summary.json"


class SFTTrainer:
    """Supervised warm start of a policy on a scripted policy's episodes, run as `Trainer` runs RL.

    Example::

        from agent_gym.warmstart.sft import SFTConfig, SFTTrainer

        config = SFTConfig(env="AgentR1-SynthHop-v0", policy="oracle", model="models/tiny",
                           output_dir="runs/warm", episodes=64, epochs=1)
        summary = SFTTrainer(config).train()  # {"episodes": 64, "steps": 4, "first_loss": ..., "final_loss": ...}

    ``train`` plays ``config.episodes`` episodes of ``config.policy`` (keeping those with ``min_reward``),
    tokenizes them as the rollout collector does, fine-tunes (`train_sft`, with drills when ``drill_tokens``), and
    saves the model (LoRA: its adapter), ``run_config.json`` and ``sft_summary.json`` in ``output_dir``. A run
    directory with a checkpoint of the same settings is continued (run_record.py); any other non-empty one is
    refused unless ``overwrite``.

    Args:
        config: the run's settings.
        model, tokenizer: the model to fine-tune (with ``config.lora_rank``: the base, adapters are added here);
            loaded from ``config.model`` when omitted.
        examples: tokenized episodes to imitate instead of the policy's (``episodes`` and ``min_reward`` then
            play no part).
    """

    def __init__(self, config: SFTConfig, model: torch.nn.Module | None = None, tokenizer: Any = None,
                 examples: list[SFTExample] | None = None) -> None:
        config.validate()
        self.config = config
        self.output_dir = Path(config.output_dir)
        if config.torch_threads > 0:
            torch.set_num_threads(config.torch_threads)
        self.model, self.tokenizer = model, tokenizer
        self.examples = examples
        self.episodes: list[Any] = []  # the played episodes (EpisodeRecord), once `train` has played them
        self.losses: list[float] = []

    def claim_run_dir(self) -> Path | None:
        """The checkpoint to continue (None: a new run); refuses a non-empty ``output_dir`` that has none to continue
        (or is a file) unless ``overwrite``. Cheap: `train` calls it before playing any episode."""
        from agent_gym.trainers.checkpoint import latest_checkpoint
        from agent_gym.trainers.run_dir import check_run_dir

        config = self.config
        resume_from = None if config.overwrite else latest_checkpoint(self.output_dir)
        check_run_dir(self.output_dir, continuing=resume_from is not None, overwrite=config.overwrite,
                      fresh_flag="--output-dir")
        return resume_from

    def play_episodes(self) -> list[Any]:
        """``config.episodes`` episodes of the scripted policy on tasks ``task_offset`` on, those with a reward of at
        least ``min_reward`` kept."""
        from agent_gym.evaluation import iter_episodes
        from agent_gym.make import make_env
        from agent_gym.policies import make_policy

        config = self.config
        policy = make_policy(config.policy, seed=config.seed, **config.policy_kwargs)
        env = make_env(config.env, config.env_kwargs)
        try:
            episodes = list(iter_episodes(env, policy, config.episodes, seed=config.seed,
                                          task_offset=config.task_offset, keep_messages=True,
                                          progress=config.show_progress, description="scripted episodes"))
        finally:
            env.close()
        if config.min_reward is not None:
            episodes = [episode for episode in episodes if episode.reward >= config.min_reward]
        return episodes

    def _drills(self) -> Any:
        """The drill source of ``drill_tokens``: the teacher's own episodes on small worlds made fresh every step (the
        same behaviour, never-seen names), in the env's own questions."""
        from agent_gym.warmstart.copy_drills import DrillSource

        config = self.config
        drill_kwargs = {**config.env_kwargs, **SFT_DRILL_WORLD, **(config.drill_env_kwargs or {})}
        return DrillSource(self.tokenizer, config.env, drill_kwargs, config.drill_fresh_kwarg, config.drill_fresh_start,
                           policy=config.policy, seed=config.seed, policy_options=config.policy_kwargs)

    def train(self) -> dict[str, Any]:
        """Play, fine-tune, save; returns the summary also written to ``output_dir/sft_summary.json``.

        SIGINT or SIGTERM stops the run once the step under way is done, saves a checkpoint and raises
        :class:`~agent_gym.trainers.stop_signals.TrainingInterrupted`; the same call continues it.
        """
        from agent_gym.models.saving import save_model
        from agent_gym.trainers.run_dir import clear_run_dir
        from agent_gym.trainers.token_episode import tokenize_episode

        config = self.config
        resume_from = self.claim_run_dir()  # before the episodes are played: fail in seconds, not minutes
        examples = self.examples
        if examples is None:
            self.episodes = self.play_episodes()
        if self.model is None or self.tokenizer is None:
            from agent_gym.models.model_init import load_model_and_tokenizer

            self.model, self.tokenizer = load_model_and_tokenizer(config.model, dtype=sft_load_dtype(config))
        self.model = prepare_sft_model(self.model, config)
        if examples is None:
            examples = [tokenize_episode(self.tokenizer, episode.messages) for episode in self.episodes]
        drills = self._drills() if config.drill_tokens > 0 else None
        if resume_from is None:
            clear_run_dir(self.output_dir, RUN_FILES)  # only now: config.model may be this very directory
        self.losses = train_sft(self.model, self.tokenizer, examples, config, output_dir=self.output_dir,
                                drills=drills, show_progress=config.show_progress)
        save_model(self.model, self.tokenizer, self.output_dir)  # weights as readable as their config
        rewards = [episode.reward for episode in self.episodes]
        summary: dict[str, Any] = {
            "episodes": len(self.episodes) if self.examples is None else len(examples),
            "policy_mean_reward": sum(rewards) / max(1, len(rewards)) if self.examples is None else None,
            "steps": len(self.losses),
            "first_loss": self.losses[0],
            "final_loss": self.losses[-1],
        }
        (self.output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        return summary
