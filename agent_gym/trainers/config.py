"""Training configuration: one dataclass whose fields carry ``metadata={"help": ...}``, and its validation.

TRL-style: ``agent-gym train`` builds its flags and reads YAML files from the fields (agent_gym/cli/
config_flags.py), so the CLI and the code never drift. Every default says where it comes from. Precedence when
both are given: CLI flag > YAML file > dataclass default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_gym.error import AgentGymError
from agent_gym.models.threads import DEFAULT_TORCH_THREADS
from agent_gym.trainers.algorithms import ESTIMATORS
from agent_gym.trainers.gigpo import ANCHOR_STATES
from agent_gym.trainers.losses import AGGREGATIONS, KL_ESTIMATORS

__all__ = ["ConfigError", "TrainConfig"]


class ConfigError(AgentGymError, ValueError):
    """A configuration value or file is invalid; the message says which field and what is allowed."""


def _help(text: str, choices: tuple[str, ...] | None = None) -> dict[str, object]:
    return {"help": text, "choices": choices} if choices else {"help": text}


@dataclass
class TrainConfig:
    """Everything `agent-gym train` needs. Defaults follow Agent-R1's verl recipe unless noted."""

    # --- model and environment ---
    model: str = field(
        default="",
        metadata=_help(
            "Policy model: a local Hugging Face directory (e.g. from `agent-gym model init`) or a hub name "
            "such as Qwen/Qwen2.5-3B-Instruct. Must be given, by this flag or as `model:` in the --config file."
        ),
    )
    env_id: str = field(
        default="AgentR1-SynthHop-v0",
        metadata=_help(
            "Gymnasium id of the training env (any env following the environment contract in the README). "
            "Default: the offline synthetic world."
        ),
    )
    env_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata=_help("Keyword arguments for gymnasium.make(env_id, ...); JSON on the command line."),
    )
    eval_env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {"split": "test"},
        metadata=_help(
            "Overrides of env_kwargs for the held-out eval env (default selects the test split); JSON."
        ),
    )
    backend: Literal["transformers", "vllm", "openai"] = field(
        default="transformers",
        metadata=_help(
            "Generation backend: transformers (CPU/GPU, shares the trainer's weights), vllm (offline engine, "
            "weights synced after each update), openai (an OpenAI-compatible server; no weight sync)."
        ),
    )
    backend_url: str = field(
        default="http://localhost:8000/v1",
        metadata=_help("Base URL of the OpenAI-compatible server (backend=openai only)."),
    )
    torch_threads: int = field(
        default=DEFAULT_TORCH_THREADS,
        metadata=_help(
            "torch.set_num_threads for training and generation; 0 keeps torch's default (one per core). Measured "
            "on a shared 2-core machine: 4 PPO steps of a hidden-32 model took 41 s with torch's default, 1 s with "
            "1 (more in agent_gym/models/threads.py)."
        ),
    )
    device: str = field(
        default="auto", metadata=_help("Torch device for training: auto (cuda if present), cpu, cuda.")
    )
    dtype: Literal["auto", "float32", "bfloat16"] = field(
        default="auto",
        metadata=_help(
            "Parameter dtype of the policy (with LoRA: of the frozen base; the adapters train in fp32). auto: "
            "bfloat16 on GPUs that support it, and on CPUs with avx512_bf16/AMX where a matmul timed at the run's "
            "thread count ran faster in bf16 (one thread on the shared Xeon: 0.59x, so float32), else float32. "
            "Full fine-tunes in bfloat16 learn poorly at small lr (updates round away; benchmarks/precision.py)."
        ),
    )

    # --- algorithm ---
    algo: str = field(
        default="grpo",
        metadata=_help(
            "Advantage estimator (dr_grpo: GRPO without the std; reinforce_pp_baseline: REINFORCE++ with "
            "a group-mean baseline; gigpo: GRPO plus GiGPO's step-level advantage from anchor states, see the "
            "gigpo_* fields). Agent-R1 compares PPO, GRPO, REINFORCE++ and RLOO.",
            tuple(ESTIMATORS),
        ),
    )
    group_size: int = field(
        default=5,
        metadata=_help(
            "Episodes per task per step (GRPO/RLOO/REINFORCE++-baseline groups); 5 as in Search-R1/Agent-R1 "
            "GRPO."
        ),
    )
    tasks_per_step: int = field(
        default=8,
        metadata=_help(
            "Distinct tasks per training step; the rollout batch is tasks_per_step * group_size episodes."
        ),
    )
    total_steps: int = field(
        default=100, metadata=_help("Training steps (one rollout batch and update each).")
    )
    ppo_epochs: int = field(default=1, metadata=_help("Passes over each rollout batch (verl ppo_epochs=1)."))
    num_mini_batches: int = field(
        default=1,
        metadata=_help(
            "Optimizer steps per epoch; 1 = on-policy single update per batch (verl GRPO recipes)."
        ),
    )
    micro_batch_size: int = field(
        default=8,
        metadata=_help(
            "Sequences per forward/backward; gradients accumulate up to the mini-batch (memory knob only)."
        ),
    )
    gamma: float = field(default=1.0, metadata=_help("Discount over action tokens (verl default 1.0)."))
    lam: float = field(default=1.0, metadata=_help("GAE lambda (verl default 1.0)."))

    # --- which groups train, and with what weight (issue 25: GRPO learns only from groups that disagree) ---
    dynamic_sampling: bool = field(
        default=False,
        metadata=_help(
            "DAPO's dynamic sampling: drop groups whose episodes all got the same return and roll out more "
            "tasks until tasks_per_step informative groups are in hand, within max_sampling_rounds rollouts; "
            "logs charts/informative_groups (the share of groups kept) and charts/sampling_rounds."
        ),
    )
    max_sampling_rounds: int = field(
        default=4,
        metadata=_help(
            "Rollouts of tasks_per_step tasks a step may play to fill its batch with dynamic sampling (verl's "
            "DAPO recipe allows 10; each round costs a full rollout). A step that ends short trains on the "
            "informative groups it found."
        ),
    )
    balance_by: str = field(
        default="",
        metadata=_help(
            "A task field (from the env's reset info['task_fields'], e.g. hops or kind for SynthHop) whose "
            "values get equal total weight in the loss among the informative groups; logs "
            "charts/informative_groups/<value>. Empty: no balance."
        ),
    )
    stratify_by: str = field(
        default="",
        metadata=_help(
            "A task field (as for balance_by) whose values each step draws equally often: draw k of a step takes "
            "a task of the k-th value in turn, so no step trains on one hop count alone (a uniform draw of 4 from "
            "a 1/2-hop mix does once in 8 steps). Needs envs in this process that list their tasks (ToolEnv). "
            "Empty: uniform draws."
        ),
    )
    log_rollouts: int = field(
        default=0,
        metadata=_help(
            "Groups of each step's rollout written whole to OUTPUT_DIR/rollouts.jsonl (the decoded episodes with "
            "their task fields, reward, EM and tool calls), to read how a habit changes; 0: none."
        ),
    )
    metrics_by: str = field(
        default="",
        metadata=_help(
            "A task field (as for balance_by) whose values split the rollout's episode metrics: logs "
            "charts/<metric>/<value> (reward, turns, em, f1, ...) and charts/informative_groups/<value>, e.g. "
            "hops, to see whether 1-hop and 2-hop questions learn different habits. Empty: no split."
        ),
    )
    gigpo_step_weight: float = field(
        default=1.0,
        metadata=_help("GiGPO's omega: the weight of the step-level advantage added to GRPO's (1 in GiGPO)."),
    )
    gigpo_gamma: float = field(
        default=0.95,
        metadata=_help("GiGPO's discount of later turns' rewards in a turn's return (0.95 in GiGPO's runs)."),
    )
    gigpo_anchor_state: Literal["observations", "context"] = field(
        default="observations",
        metadata=_help(
            "What makes two turns' states the same for GiGPO's anchor groups: observations (the prompt and the "
            "env's replies so far, GiGPO's env state) or context (every token so far, the agent's own included)."
        ),
    )

    # --- loss ---
    clip_low: float = field(default=0.2, metadata=_help("Lower PPO clip range, 1 - eps (PPO paper 0.2)."))
    clip_high: float = field(
        default=0.2,
        metadata=_help("Upper PPO clip range, 1 + eps (0.2 as PPO; DAPO's clip-higher uses 0.28)."),
    )
    dual_clip: float | None = field(
        default=3.0,
        metadata=_help(
            "Dual-clip constant c > 1 for negative advantages (Ye et al. 2020; verl clip_ratio_c=3.0). "
            "Pass none to disable."
        ),
    )
    value_clip: float | None = field(
        default=0.5,
        metadata=_help(
            "Value-loss clip range around the old values (verl cliprange_value=0.5); none disables."
        ),
    )
    entropy_coef: float = field(default=0.0, metadata=_help("Entropy bonus coefficient (verl default 0)."))
    kl_coef: float = field(
        default=0.001,
        metadata=_help(
            "Coefficient of the KL-to-reference term in the loss (Agent-R1/verl kl_loss_coef=0.001); 0 skips "
            "the "
            "reference model."
        ),
    )
    kl_reference: str = field(
        default="base",
        metadata=_help(
            "The model the KL terms pull toward. base: the pretrained model (with LoRA its adapters off; with "
            "adapter, the model under that warm start). start: the policy as this run began (verl's reference; "
            "with adapter, the warm start merged in; otherwise the same as base). Or a LoRA adapter directory, "
            "merged into the base (the warm start of a run continued from a later adapter)."
        ),
    )
    kl_estimator: str = field(
        default="k3",
        metadata=_help(
            "KL estimator in the loss (k3 = verl low_var_kl, GRPO Eq. 4).",
            KL_ESTIMATORS,
        ),
    )
    kl_in_reward_coef: float = field(
        default=0.0,
        metadata=_help(
            "Coefficient of the k1 KL penalty folded into token rewards (InstructGPT style; for "
            "ppo/reinforce_pp)."
        ),
    )
    aggregation: str = field(
        default="token-mean",
        metadata=_help(
            "Loss aggregation (token-mean: DAPO and verl default; seq-mean-token-sum-norm: Dr.GRPO).",
            AGGREGATIONS,
        ),
    )
    use_loss_mask: bool = field(
        default=True,
        metadata=_help(
            "Mask env observation tokens out of the loss (Agent-R1's action mask); --no-use-loss-mask (or "
            "--no-loss-mask): the Table 4 ablation."
        ),
    )
    use_advantage_mask: bool = field(
        default=True,
        metadata=_help(
            "Give advantages to model tokens only (Agent-R1); --no-use-advantage-mask (or "
            "--no-advantage-mask): the Table 4 ablation."
        ),
    )

    # --- optimisation ---
    lr: float = field(
        default=1e-6,
        metadata=_help(
            "Policy AdamW learning rate (Agent-R1/verl actor lr 1e-6 for Qwen2.5-3B; from-scratch tiny "
            "models "
            "need far larger, e.g. 1e-4)."
        ),
    )
    critic_lr: float = field(
        default=1e-5, metadata=_help("Critic AdamW learning rate (verl critic lr 1e-5).")
    )
    critic: Literal["full", "lora"] = field(
        default="full",
        metadata=_help(
            "PPO's critic: full (a copy of the policy's body, all weights trained: Agent-R1/verl) or lora (a "
            "LoRA adapter and value head on the policy's own weights, shared, not copied; the critic loss "
            "reaches neither the base nor the policy's adapter). lora holds critic_lora_rank-sized adapters "
            "instead of a second model."
        ),
    )
    critic_lora_rank: int = field(
        default=16, metadata=_help("Rank of the lora critic's adapters (alpha = 2 x rank, as lora_alpha's default).")
    )
    critic_init: str = field(
        default="",
        metadata=_help(
            "Start PPO's critic from this critic.pt (a run's final/ directory, or a published adapter's, written "
            "beside it) instead of a zero value head, e.g. to continue a run from its committed adapter. Its kind "
            "(full or lora) and rank must be the critic's."
        ),
    )
    weight_decay: float = field(default=0.01, metadata=_help("AdamW weight decay (verl default 0.01)."))
    lr_schedule: Literal["constant", "cosine"] = field(
        default="constant", metadata=_help("LR schedule after warmup (verl default constant).")
    )
    warmup_steps: int = field(default=0, metadata=_help("Linear LR warmup, in optimizer steps."))
    max_grad_norm: float = field(
        default=1.0, metadata=_help("Global gradient-norm clip (verl grad_clip 1.0).")
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata=_help("Recompute activations in backward to save memory (for 3B models on one GPU)."),
    )
    lean_activations: bool = field(
        default=False,
        metadata=_help(
            "Keep less for the update's backward: every decoder MLP recomputed from its input, and RMSNorms that "
            "keep their input in the model's precision (trainers/lean_activations.py). Unlike "
            "gradient_checkpointing it keeps the group's shared prompt computed once."
        ),
    )

    # --- LoRA (peft) ---
    lora_rank: int = field(default=0, metadata=_help("LoRA rank; 0 trains all weights."))
    lora_alpha: int = field(
        default=32, metadata=_help("LoRA alpha (scale = alpha / rank); peft examples use 2x rank.")
    )
    lora_dropout: float = field(default=0.0, metadata=_help("LoRA dropout."))
    adapter: str = field(
        default="",
        metadata=_help(
            "Start from this LoRA adapter directory (e.g. an `agent-gym sft --lora-rank` warm start) and keep "
            "training it; its rank and targets replace the lora_* settings."
        ),
    )
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["all-linear"],
        metadata=_help(
            "Modules that get adapters; 'all-linear' is peft's shorthand for every linear layer but the LM "
            "head."
        ),
    )

    # --- rollout ---
    temperature: float = field(
        default=1.0,
        metadata=_help(
            "Sampling temperature (1.0: Agent-R1/verl rollout default; log-probs are computed at it)."
        ),
    )
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling mass (1.0 = off, verl default)."))
    max_new_tokens: int = field(default=256, metadata=_help("Token budget of one model turn."))
    max_context_tokens: int = field(
        default=4096,
        metadata=_help(
            "Token budget of one step-level sample, prompt + response (model and env tokens); also the "
            "constant length of Dr.GRPO's seq-mean-token-sum-norm."
        ),
    )
    max_turns: int | None = field(
        default=None,
        metadata=_help(
            "Model turns per episode; none leaves truncation to the env's own max_turns. An episode cut here "
            "pays what the env pays when its own max_turns cuts one (through the env's truncate())."
        ),
    )
    render_tools: bool = field(
        default=False,
        metadata=_help(
            "Render info['tools'] with the chat template (Qwen2.5's native way); off when the env already "
            "puts the tool protocol in its system prompt, as ours do."
        ),
    )

    # --- scale-out: env workers on Ray ---
    env_workers: int = field(
        default=0,
        metadata=_help(
            "Ray actors that host the envs, each a shard stepped in one call per turn; 0 keeps the envs in this "
            "process. Needs agent-gym[distributed]."
        ),
    )
    ray_address: str | None = field(
        default=None,
        metadata=_help(
            "Ray cluster for the env workers (HOST:PORT of its head, or auto); none starts a local cluster. "
            "With RAY_AUTH_MODE unset, tokens are on where a token exists (ray start's rule; README, 'Scaling out')."
        ),
    )
    env_step_timeout: float = field(
        default=60.0,
        metadata=_help(
            "Seconds an env worker may take for one batch of resets or steps; past it, or when the worker dies, "
            "its episodes are dropped (logged as perf/dropped_episodes) and the worker is restarted."
        ),
    )

    # --- evaluation, checkpoints, logging ---
    eval_every: int = field(
        default=10, metadata=_help("Greedy eval on held-out tasks every N steps; 0 disables.")
    )
    eval_episodes: int = field(
        default=64, metadata=_help("Held-out episodes per eval (greedy, one per task).")
    )
    save_every: int = field(
        default=10, metadata=_help("Checkpoint every N steps (and at the end); 0 = end only.")
    )
    keep_checkpoints: int = field(default=2, metadata=_help("Most recent checkpoints kept on disk."))
    output_dir: str = field(
        default="runs/agent-gym",
        metadata=_help("Run directory: metrics.jsonl, TensorBoard events, checkpoints/, final/."),
    )
    resume: str = field(
        default="auto",
        metadata=_help(
            "auto: resume from the latest checkpoint in output_dir if one exists; never; or a checkpoint "
            "path."
        ),
    )
    overwrite: bool = field(
        default=False,
        metadata=_help(
            "Start a new run in output_dir even if it holds one (resume auto then continues nothing), deleting "
            "the old run's checkpoints/, metrics.jsonl, tensorboard/ and final/ first. Without it, a run that "
            "does not continue the one in a non-empty output_dir is refused."
        ),
    )
    seed: int = field(default=0, metadata=_help("Seed of torch, numpy, random and the task sampler."))
    step_offset: int = field(
        default=0,
        metadata=_help(
            "Steps already trained by the run this one continues from its saved adapter with a fresh optimizer "
            "(--adapter DIR of a run's step N): the task draws and the sampling seeds go on from that run's step N "
            "(task position N * tasks_per_step) instead of repeating its first steps. Step numbers, total_steps "
            "and the LR schedule still count this process's steps. 0: a run of its own."
        ),
    )
    show_progress: bool = field(
        default=True, metadata=_help("Show tqdm progress bars (training steps and each rollout).")
    )
    tensorboard: bool = field(default=True, metadata=_help("Also write TensorBoard event files."))

    # --- update speed (issue 26): each exact to float rounding unless its help says otherwise ---
    share_prompt: bool = field(
        default=True,
        metadata=_help(
            "Run the prefix that a group's samples share (system prompt + question) once per micro-batch in "
            "the update and scoring passes, every sample reusing its keys/values (gradients summed through "
            "them). Same loss and gradients as the padded pass, to float rounding."
        ),
    )
    padding_free: bool = field(
        default=True,
        metadata=_help(
            "Run each sequence (or suffix after the shared prompt) at its own length in the update and scoring "
            "passes, so no token is computed for padding. Same loss and gradients as the padded pass; on a GPU "
            "the padded batch may be faster (turn it off there)."
        ),
    )
    lora_layers: int = field(
        default=0,
        metadata=_help(
            "With LoRA: adapters on the top N decoder layers only (0: every layer). The layers below get no "
            "backward pass at all. Changes what trains, so off by default."
        ),
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise `ConfigError` naming the first invalid field."""
        choices = {"algo": tuple(ESTIMATORS), "aggregation": AGGREGATIONS, "kl_estimator": KL_ESTIMATORS,
                   "gigpo_anchor_state": ANCHOR_STATES, "critic": ("full", "lora")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        positive = (
            "group_size",
            "tasks_per_step",
            "ppo_epochs",
            "num_mini_batches",
            "micro_batch_size",
            "max_new_tokens",
            "max_context_tokens",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        non_negative = (
            "total_steps",
            "step_offset",
            "warmup_steps",
            "eval_every",
            "eval_episodes",
            "save_every",
            "lora_rank",
            "torch_threads",
            "kl_coef",
            "kl_in_reward_coef",
            "entropy_coef",
            "lr",
            "log_rollouts",
            "critic_lr",
            "max_grad_norm",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ConfigError(
                f"clip_low must be in [0, 1) and clip_high >= 0, got {self.clip_low}, {self.clip_high}"
            )
        if self.adapter and self.lora_rank:
            raise ConfigError("adapter continues a saved LoRA adapter (its own rank); drop lora_rank, or adapter")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ConfigError(f"dual_clip must be > 1 (e.g. 3.0) or none, got {self.dual_clip}")
        if self.temperature <= 0:
            raise ConfigError(
                f"temperature must be > 0 for training rollouts (eval is greedy), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ConfigError(f"gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        estimator = ESTIMATORS[self.algo]
        if estimator.needs_groups and self.group_size < 2:
            raise ConfigError(f"algo={self.algo} compares episodes within a group: group_size must be >= 2")
        if self.kl_in_reward_coef > 0 and not estimator.reads_token_rewards:
            token_level = ", ".join(name for name, other in ESTIMATORS.items() if other.reads_token_rewards)
            raise ConfigError(
                f"kl_in_reward_coef acts on token rewards, which algo={self.algo} ignores (it uses episode "
                f"outcomes); use kl_coef (KL in the loss) instead, or a token-level algo ({token_level})"
            )
        if self.max_turns is not None and self.max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1 or none, got {self.max_turns}")
        if self.env_workers < 0 or self.env_step_timeout <= 0:
            raise ConfigError(
                f"env_workers must be >= 0 and env_step_timeout > 0, got {self.env_workers}, {self.env_step_timeout}"
            )
        if self.env_workers > self.rollout_batch_size:
            raise ConfigError(
                f"env_workers={self.env_workers} exceeds the {self.rollout_batch_size} envs of a rollout batch "
                "(tasks_per_step * group_size); use fewer workers"
            )
        if self.max_sampling_rounds < 1 or self.critic_lora_rank < 1:
            raise ConfigError(
                f"max_sampling_rounds and critic_lora_rank must be >= 1, got {self.max_sampling_rounds}, "
                f"{self.critic_lora_rank}"
            )
        if (self.dynamic_sampling or self.balance_by) and self.group_size < 2:
            raise ConfigError(
                "dynamic_sampling and balance_by compare the episodes of a group: group_size must be >= 2"
            )
        if not 0 <= self.gigpo_gamma <= 1:
            raise ConfigError(f"gigpo_gamma must be in [0, 1], got {self.gigpo_gamma}")
        if self.critic == "lora" and (self.gradient_checkpointing or self.lean_activations) and estimator.needs_critic:
            option = "gradient_checkpointing" if self.gradient_checkpointing else "lean_activations"
            raise ConfigError(
                f"critic=lora shares the policy's layers, which {option} would recompute without the critic's "
                f"adapters; use critic=full, or drop {option}"
            )
        if not self.kl_reference.strip():
            raise ConfigError("kl_reference must be base, start or a LoRA adapter directory, got ''")
        if self.critic_init and not estimator.needs_critic:
            raise ConfigError(f"critic_init starts PPO's critic; algo={self.algo} has none")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.lora_layers < 0 or (self.lora_layers and not self.lora_rank):
            raise ConfigError(f"lora_layers needs lora_rank > 0 and must be >= 0, got {self.lora_layers}")

    @property
    def rollout_batch_size(self) -> int:
        return self.tasks_per_step * self.group_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
