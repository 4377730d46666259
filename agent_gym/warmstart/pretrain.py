"""`agent-gym model pretrain`: teach a from-scratch model to copy, before any SFT or RL.

Two stages, one optimizer and one step counter (so a run resumes anywhere):

1. **induction** (``induction_steps``): a previous-token head is set at init, then rows of random ids with
   repeated spans, drawn from a vocabulary that grows (induction.py). Forms the copy circuit.
2. **drills** (``drill_steps``): a scripted policy's episodes on envs with never-seen names, cut into short
   rows in the env's exact format (copy_drills.py). Teaches which entity to copy, and when.

Every ``eval_every`` steps the copy skill (copy_skill.py) is measured on held-out episodes and logged under
``copy/...`` in ``metrics.jsonl``; every ``save_every`` steps a checkpoint is written. The batch of each step
is a function of (seed, step), so a killed run resumed from its last checkpoint trains on the same data.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from agent_gym.models.saving import save_model
from agent_gym.models.threads import DEFAULT_TORCH_THREADS
from agent_gym.trainers.checkpoint import (
    STATE_FILE,
    capture_rng_state,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from agent_gym.trainers.config import ConfigError
from agent_gym.trainers.lr_schedule import lr_lambda
from agent_gym.trainers.metrics import METRICS_FILE, MetricsLogger
from agent_gym.trainers.run_dir import check_run_dir, clear_run_dir
from agent_gym.trainers.run_record import RECORD_FILE, RECORD_KEY, RunRecord, check_resume, write_run_record
from agent_gym.trainers.stop_signals import StopOnSignal, StopRequested, TrainingInterrupted
from agent_gym.warmstart.copy_drills import DRILL_FORMS, DrillSource
from agent_gym.warmstart.copy_skill import copy_skill
from agent_gym.warmstart.induction import induction_rows, induction_vocab, install_previous_token_head
from agent_gym.warmstart.lm_loss import WeightedRow, weighted_lm_loss

__all__ = ["PretrainConfig", "Pretrainer"]


# What a run writes in its output_dir: deleted by --overwrite, so nothing of the old run survives into the new.
_RUN_FILES = ("checkpoints", METRICS_FILE, "final", RECORD_FILE)
# What a checkpoint from before run records was checked on.
_LEGACY_RESUME_KEYS = ("model", "env_id", "policy", "seed")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


# Drill worlds: small (episodes are made fresh every step), 1- and 2-hop bridge questions, 3 hits a search.
DRILL_ENV_KWARGS = {"num_pages": 300, "kinds": ["bridge"], "hops": [1, 2], "top_k": 3, "split": "all",
                    "num_questions": 40, "max_turns": 5}
# Held-out copy-skill episodes: a world no drill comes from (drills use world seeds from 1,000,000 up).
EVAL_ENV_KWARGS = {"world_seed": 424_242, "num_pages": 2000, "hops": 2, "split": "test", "num_questions": 64}


@dataclass
class PretrainConfig:
    """Settings of `agent-gym model pretrain`; defaults are the ones measured in docs/RESULTS.md."""

    model: str = field(default="", metadata=_help("Model directory to start from (`agent-gym model init`)."))
    output_dir: str = field(default="runs/pretrain", metadata=_help("Run directory: checkpoints, metrics, final/."))
    overwrite: bool = field(
        default=False,
        metadata=_help("Start a new run in output_dir even if it holds one, deleting the old run's checkpoints/, "
                       "metrics.jsonl and final/ first. Without it, a non-empty output_dir with no checkpoint to "
                       "continue is refused."),
    )
    env_id: str = field(default="AgentR1-SynthHop-v0", metadata=_help("Env the drills are played in."))
    env_kwargs: dict[str, Any] = field(
        default_factory=lambda: dict(DRILL_ENV_KWARGS), metadata=_help("gymnasium.make kwargs of drill envs; JSON.")
    )
    fresh_kwarg: str = field(
        default="fresh_world",
        metadata=_help("Env kwarg set to a new value for every step's drills, so every name is new to the model "
                       "(SynthHop's fresh_world: a world from seeds it reserves, 1,000,000 + the value)."),
    )
    fresh_start: int = field(default=0, metadata=_help("First value of fresh_kwarg."))
    policy: str = field(default="oracle", metadata=_help("Scripted policy whose episodes are the drills."))
    drill_forms: dict[str, float] = field(
        default_factory=lambda: dict(DRILL_FORMS),
        metadata=_help("Share of each drill row form (first_turn, one_hit, two_hits, full); JSON."),
    )
    env_token_weight: float = field(default=0.1, metadata=_help("Loss weight of prompt and tool-result tokens."))
    eval_env_kwargs: dict[str, Any] = field(
        default_factory=lambda: dict(EVAL_ENV_KWARGS),
        metadata=_help("Overrides of env_kwargs for the held-out copy-skill episodes (a world no drill uses); JSON."),
    )
    eval_episodes: int = field(default=64, metadata=_help("Held-out oracle episodes per copy-skill measurement."))
    previous_token_offsets: list[int] = field(
        default_factory=lambda: [1],
        metadata=_help("At step 0, head i of the first layer is set to attend offsets[i] tokens back (1: the "
                       "previous-token head that ends the induction plateau; 2: the word before a space). At "
                       "least one head of the layer must stay free: with both heads of the tiny preset fixed "
                       "(1 2) the run was still on the induction plateau at step 960."),
    )
    induction_steps: int = field(default=1200, metadata=_help("Steps of stage 1 (random repeated spans)."))
    induction_vocab_start: int = field(default=64, metadata=_help("Ids the first induction rows draw from."))
    induction_hold_steps: int = field(default=500, metadata=_help("Steps before the induction vocabulary grows."))
    induction_doubling_steps: int = field(default=100, metadata=_help("Steps per doubling of that vocabulary."))
    induction_width: int = field(default=128, metadata=_help("Tokens per induction row."))
    induction_rows: int = field(
        default=32, metadata=_help("Induction rows per step (32 x 128 tokens: the batch measured to form induction).")
    )
    drill_steps: int = field(default=3000, metadata=_help("Steps of stage 2 (drills)."))
    batch_tokens: int = field(default=8192, metadata=_help("Tokens per step (rows are added until reached)."))
    lr: float = field(default=3e-3, metadata=_help("Peak AdamW learning rate (from-scratch tiny models)."))
    min_lr_ratio: float = field(default=0.1, metadata=_help("Cosine decay floor, as a share of lr."))
    warmup_steps: int = field(default=100, metadata=_help("Linear warm-up steps."))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay."))
    adam_beta2: float = field(
        default=0.98,
        metadata=_help("AdamW beta2. Measured: with 0.98 the induction phase change came at step ~400; with "
                       "torch's default 0.999 the loss was still flat at step 550."),
    )
    max_grad_norm: float = field(default=1.0, metadata=_help("Gradient clipping norm."))
    eval_every: int = field(default=200, metadata=_help("Steps between copy-skill measurements (0: never)."))
    save_every: int = field(default=200, metadata=_help("Steps between checkpoints (0: only at the end)."))
    keep_checkpoints: int = field(default=2, metadata=_help("Checkpoints kept on disk."))
    torch_threads: int = field(default=DEFAULT_TORCH_THREADS, metadata=_help(
        "torch.set_num_threads; 0 keeps torch's default, one per core (agent_gym/models/threads.py: the "
        "measurements behind the default)."))
    seed: int = field(default=0, metadata=_help("Seed of the data stream and of the model's init changes."))
    show_progress: bool = field(default=True, metadata=_help("Show a progress bar."))

    @property
    def total_steps(self) -> int:
        return self.induction_steps + self.drill_steps

    def validate(self) -> None:
        if not self.model:
            raise ConfigError("model is required: pass --model DIR (e.g. from `agent-gym model init`)")
        for name in ("induction_steps", "drill_steps", "eval_every", "save_every", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_tokens", "eval_episodes", "keep_checkpoints", "induction_vocab_start", "induction_rows"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.total_steps < 1:
            raise ConfigError("induction_steps + drill_steps must be at least 1")
        unknown = sorted(set(self.drill_forms) - set(DRILL_FORMS))
        if unknown or not any(share > 0 for share in self.drill_forms.values()):
            raise ConfigError(
                f"drill_forms needs a positive share of some of {sorted(DRILL_FORMS)}; got {self.drill_forms}"
            )


class Pretrainer:
    """Runs the two stages on a model and tokenizer; see the module docstring."""

    def __init__(self, config: PretrainConfig, model: torch.nn.Module | None = None, tokenizer: Any = None) -> None:
        config.validate()
        self.config = config
        if config.torch_threads > 0:
            torch.set_num_threads(config.torch_threads)
        if model is None or tokenizer is None:
            from agent_gym.models.model_init import load_model_and_tokenizer

            model, tokenizer = load_model_and_tokenizer(config.model)
        self.model, self.tokenizer = model, tokenizer
        heads = model.config.num_attention_heads
        if len(config.previous_token_offsets) >= heads:
            raise ConfigError(
                f"previous_token_offsets {config.previous_token_offsets} would fix all {heads} heads of the first "
                "layer; leave at least one free (the induction head needs one to form: with every head fixed the "
                "tiny preset stayed on the induction plateau)"
            )
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.output_dir = Path(config.output_dir)
        added = set(tokenizer.get_added_vocab().values())
        # Induction rows use ordinary text tokens only: special and markup tokens never recur as content.
        self.text_token_ids = [i for i in range(len(tokenizer)) if i not in added]
        self.drills = DrillSource(tokenizer, config.env_id, config.env_kwargs, config.fresh_kwarg, config.fresh_start,
                                  config.policy, config.drill_forms, config.env_token_weight, config.seed)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                           betas=(0.9, config.adam_beta2))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(
            warmup_steps=config.warmup_steps, total_steps=config.total_steps, floor=config.min_lr_ratio))
        self.step = 0
        self._resumed: bool | None = None  # set once the run directory is checked

    def rows(self, step: int) -> list[WeightedRow]:
        """The batch of ``step``: a function of (seed, step) alone."""
        config = self.config
        if step < config.induction_steps:
            vocab = induction_vocab(step, self.text_token_ids, config.induction_vocab_start,
                                    config.induction_hold_steps, config.induction_doubling_steps)
            rng = random.Random(f"{config.seed}:induction:{step}")
            return induction_rows(rng, self.text_token_ids, config.induction_rows, vocab, width=config.induction_width)
        return self.drills.rows(step - config.induction_steps, config.batch_tokens)

    def measure(self) -> dict[str, float]:
        """Copy skill on the held-out episodes, as ``copy/turnK_exact`` etc."""
        config = self.config
        scores = copy_skill(self.model, self.tokenizer, config.env_id,
                            {**config.env_kwargs, **config.eval_env_kwargs}, config.eval_episodes)
        return {f"copy/{name.replace('/', '_')}": value for name, value in scores.items()}

    def train(self) -> dict[str, float]:
        """Run (or resume) to ``total_steps``; returns the last copy-skill measurement.

        SIGINT or SIGTERM stops the run once the step under way (its measurement included) is done: a
        checkpoint of it is written and :class:`~agent_gym.trainers.stop_signals.TrainingInterrupted` raised.
        Run again, it continues from there.
        """
        config = self.config
        resumed = self.maybe_resume()
        if not resumed:
            for head, offset in enumerate(config.previous_token_offsets):
                install_previous_token_head(self.model, head=head, offset=offset)
        last: dict[str, float] = {}
        self.model.train()
        with (
            StopOnSignal() as stop,
            MetricsLogger(self.output_dir, tensorboard=False, resume_step=self.step if resumed else None) as logger,
            tqdm(total=config.total_steps, initial=self.step, desc="pretrain", unit="step",
                 disable=not config.show_progress) as bar,
        ):
            try:
                while self.step < config.total_steps:
                    stop.check()  # steps are short: a signal waits for the one under way
                    started = time.perf_counter()
                    rows = self.rows(self.step)
                    loss = weighted_lm_loss(self.model, rows, self.pad_id)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.max_grad_norm)
                    self.optimizer.step()
                    self.scheduler.step()
                    self.step += 1
                    stage = "induction" if self.step <= config.induction_steps else "drills"
                    metrics = {
                        f"{stage}/loss": float(loss.detach()),
                        "pretrain/tokens": float(sum(len(row.input_ids) for row in rows)),
                        "pretrain/step_seconds": time.perf_counter() - started,
                        "pretrain/lr": self.scheduler.get_last_lr()[0],
                    }
                    if config.eval_every and (self.step % config.eval_every == 0 or self.step == config.total_steps):
                        last = self.measure()
                        metrics.update(last)
                        self.model.train()
                    logger.log(self.step, metrics)
                    bar.update(1)
                    shown = {"loss": f"{metrics[f'{stage}/loss']:.3f}"}
                    if "copy/min_exact" in last:
                        shown["min_exact"] = f"{last['copy/min_exact']:.2f}"
                    bar.set_postfix(shown)
                    if (config.save_every and self.step % config.save_every == 0) or self.step == config.total_steps:
                        self.save_checkpoint()
            except StopRequested as stopped:
                bar.close()
                saved = checkpoint_path(self.output_dir, self.step)
                path = saved if (saved / STATE_FILE).is_file() else self.save_checkpoint()
                raise TrainingInterrupted(stopped.signal_number, self.step, config.total_steps, path) from None
        self.save_final()
        return last

    # ------------------------------------------------------------------------------------------ persistence

    def save_checkpoint(self) -> Path:
        state = {"step": self.step, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "rng": capture_rng_state(),
                 "config": asdict(self.config), RECORD_KEY: self.run_record.to_dict()}
        return save_checkpoint(self.output_dir, self.step, state, self.model, self.tokenizer,
                               keep=self.config.keep_checkpoints)

    @property
    def run_record(self) -> RunRecord:
        """This run's settings, as ``run_config.json`` and every checkpoint hold them (trainers/run_record.py)."""
        return RunRecord.of("pretrain", self.config)

    def maybe_resume(self) -> bool:
        """Continue the run in output_dir if it has a checkpoint of this run (same settings, run_record.py);
        refuse another run's files. Called by `train`; True when a checkpoint was loaded."""
        if self._resumed is not None:
            return self._resumed
        path = None if self.config.overwrite else latest_checkpoint(self.output_dir)
        state = load_checkpoint(path) if path is not None else None
        if state is not None:
            saved = state.get("config", {})
            check_resume(path, state, self.run_record,
                         legacy={key: saved[key] for key in _LEGACY_RESUME_KEYS if key in saved},
                         total_steps=self.config.total_steps, steps_setting="--drill-steps")
        check_run_dir(self.output_dir, continuing=state is not None, overwrite=self.config.overwrite,
                      fresh_flag="--output-dir")
        if state is None:
            clear_run_dir(self.output_dir, _RUN_FILES)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            restore_rng_state(state["rng"])
            self.step = int(state["step"])
        write_run_record(self.output_dir, self.run_record)  # a run continued from before records gets one now
        self._resumed = state is not None
        return self._resumed

    _resume = maybe_resume  # its name before 0.2, which scripts may call

    def save_final(self) -> Path:
        """The model and tokenizer as a Hugging Face directory: ``output_dir/final``."""
        final = self.output_dir / "final"
        save_model(self.model, self.tokenizer, final)
        return final
