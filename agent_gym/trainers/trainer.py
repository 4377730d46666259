"""The RL training loop: rollouts -> advantages -> clipped policy (and critic) updates, with eval and resume.

One step (docs/DESIGN.md §7), each stage building the next frozen record of batch.py:
  1. the task sampler picks ``tasks_per_step`` tasks; the collector plays ``group_size`` episodes of each
     (with ``dynamic_sampling``, groups whose returns are all equal are dropped and more tasks are played, up
     to ``max_sampling_rounds`` rollouts: dynamic_sampling.py);
  2. ``collate`` pads the trajectories into a ``TokenBatch`` (``[B, T]`` tensors; ``loss_mask`` marks
     the tokens the policy sampled);
  3. ``score`` runs the policy (the PPO "old" log-probs), the reference model and the critic on it, without
     gradients: a ``ScoredBatch``;
  4. ``ESTIMATORS[config.algo]`` turns token rewards into ``Advantages`` (algorithms.py; ``gigpo`` adds
     step-level credit from anchor states, gigpo.py); with ``balance_by`` each task kind gets the same weight
     among the informative groups (kind_balance.py);
  5. ``ppo_epochs`` x ``num_mini_batches`` AdamW steps on the clipped surrogate, each mini-batch split into
     micro-batches with gradient accumulation (losses.py).

Critic (PPO only): a separate model with its own AdamW (critic.py says why), or with ``critic="lora"`` a LoRA
adapter and value head on the policy's own weights, which the critic loss never reaches.

The trainer never imports a concrete env: it builds envs with ``agent_gym.make_env(config.env_id, ...)``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from agent_gym.error import InvalidValue
from agent_gym.models.host_memory import release_freed_memory, resident_mb
from agent_gym.models.saving import save_model
from agent_gym.trainers import metrics as m
from agent_gym.trainers.algorithms import (
    ESTIMATORS,
    EstimatorInputs,
    advantage_token_mask,
    kl_penalized_rewards,
)
from agent_gym.trainers.backends import GenerationBackend, make_backend
from agent_gym.trainers.batch import Advantages, ScoredBatch, TokenBatch, UpdateBatch
from agent_gym.trainers.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    load_checkpoint,
    load_trainable_state_dict,
    restore_rng_state,
    save_checkpoint,
    trainable_state_dict,
)
from agent_gym.trainers.config import ConfigError, TrainConfig
from agent_gym.trainers.critic import (
    CRITIC_FILE,
    LoraValueModel,
    ValueModel,
    critic_from_policy,
    load_critic_state,
)
from agent_gym.trainers.dynamic_sampling import fill_with_informative_groups, round_seed
from agent_gym.trainers.kind_balance import (
    balance_weights,
    informative_share_by_kind,
    metrics_by_kind,
    row_loss_weights,
    task_kinds,
)
from agent_gym.trainers.lean_activations import install_lean_activations
from agent_gym.trainers.losses import (
    aggregate,
    aggregation_normalizer,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    policy_loss,
    token_logprobs,
    value_loss,
)
from agent_gym.trainers.lr_schedule import lr_lambda
from agent_gym.trainers.metrics import MetricsLogger, episode_metrics
from agent_gym.trainers.packed_forward import packed_logprobs
from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig
from agent_gym.trainers.rollout_log import RolloutLog
from agent_gym.trainers.run_dir import check_run_dir, clear_run_dir
from agent_gym.trainers.run_record import RECORD_FILE, RECORD_KEY, RunRecord, check_resume, write_run_record
from agent_gym.trainers.stop_signals import StopOnSignal, StopRequested, TrainingInterrupted
from agent_gym.trainers.task_sampler import TaskSampler, task_strata
from agent_gym.trainers.trajectory import Trajectory, collate

__all__ = ["TaskSampler", "Trainer", "TrainingInterrupted", "ValueModel"]

StepCallback = Callable[["Trainer", dict[str, float]], None]
# What a run writes in its output_dir: deleted by --overwrite, so nothing of the old run survives into the new.
_RUN_FILES = ("checkpoints", "metrics.jsonl", "tensorboard", "final", RECORD_FILE)
# What a checkpoint from before run records was checked on (each shapes what the checkpoint holds).
_LEGACY_RESUME_KEYS = ("model", "algo", "env_id", "lora_rank", "critic")


def _merged_reference(base: torch.nn.Module, reference: str, adapter: str) -> torch.nn.Module | None:
    """A frozen plain copy of ``base`` with an adapter folded in: the warm start (``start`` with ``adapter``) or the
    adapter directory ``reference`` names; None where the reference is the base itself (a fresh LoRA)."""
    path = adapter if reference == "start" else reference
    if not path:
        return None
    from agent_gym.models.lora_weights import merged_tensors
    from agent_gym.models.model_init import load_adapter

    plain = copy.deepcopy(base).eval().requires_grad_(False)
    wrapped = load_adapter(copy.deepcopy(base), path)
    plain.load_state_dict(dict(merged_tensors(wrapped)))
    return plain


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Trainer:
    """Trains a causal LM agent on any env following docs/DESIGN.md §2.

    Args:
        config: the run's settings.
        model, tokenizer: a policy and its tokenizer; loaded from ``config.model`` when omitted.
        env_fns: factories of training envs (default: ``make_env(config.env_id, config.env_kwargs)``).
        eval_env_fns: factories of held-out envs (default: env_kwargs updated by ``config.eval_env_kwargs``).
        backend: a generation backend (default: built from ``config.backend``).
        make_envs: turns a list of env factories into the collector's envs (default: calls each factory here);
            with ``config.env_workers`` it is required, e.g. ``agent_gym.distributed.ray_env_pool_factory(N)``,
            which puts them in N Ray actors (what ``agent-gym train --env-workers N`` passes).
    """

    def __init__(
        self,
        config: TrainConfig,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        env_fns: Sequence[Callable[[], Any]] | None = None,
        eval_env_fns: Sequence[Callable[[], Any]] | None = None,
        backend: Any = None,
        make_envs: Callable[[Sequence[Callable[[], Any]]], Any] | None = None,
    ) -> None:
        config.validate()
        if config.env_workers and make_envs is None:
            raise ConfigError(
                "env_workers needs make_envs: pass make_envs=agent_gym.distributed.ray_env_pool_factory("
                f"{config.env_workers}), or run `agent-gym train --env-workers {config.env_workers}`"
            )
        self.make_envs = make_envs
        self.config = config
        _seed_everything(config.seed)
        if config.torch_threads > 0:
            torch.set_num_threads(config.torch_threads)
        self.device = _resolve_device(config.device)
        self.output_dir = Path(config.output_dir)
        if model is None or tokenizer is None:
            model, tokenizer = self._load_model(config)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        model.to(self.device)
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False

        needs_reference = config.kl_coef > 0 or config.kl_in_reward_coef > 0
        # With LoRA and reference "base" the reference is the policy with adapters disabled: no second copy.
        self.reference: torch.nn.Module | None = None
        if needs_reference and config.lora_rank == 0 and not config.adapter:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        elif needs_reference and config.kl_reference != "base":
            self.reference = _merged_reference(model, config.kl_reference, config.adapter)
        self.critic: ValueModel | LoraValueModel | None = None
        if ESTIMATORS[config.algo].needs_critic and config.critic == "full":  # a copy of the plain body
            self.critic = ValueModel.from_policy(model).to(self.device)
        # A LoRA policy samples through a plain copy with the adapters merged in (lora_weights.py): the fast
        # decoder and its prefix cache need plain linear layers, and peft's extra matmuls slow every token.
        self._sampler_model: torch.nn.Module | None = None
        if (config.adapter or config.lora_rank > 0) and config.backend == "transformers" and backend is None:
            self._sampler_model = copy.deepcopy(model).eval().requires_grad_(False)
        if config.adapter:
            from agent_gym.models.model_init import load_adapter

            self.model = load_adapter(model, config.adapter, trainable=True)
        else:
            self.model = self._apply_lora(model) if config.lora_rank > 0 else model
        if ESTIMATORS[config.algo].needs_critic and config.critic == "lora":
            # On the policy as it trains (its adapter included), built after every copy of the model above, so
            # no copy carries the critic's hooks.
            self.critic = critic_from_policy(self.model, "lora", config.critic_lora_rank).to(self.device)
        if self.critic is not None and config.critic_init:  # a resumed run's checkpoint replaces it later
            try:
                load_critic_state(self.critic, config.critic_init)
            except (FileNotFoundError, ValueError) as error:
                raise ConfigError(f"critic_init: {error}") from None
        if config.lean_activations:  # on the trained model only: every copy above samples or scores without grad
            install_lean_activations(self.model)

        optimizer_steps = max(1, config.total_steps * config.ppo_epochs * config.num_mini_batches)
        schedule = lr_lambda(warmup_steps=config.warmup_steps, total_steps=optimizer_steps, decay=config.lr_schedule)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=config.lr,
            weight_decay=config.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.critic_optimizer = self.critic_scheduler = None
        if self.critic is not None:
            self.critic_optimizer = torch.optim.AdamW(
                self.critic.parameters(), lr=config.critic_lr, weight_decay=config.weight_decay
            )
            self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(self.critic_optimizer, schedule)

        self.env_fns = list(env_fns) if env_fns is not None else self._default_env_fns(config.env_kwargs)
        eval_kwargs = {**config.env_kwargs, **config.eval_env_kwargs}
        self.eval_env_fns = (
            list(eval_env_fns) if eval_env_fns is not None else self._default_env_fns(eval_kwargs)
        )
        self.backend = backend if backend is not None else self._make_backend()
        self.collector = self._make_collector(self.env_fns)
        self._eval_collector = None
        self.sampler = TaskSampler(config.seed, position=config.step_offset * config.tasks_per_step,
                                   strata=self._task_strata() if config.stratify_by else None)
        self.step = 0
        self.resumed_from: Path | None = None
        self._run_dir_claimed = False
        # The record of step self.step not yet logged: the starting point's eval ({}), or a step whose eval a
        # signal cut short. It rides in the checkpoint, so the run that continues logs it.
        self._unlogged_metrics: dict[str, float] | None = None
        self._checkpointed: tuple[int, bool, Path] | None = None  # (step, unlogged?, path) of the newest save
        self._rollout_log: RolloutLog | None = None

    # ------------------------------------------------------------------------------------------ setup

    @staticmethod
    def _load_model(config: TrainConfig) -> tuple[torch.nn.Module, Any]:
        if not config.model:
            raise ConfigError(
                "model is required: pass --model PATH_OR_NAME (e.g. a dir from `agent-gym model init`)"
            )
        from agent_gym.models.model_init import load_model_and_tokenizer
        from agent_gym.models.precision import resolve_dtype

        dtype = resolve_dtype(config.dtype, _resolve_device(config.device))
        return load_model_and_tokenizer(config.model, dtype=dtype)

    def _apply_lora(self, model: torch.nn.Module) -> torch.nn.Module:
        from agent_gym.models.lora_setup import add_lora

        config = self.config
        try:
            return add_lora(model, rank=config.lora_rank, alpha=config.lora_alpha, dropout=config.lora_dropout,
                            targets=config.lora_target_modules, top_layers=config.lora_layers)
        except InvalidValue as error:
            raise ConfigError(str(error)) from error

    def _default_env_fns(self, env_kwargs: dict[str, Any]) -> list[Callable[[], Any]]:

        from agent_gym.make import make_env

        env_id = self.config.env_id

        def make() -> Any:
            return make_env(env_id, env_kwargs)

        return [make] * self.config.rollout_batch_size

    def _make_backend(self) -> GenerationBackend:
        from agent_gym.models.precision import dtype_name, resolve_dtype

        config = self.config
        if config.backend == "transformers":
            if self._sampler_model is None:  # shares self.model: sync_weights is a no-op
                return make_backend("transformers", self.model, self.tokenizer)
            backend = make_backend("transformers", self._sampler_model, self.tokenizer)
            backend.sync_weights(self.model)
            return backend
        if config.backend == "vllm":  # loads config.model; sync_weights pushes our weights after each update
            backend = make_backend(
                "vllm",
                config.model,
                self.tokenizer,
                # the same precision as the trainer, so PPO ratios start at 1
                dtype=dtype_name(resolve_dtype(config.dtype, self.device)),
                max_model_len=config.max_context_tokens,
                seed=config.seed,
                max_sequences=config.rollout_batch_size,  # every env's episode in one generate call at most
            )
            # the engine loaded config.model alone: a warm-start adapter (merged) is the policy's first sample
            backend.sync_weights(self.model)
            return backend
        return make_backend("openai", config.model, self.tokenizer, base_url=config.backend_url)

    def _make_collector(self, env_fns: Sequence[Callable[[], Any]]) -> RolloutCollector:
        config = self.config
        rollout = RolloutConfig(
            max_new_tokens=config.max_new_tokens,
            max_turns=config.max_turns,
            max_context_tokens=config.max_context_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            render_tools=config.render_tools,
            show_progress=config.show_progress,
        )
        envs = self.make_envs(env_fns) if self.make_envs is not None else [make() for make in env_fns]
        return RolloutCollector(envs, self.backend, self.tokenizer, rollout)

    def _task_strata(self) -> dict[Any, list[int]]:
        """The training tasks' indices by their ``stratify_by`` value, read from an in-process env's task list."""
        field = self.config.stratify_by
        env = self.collector.envs[0] if self.collector.envs else None
        tasks = getattr(getattr(env, "unwrapped", env), "tasks", None)
        if tasks is None:
            raise ConfigError(f"stratify_by={field!r} reads the task list of an env in this process (a ToolEnv's "
                              "tasks); these envs have none (env workers, or an env of its own kind): drop "
                              "stratify_by, or balance the loss with balance_by")
        try:
            return task_strata(tasks, field)
        except InvalidValue as error:
            raise ConfigError(str(error)) from error

    # ------------------------------------------------------------------------------------------ scoring

    def _response_logits(self, model: torch.nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, int]:
        """Logits from the position before the batch's first response token on, and that position.

        Prompt positions never enter a loss, so the LM head and the softmax skip them (``logits_to_keep``)
        where the model supports it: the prompt is a large share of an agent's context.
        """
        input_ids = batch.input_ids
        start = max(int(batch.prompt_lengths.min()) - 1, 0) if self._supports_logits_to_keep(model) else 0
        kwargs = {"logits_to_keep": input_ids.shape[1] - start} if start > 0 else {}
        # No attention mask: collate() right-pads, and in a causal model no real token attends to the padding
        # after it, so real positions are unchanged while SDPA takes its causal fast path (measured: tiny
        # model, B=8, T=1400, forward+backward 6.0 s -> 4.2 s, identical logits on real tokens).
        logits = model(input_ids=input_ids, **kwargs).logits
        return logits, start

    @staticmethod
    def _supports_logits_to_keep(model: torch.nn.Module) -> bool:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # see through PEFT
        return "logits_to_keep" in inspect.signature(base.forward).parameters

    def _forward_logprobs(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        return self._policy_logprobs(model, batch)[0]

    @property
    def compute_dtype(self) -> torch.dtype:
        """The precision of the update's matmuls: ``config.dtype`` as resolved on this machine (``auto``: by
        measurement, models/precision.py). bf16 runs under autocast, so fp32 parameters (LoRA adapters, or an
        fp32 model passed in) compute in bf16 while they and their gradients stay fp32."""
        if not hasattr(self, "_compute_dtype"):
            from agent_gym.models.precision import resolve_dtype

            self._compute_dtype = resolve_dtype(self.config.dtype, self.device)
        return self._compute_dtype

    def _autocast(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype == torch.bfloat16:
            from agent_gym.models.precision import bf16_autocast

            return bf16_autocast(model, self.device.type)
        return contextlib.nullcontext()

    def _critic_values(self, batch: TokenBatch) -> torch.Tensor:
        """The critic's ``[B, T]`` values, its body run as the policy's is: in the update's precision (under the same
        autocast; in fp32 it kept twice the activations and ran the matmuls at fp32's speed), and a LoRA critic's
        without padding, a group's prompt once (``share_prompt`` / ``padding_free``). Its head runs in fp32."""
        config = self.config
        assert self.critic is not None
        with self._autocast(self.model):
            if isinstance(self.critic, LoraValueModel) and (config.share_prompt or config.padding_free):
                return self.critic.packed(batch.input_ids, batch.attention_mask.sum(dim=1), batch.prompt_lengths,
                                          batch.group_index if config.share_prompt else None)
            return self.critic(batch.input_ids)

    def _policy_logprobs(
        self, model: torch.nn.Module, batch: TokenBatch, entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """``[B, T]`` log-probs (and entropies when asked) of ``batch`` under ``model``, and the positions run.

        With ``share_prompt`` / ``padding_free`` a group's shared prefix runs once and no padding is computed
        (packed_forward.py); otherwise one padded forward of the micro-batch.
        """
        config = self.config
        with self._autocast(model):
            if config.share_prompt or config.padding_free:
                packed = packed_logprobs(
                    model,
                    batch.input_ids,
                    batch.attention_mask.sum(dim=1),
                    batch.prompt_lengths,
                    batch.group_index if config.share_prompt else None,
                    config.temperature,
                    entropy=entropy,
                    entropy_grad=entropy_grad,
                )
                return packed.logprobs, packed.entropy, packed.tokens_computed
            logits, start = self._response_logits(model, batch)
            pad = (start, 0)  # back to full-length [B, T] tensors, zeros on the skipped prompt positions
            logprobs = F.pad(token_logprobs(logits, batch.input_ids[:, start:], config.temperature), pad)
            entropies = None
            if entropy:
                with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                    entropies = F.pad(entropy_from_logits(logits, config.temperature), pad)
            return logprobs, entropies, batch.input_ids.numel()

    @torch.no_grad()
    def score(self, batch: TokenBatch) -> ScoredBatch:
        """Old-policy and reference log-probs, and critic values, in micro-batches without gradients."""
        config = self.config
        needs_reference = config.kl_coef > 0 or config.kl_in_reward_coef > 0
        old, ref, values = [], [], []
        was_training = self.model.training
        self.model.eval()
        for start in range(0, batch.size, config.micro_batch_size):
            micro = batch.rows(slice(start, start + config.micro_batch_size)).trimmed()
            pad = (0, batch.input_ids.shape[1] - micro.input_ids.shape[1])  # back to the batch width
            if self._needs_old_logprobs:
                old.append(F.pad(self._forward_logprobs(self.model, micro), pad))
            if needs_reference:
                ref.append(F.pad(self._reference_logprobs(micro), pad))
            if self.critic is not None:
                values.append(F.pad(self._critic_values(micro), pad))
        self.model.train(was_training)
        return ScoredBatch(
            old_logprobs=torch.cat(old) if old else None,
            ref_logprobs=torch.cat(ref) if ref else None,
            values=torch.cat(values) if values else None,
        )

    @property
    def _needs_old_logprobs(self) -> bool:
        """Whether the old policy must be scored before the update.

        With one epoch and one mini-batch the update's own forward pass *is* the old policy (ratio = 1, as in
        verl's on-policy shortcut), so a separate scoring pass is skipped; k1 KL-in-reward needs it earlier.
        """
        config = self.config
        return config.ppo_epochs > 1 or config.num_mini_batches > 1 or config.kl_in_reward_coef > 0

    def _reference_logprobs(self, micro: TokenBatch) -> torch.Tensor:
        if self.reference is not None:
            return self._forward_logprobs(self.reference, micro)
        with self.model.disable_adapter():  # LoRA: the base weights are the reference
            return self._forward_logprobs(self.model, micro)

    def compute_advantages(
        self, batch: TokenBatch, scored: ScoredBatch, kinds: Sequence[str] | None = None
    ) -> Advantages:
        """The advantages of ``config.algo`` (and PPO's critic targets), from ``ESTIMATORS``.

        With ``config.balance_by``, ``kinds`` holds each row's value of that task field, and the informative
        rows' advantages are scaled so that every kind holds the same weight in the loss (kind_balance.py).
        """
        config = self.config
        advantage_mask = advantage_token_mask(batch.loss_mask, batch.response_mask, config.use_advantage_mask)
        rewards = batch.token_rewards
        if config.kl_in_reward_coef > 0:
            assert scored.old_logprobs is not None and scored.ref_logprobs is not None  # see _needs_old_logprobs
            rewards = kl_penalized_rewards(
                rewards, scored.old_logprobs, scored.ref_logprobs, advantage_mask, config.kl_in_reward_coef
            )
        inputs = EstimatorInputs(
            token_rewards=rewards,
            episode_returns=batch.episode_returns,
            group_index=batch.group_index,
            advantage_mask=advantage_mask,
            values=scored.values,
            gamma=config.gamma,
            lam=config.lam,
            tokens=batch,
            step_weight=config.gigpo_step_weight,
            step_gamma=config.gigpo_gamma,
            anchor_state=config.gigpo_anchor_state,
        )
        targets = ESTIMATORS[config.algo](inputs)
        if config.balance_by and kinds is not None:
            row_weights = row_loss_weights(self._loss_token_mask(batch), config.aggregation)
            scale = balance_weights(kinds, batch.episode_returns, batch.group_index, row_weights)
            targets = dataclasses.replace(targets, advantages=targets.advantages * scale.to(self.device)[:, None])
        return targets

    # ------------------------------------------------------------------------------------------ update

    def _loss_token_mask(self, tokens: TokenBatch) -> torch.Tensor:
        """Tokens in the policy loss: the model tokens, or every response token with the loss mask off."""
        return (tokens.loss_mask if self.config.use_loss_mask else tokens.response_mask).float()

    def _update(self, batch: UpdateBatch) -> dict[str, float]:
        """ppo_epochs x num_mini_batches optimizer steps with micro-batch gradient accumulation."""
        config = self.config
        generator = torch.Generator().manual_seed(self._step_seed())
        totals: dict[str, list[float]] = defaultdict(list)
        self.model.train()
        for _ in range(config.ppo_epochs):
            order = torch.randperm(batch.size, generator=generator)
            for mini_rows in torch.tensor_split(order, min(config.num_mini_batches, batch.size)):
                for key, value in self._optimizer_step(batch.rows(mini_rows.to(self.device))).items():
                    totals[key].append(value)
        stats = {key: float(np.mean(values)) for key, values in totals.items()}
        stats[m.UPDATE_BF16] = float(self.compute_dtype == torch.bfloat16)
        return stats

    def _optimizer_step(self, mini: UpdateBatch) -> dict[str, float]:
        config, agg, length = self.config, self.config.aggregation, self.config.max_context_tokens
        loss_tokens = self._loss_token_mask(mini.tokens)
        # Micro-batch losses divide by the whole mini-batch's count, so their gradients sum to its gradient.
        normalizer = aggregation_normalizer(loss_tokens, agg)
        value_normalizer = aggregation_normalizer(mini.targets.advantage_mask, agg)
        stats = m.UpdateStats(loss_tokens, mini.tokens.loss_mask)
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)
        # Micro-batches of similar lengths waste little on padding; the sum over them is order-free. With
        # share_prompt a group's rows stay together (by group, then length), so they share their prefix.
        lengths = mini.tokens.attention_mask.sum(dim=1)
        if config.share_prompt:
            lengths = lengths + mini.tokens.group_index * (mini.tokens.input_ids.shape[1] + 1)
        mini = mini.rows(lengths.argsort(stable=True))
        for first_row in range(0, mini.size, config.micro_batch_size):
            micro = mini.rows(slice(first_row, first_row + config.micro_batch_size)).trimmed()
            tokens, scored, targets = micro.tokens, micro.scored, micro.targets
            mask = self._loss_token_mask(tokens)
            # entropy: a graph only when it is in the loss
            logprobs, entropy, computed = self._policy_logprobs(
                self.model, tokens, entropy=True, entropy_grad=config.entropy_coef > 0
            )
            assert entropy is not None
            old_logprobs = scored.old_logprobs if scored.old_logprobs is not None else logprobs.detach()
            zero = logprobs.new_zeros(())

            # PPO Eq. 7 on the masked tokens (Agent-R1's action mask); losses.py holds the equations.
            pg = policy_loss(
                logprobs,
                old_logprobs,
                targets.advantages,
                mask,
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                dual_clip=config.dual_clip,
                aggregation=agg,
                normalizer=normalizer,
                norm_length=length,
            )
            entropy_loss = aggregate(entropy, mask, agg, normalizer, length)
            kl = kl_penalty(logprobs, scored.ref_logprobs, config.kl_estimator) if config.kl_coef > 0 else None
            kl_loss = aggregate(kl, mask, agg, normalizer, length) if kl is not None else zero
            loss = pg.loss - config.entropy_coef * entropy_loss + config.kl_coef * kl_loss
            loss.backward()
            # The critic's loss reaches none of the policy's parameters (critic.py), so it is backed apart, after the
            # policy's graph is freed: a PPO micro-batch holds one model's activations at a time, not two.
            v_loss, v_clipfrac = zero, zero
            if self.critic is not None:
                v_loss, v_clipfrac = value_loss(
                    self._critic_values(tokens),
                    scored.values,
                    targets.returns,
                    targets.advantage_mask,
                    config.value_clip,
                    agg,
                    value_normalizer,
                    length,
                )
                v_loss.backward()

            stats.add(loss_tokens=mask, model_tokens=tokens.loss_mask, policy=pg, entropy=entropy,
                      old_logprobs=old_logprobs, sampling_logprobs=tokens.sampling_logprobs, tokens_computed=computed,
                      kl=kl, value_loss=v_loss if self.critic is not None else None,
                      value_clipfrac=v_clipfrac if self.critic is not None else None)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], config.max_grad_norm
        )
        self.optimizer.step()
        self.scheduler.step()
        if self.critic is not None and self.critic_optimizer is not None:
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), config.max_grad_norm)
            self.critic_optimizer.step()
            self.critic_scheduler.step()
        return stats.result(grad_norm)

    # ------------------------------------------------------------------------------------------ loop

    def _step_seed(self) -> int:
        """The seed of this step's sampling and mini-batch order: a step of a continued run (step_offset) gets the
        seed its step number in the whole run has, not that of the run's first steps again."""
        return self.config.seed * 1_000_003 + self.config.step_offset + self.step

    def train_step(self) -> dict[str, float]:
        """One rollout batch and its update; returns the step's metrics.

        With ``config.dynamic_sampling`` the batch is refilled with more tasks until it holds
        ``tasks_per_step`` groups whose returns differ (dynamic_sampling.py); the episode metrics are over every
        episode played, the update over the groups kept.
        """
        config = self.config
        started = time.perf_counter()
        dropped_before = self.collector.dropped_episodes
        step_seed = self._step_seed()

        def collect_round(round_index: int) -> list[Trajectory]:
            specs = self.sampler.draw(config.tasks_per_step)
            seed = round_seed(step_seed, round_index)
            return self.collector.collect(specs, config.group_size, greedy=False, seed=seed)

        rounds = config.max_sampling_rounds if config.dynamic_sampling else 1
        sampled = fill_with_informative_groups(collect_round, config.tasks_per_step, rounds)
        trajectories = sampled.trajectories if config.dynamic_sampling else sampled.sampled
        if not trajectories:
            raise RuntimeError("the rollout collector returned no trajectories")
        rollout_s = time.perf_counter() - started
        batch = collate(trajectories, self.pad_id).to(self.device)
        scored = self.score(batch)
        kinds = task_kinds(trajectories, config.balance_by) if config.balance_by else None
        targets = self.compute_advantages(batch, scored, kinds)
        stats = self._update(UpdateBatch(batch, scored, targets))
        self.step += 1
        release_freed_memory()  # a fragmented heap would keep every step's peak (host_memory.py)
        elapsed = time.perf_counter() - started
        metrics = {
            **episode_metrics(sampled.sampled),
            **stats,
            m.ADVANTAGE_MEAN: float(masked_mean(targets.advantages, targets.advantage_mask)),
            m.LEARNING_RATE: self.scheduler.get_last_lr()[0],
            # every episode played counts, the groups dynamic sampling dropped included
            m.TOKENS_PER_S: sum(len(t.response_ids) for t in sampled.sampled) / max(elapsed, 1e-9),
            m.ROLLOUT_TIME: rollout_s,
            m.UPDATE_TIME: elapsed - rollout_s,
            m.DROPPED_EPISODES: float(self.collector.dropped_episodes - dropped_before),
        }
        if (resident := resident_mb()) is not None:
            metrics[m.RESIDENT_MB] = resident
        if config.group_size > 1:  # the share of groups that carry a contrast (GRPO learns from those only)
            metrics[m.INFORMATIVE_GROUPS] = sampled.informative_share
        if config.dynamic_sampling:
            metrics[m.SAMPLING_ROUNDS] = float(sampled.rounds)
        for field_name in dict.fromkeys(name for name in (config.balance_by, config.metrics_by) if name):
            for kind, share in informative_share_by_kind(sampled.sampled, field_name).items():
                metrics[f"{m.INFORMATIVE_GROUPS}/{kind}"] = share
        if config.metrics_by:
            metrics.update(metrics_by_kind(sampled.sampled, config.metrics_by))
        if config.log_rollouts:
            self._open_rollout_log(self.step - 1 if self.resumed_from else None).write(self.step, sampled.sampled)
        self.backend.sync_weights(self.model)
        return metrics

    @torch.no_grad()
    def evaluate(self, episodes: int | None = None) -> dict[str, float]:
        """Greedy episodes on the held-out env, one per task (task indices 0..episodes-1, same every time)."""
        episodes = episodes or self.config.eval_episodes
        if self._eval_collector is None:
            self._eval_collector = self._make_collector(self.eval_env_fns)
        specs = [{"seed": index, "options": {"task_index": index}} for index in range(episodes)]
        trajectories = self._eval_collector.collect(specs, 1, greedy=True, seed=self.config.seed)
        return episode_metrics(trajectories, prefix="eval")

    def train(self, callbacks: Sequence[StepCallback] = ()) -> dict[str, float]:
        """Run (or resume) training to ``config.total_steps``; returns the last logged metrics.

        SIGINT or SIGTERM (Ctrl-C, a job scheduler's stop) stops the run where it can save (stop_signals.py): a
        rollout or an evaluation under way is abandoned, an update under way is finished; then a checkpoint of
        the last finished step is written and :class:`TrainingInterrupted` raised. Run again, training continues
        from that checkpoint and the abandoned work is redone as it would have run.
        """
        config = self.config
        self.maybe_resume()
        # continuing a step whose record is not logged: its line, if a killed run wrote one, is dropped
        resume_step = self.step - (self._unlogged_metrics is not None) if self.resumed_from else None
        last: dict[str, float] = {}
        if config.log_rollouts:
            self._open_rollout_log(resume_step)
        with (
            StopOnSignal() as stop,
            self._update_finishes_once_begun(stop),
            MetricsLogger(self.output_dir, config.tensorboard, resume_step=resume_step) as logger,
            tqdm(
                total=config.total_steps,
                initial=self.step,
                desc=f"train {config.algo}",
                unit="step",
                disable=not config.show_progress,
            ) as bar,
        ):
            try:
                # step 0's record is the starting point's eval, for "RL improves over the start"
                while self._unlogged_metrics is not None or self.step < config.total_steps:
                    if self._unlogged_metrics is None:
                        metrics = self._train_step_or_undo(stop)
                        bar.update(1)
                    else:
                        metrics = self._unlogged_metrics
                    if config.eval_every and (
                        self.step % config.eval_every == 0 or self.step == config.total_steps
                    ):
                        metrics.update(self._evaluate_or_undo(stop, metrics))
                    logger.log(self.step, metrics)
                    self._unlogged_metrics = None
                    last = metrics
                    # train EM and held-out EM side by side, under names that tell them apart
                    bar.set_postfix(
                        {
                            name: f"{metrics[key]:.3f}"
                            for name, key in (("reward", m.REWARD), ("em", m.EM), ("eval_em", m.EVAL_EM))
                            if key in metrics
                        }
                    )
                    if self.step == 0:  # the starting point: nothing trained, nothing to save
                        continue
                    if (config.save_every and self.step % config.save_every == 0) or self.step == config.total_steps:
                        self.save_checkpoint()
                    for callback in callbacks:
                        callback(self, metrics)
            except StopRequested as stopped:
                bar.close()
                path = self._checkpoint_for_stop()
                raise TrainingInterrupted(stopped.signal_number, self.step, config.total_steps, path) from None
            self.save_final()  # a signal during it is too late to stop anything: the run is complete
        return last

    def _open_rollout_log(self, resume_step: int | None) -> RolloutLog:
        """The run's `RolloutLog`, opened once (a resumed run's later records dropped from ``resume_step`` on)."""
        if self._rollout_log is None:
            self._rollout_log = RolloutLog(self.output_dir, self.tokenizer, self.config.log_rollouts, resume_step)
        return self._rollout_log

    @contextlib.contextmanager
    def _update_finishes_once_begun(self, stop: StopOnSignal) -> Iterator[None]:
        """From a step's first optimizer step on, a signal waits for the update to end: a checkpoint never holds
        half an update."""
        optimizers = [o for o in (self.optimizer, self.critic_optimizer) if o is not None]
        handles = [o.register_step_pre_hook(lambda *_: stop.hold()) for o in optimizers]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _train_step_or_undo(self, stop: StopOnSignal) -> dict[str, float]:
        """`train_step`, abandoned by a signal during its rollout; the rollout's task draws and random numbers are
        then undone, so the state is the step's start (weights and optimizers change only in the update)."""
        sampler, rng = self.sampler.state_dict(), capture_rng_state()
        try:
            with stop.abortable():
                return self.train_step()
        except StopRequested:
            self.sampler.load_state_dict(sampler)
            restore_rng_state(rng)
            raise

    def _evaluate_or_undo(self, stop: StopOnSignal, metrics: dict[str, float]) -> dict[str, float]:
        """`evaluate`, abandoned by a signal; the step's record then waits, unlogged, in the checkpoint."""
        rng = capture_rng_state()
        try:
            with stop.abortable():
                return self.evaluate()
        except StopRequested:
            restore_rng_state(rng)
            self._unlogged_metrics = metrics
            raise

    def _checkpoint_for_stop(self) -> Path:
        """A checkpoint of the current state: the newest one when it already is that, else a new one."""
        if self._checkpointed is not None and self._checkpointed[:2] == (
            self.step, self._unlogged_metrics is not None
        ):
            return self._checkpointed[2]
        tqdm.write(f"saving a checkpoint of step {self.step} before stopping")
        return self.save_checkpoint()

    # ------------------------------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "step": self.step,
            "policy": trainable_state_dict(self.model),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": capture_rng_state(),
            "config": self.config.to_dict(),
            RECORD_KEY: self.run_record.to_dict(),
        }
        if (
            self.critic is not None
            and self.critic_optimizer is not None
            and self.critic_scheduler is not None
        ):
            state["critic"] = self.critic.state_dict()
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
            state["critic_scheduler"] = self.critic_scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_trainable_state_dict(self.model, state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            if "critic" not in state:
                raise ConfigError("this checkpoint has no critic; it was not saved by a PPO run")
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        restore_rng_state(state["rng"])
        self.step = int(state["step"])
        self.backend.sync_weights(self.model)

    def save_checkpoint(self) -> Path:
        """`state_dict` (with a step record not yet logged, if any) and the policy, in ``checkpoints/step_N``."""
        state = self.state_dict()
        if self._unlogged_metrics is not None:
            state["unlogged_metrics"] = self._unlogged_metrics
        path = save_checkpoint(
            self.output_dir,
            self.step,
            state,
            self.model,
            self.tokenizer,
            keep=self.config.keep_checkpoints,
        )
        self._checkpointed = (self.step, self._unlogged_metrics is not None, path)
        return path

    def maybe_resume(self) -> Path | None:
        """Resume per ``config.resume``: auto (latest in output_dir, if any), never, or a checkpoint path.

        A run that does not continue the one in output_dir needs it empty, or ``config.overwrite`` (which
        deletes the old run's files): the checkpoints, metrics and final/ of two runs never mix.
        """
        if self._run_dir_claimed:
            return self.resumed_from
        config = self.config
        latest = latest_checkpoint(self.output_dir)
        # --overwrite starts a new run: "auto" then finds nothing to continue
        path = {"never": None, "auto": None if config.overwrite else latest}.get(config.resume, Path(config.resume))
        state = load_checkpoint(path) if path is not None else None
        if state is not None:
            self._check_resumable(path, state)
        continuing = path is not None and latest is not None and path.resolve() == latest.resolve()
        continuing = continuing and not config.overwrite
        check_run_dir(self.output_dir, continuing=continuing, overwrite=config.overwrite, fresh_flag="--output-dir",
                      hint=", --resume auto to continue it" if latest is not None and not continuing else "")
        if not continuing:
            clear_run_dir(self.output_dir, _RUN_FILES)
        write_run_record(self.output_dir, self.run_record)  # a run continued from before records gets one now
        # a new run's first record is the starting point's eval
        self._unlogged_metrics = {} if self.config.eval_every and self.step == 0 else None
        if state is not None:
            self.load_state_dict(state)
            self.resumed_from = path
            self._unlogged_metrics = state.get("unlogged_metrics")
            if continuing:  # a checkpoint of this run directory: a stop right away need not save another
                self._checkpointed = (self.step, self._unlogged_metrics is not None, path)
        self._run_dir_claimed = True
        return self.resumed_from

    @property
    def run_record(self) -> RunRecord:
        """This run's settings, as ``run_config.json`` and every checkpoint hold them (run_record.py)."""
        return RunRecord.of("train", self.config)

    def _check_resumable(self, path: Path, state: dict[str, Any]) -> None:
        """The shared resume check (run_record.py): same settings, and a step within ``total_steps``."""
        saved = state.get("config", {})
        check_resume(path, state, self.run_record, legacy={k: saved[k] for k in _LEGACY_RESUME_KEYS if k in saved},
                     total_steps=self.config.total_steps, steps_setting="--total-steps")

    def save_final(self) -> Path:
        """The trained policy (LoRA: its adapter) and tokenizer as a HF directory: ``output_dir/final``; PPO's
        critic beside them (``critic.pt``), for value-guided decoding (``agent-gym eval --value-guided N``)."""
        final = self.output_dir / "final"
        save_model(self.model, self.tokenizer, final)
        if self.critic is not None:
            self.critic.save(final / CRITIC_FILE)
        return final

    def close(self) -> None:
        for closeable in (self.collector, self._eval_collector, self.backend):
            close = getattr(closeable, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()
