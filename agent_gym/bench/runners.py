"""One runner per library of ``agent-gym bench``, each in its own process (``agent_gym.cli.bench_runner``).

Every runner gets the same :class:`BenchSettings`: the env and its held-out env, the training budget in env
episodes, the evaluation schedule and held-out tasks, and (for the LLM libraries) the same starting model and
sampling limits. It appends :class:`~agent_gym.bench.report.BenchRecord` lines to its own JSONL file. Held-out
evaluation is the same for every LLM library: our greedy ``RolloutCollector`` over held-out tasks
``0..eval_tasks-1`` with that library's current weights; the scripted and SB3 policies play the same tasks.
"""

from __future__ import annotations

import json
import math
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_gym import __version__
from agent_gym.bench.report import BenchRecord
from agent_gym.error import InvalidValue

__all__ = ["DEFAULT_PEER_PYTHON", "BenchConfig", "BenchSettings", "RUNNERS", "run"]


@dataclass
class BenchSettings:
    """What every library of one bench run shares."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "test"})
    episodes: int = 64  # training budget, in env episodes
    eval_every: int = 32  # training episodes between held-out evaluations
    eval_tasks: int = 32  # held-out tasks 0..eval_tasks-1, one greedy episode each
    model: str = ""  # the LLM libraries' starting model (a Hugging Face directory)
    tasks_per_step: int = 4
    group_size: int = 4
    max_new_tokens: int = 48
    max_turns: int = 4
    max_context_tokens: int = 2048
    lr: float = 1e-4
    threads: int = 1

    @property
    def batch(self) -> int:
        return self.tasks_per_step * self.group_size

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.episodes / self.batch))


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class _Log:
    """Appends records to the runner's JSONL file as they happen (a killed run keeps what it measured)."""

    def __init__(self, path: Path, library: str, version: str, seed: int) -> None:
        self.path, self.library, self.version, self.seed = path, library, version, seed
        self.started = time.perf_counter()

    def write(self, episodes: int, evaluation: dict[str, float], *, train_reward: float | None = None,
              tokens: int | None = None, final: bool = False) -> None:
        record = BenchRecord(
            library=self.library, version=self.version, seed=self.seed, episodes=episodes,
            wall_s=time.perf_counter() - self.started, train_reward=train_reward, eval_em=evaluation.get("em"),
            eval_f1=evaluation.get("f1"), tokens=tokens, final=final,
            peak_rss_mb=_peak_rss_mb() if final else None,
        )
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(record.to_json() + "\n")


def _eval_due(before: int, after: int, settings: BenchSettings) -> bool:
    return after >= settings.episodes or after // settings.eval_every > before // settings.eval_every


def _collector_evaluation(settings: BenchSettings, model: Any, tokenizer: Any, seed: int) -> Callable[[], dict]:
    """Greedy held-out episodes with our collector and the given (live) model: the LLM libraries' shared judge."""
    from agent_gym.make import make_env
    from agent_gym.trainers.backends import TransformersBackend
    from agent_gym.trainers.rollout import RolloutCollector, RolloutConfig, evaluate

    kwargs = {**settings.env_kwargs, **settings.eval_env_kwargs}
    envs = [make_env(settings.env_id, kwargs) for _ in range(min(settings.eval_tasks, 16))]
    config = RolloutConfig(max_new_tokens=settings.max_new_tokens, max_turns=settings.max_turns,
                           max_context_tokens=settings.max_context_tokens, show_progress=False)
    collector = RolloutCollector(envs, TransformersBackend(model, tokenizer), tokenizer, config)
    specs = [{"seed": index, "options": {"task_index": index}} for index in range(settings.eval_tasks)]

    def run_evaluation() -> dict:
        metrics, _ = evaluate(collector, specs, seed=seed)
        return metrics

    return run_evaluation


# ---------------------------------------------------------------------------------------------- ours


def _run_ours(algo: str) -> Callable[[BenchSettings, int, Path], None]:
    def run_ours(settings: BenchSettings, seed: int, out: Path) -> None:
        from agent_gym.trainers import metrics as m
        from agent_gym.trainers.config import TrainConfig
        from agent_gym.trainers.trainer import Trainer

        with tempfile.TemporaryDirectory(prefix="bench-ours-") as scratch:
            config = TrainConfig(
                model=settings.model, env_id=settings.env_id, env_kwargs=dict(settings.env_kwargs),
                eval_env_kwargs=dict(settings.eval_env_kwargs), algo=algo, group_size=settings.group_size,
                tasks_per_step=settings.tasks_per_step, total_steps=settings.steps,
                max_new_tokens=settings.max_new_tokens, max_turns=settings.max_turns,
                max_context_tokens=settings.max_context_tokens, lr=settings.lr, kl_coef=0.0, eval_every=0,
                save_every=0, resume="never", output_dir=scratch, tensorboard=False, show_progress=False,
                torch_threads=settings.threads, device="cpu", seed=seed, eval_episodes=settings.eval_tasks,
            )
            trainer = Trainer(config)
            evaluation = _collector_evaluation(settings, trainer.model, trainer.tokenizer, seed)
            log = _Log(out, f"ours-{algo}", __version__, seed)
            log.write(0, evaluation())
            episodes = tokens = 0
            for step in range(settings.steps):
                metrics = trainer.train_step()
                # the mean model tokens per sample, times the samples (one per episode with the default context)
                tokens += round(metrics[m.RESPONSE_LENGTH] * settings.batch)
                before, episodes = episodes, episodes + settings.batch
                if _eval_due(before, episodes, settings):
                    log.write(episodes, evaluation(), train_reward=metrics[m.REWARD], tokens=tokens,
                              final=step == settings.steps - 1)
            trainer.close()

    return run_ours


# ---------------------------------------------------------------------------------------------- TRL


def run_trl_grpo(settings: BenchSettings, seed: int, out: Path) -> None:
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agent_gym.adapters.trl import RolloutFunc, env_reward
    from agent_gym.make import make_env
    from agent_gym.trainers.rollout import RolloutConfig

    torch.set_num_threads(settings.threads)
    model = AutoModelForCausalLM.from_pretrained(settings.model)
    tokenizer = AutoTokenizer.from_pretrained(settings.model)
    rollout = RolloutFunc(settings.env_id, num_envs=settings.batch, config=RolloutConfig(
        max_new_tokens=settings.max_new_tokens, max_turns=settings.max_turns,
        max_context_tokens=settings.max_context_tokens, show_progress=False), **settings.env_kwargs)
    task_count = len(getattr(make_env(settings.env_id, settings.env_kwargs).unwrapped, "tasks", ())) or 256
    dataset = rollout.dataset(min(task_count, 512))
    evaluation = _collector_evaluation(settings, model, tokenizer, seed)
    log = _Log(out, "trl-grpo", trl.__version__, seed)
    state = {"episodes": 0, "tokens": 0}

    class BenchCallback(TrainerCallback):
        def on_step_end(self, args: Any, trainer_state: Any, control: Any, **kwargs: Any) -> None:
            trajectories = rollout.last_trajectories
            state["tokens"] += sum(sum(t.loss_mask) for t in trajectories)
            before = state["episodes"]
            state["episodes"] += settings.batch
            if _eval_due(before, state["episodes"], settings):
                reward = sum(t.outcome for t in trajectories) / max(len(trajectories), 1)
                model.eval()
                log.write(state["episodes"], evaluation(), train_reward=reward, tokens=state["tokens"],
                          final=trainer_state.global_step >= settings.steps)
                model.train()

    with tempfile.TemporaryDirectory(prefix="bench-trl-") as scratch:
        config = GRPOConfig(
            output_dir=scratch, per_device_train_batch_size=settings.batch, gradient_accumulation_steps=1,
            num_generations=settings.group_size, num_iterations=1, max_steps=settings.steps,
            max_completion_length=settings.max_context_tokens, learning_rate=settings.lr,
            lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2,
            loss_type="dapo",  # token-mean over the batch, as our trainer's default aggregation
            temperature=1.0, top_p=1.0, use_cpu=True, bf16=False, gradient_checkpointing=False,
            report_to="none", logging_steps=10_000, save_strategy="no", disable_tqdm=True, seed=seed,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=config, processing_class=tokenizer,
                              train_dataset=dataset, rollout_func=rollout, callbacks=[BenchCallback()])
        model.eval()
        log.write(0, evaluation())
        model.train()
        trainer.train()


# ---------------------------------------------------------------------------------------------- SB3


def _run_sb3(maskable: bool) -> Callable[[BenchSettings, int, Path], None]:
    def run_sb3(settings: BenchSettings, seed: int, out: Path) -> None:
        import stable_baselines3
        import torch
        from stable_baselines3.common.callbacks import BaseCallback

        from agent_gym.adapters.candidate_actions import CandidateActionWrapper
        from agent_gym.make import make_env

        torch.set_num_threads(settings.threads)
        env = CandidateActionWrapper(make_env(settings.env_id, settings.env_kwargs))
        eval_env = CandidateActionWrapper(make_env(settings.env_id, {**settings.env_kwargs,
                                                                       **settings.eval_env_kwargs}))
        if maskable:
            from sb3_contrib import MaskablePPO as algorithm
            from sb3_contrib import __version__ as version
        else:
            from stable_baselines3 import PPO as algorithm

            version = stable_baselines3.__version__
        model = algorithm("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=4, learning_rate=3e-4, seed=seed,
                          verbose=0)

        def evaluation() -> dict:
            from agent_gym.episode_summary import EpisodeSummary, summarize_episodes

            episodes = []
            for index in range(settings.eval_tasks):
                observation, info = eval_env.reset(seed=index, options={"task_index": index})
                episode = EpisodeSummary.from_reset(info)
                done = False
                while not done:
                    kwargs = {"action_masks": eval_env.action_masks()} if maskable else {}
                    action, _ = model.predict(observation, deterministic=True, **kwargs)
                    observation, reward, terminated, truncated, info = eval_env.step(int(action))
                    episode.add_step(reward, terminated, truncated, info)
                    done = terminated or truncated
                episodes.append(episode)
            return summarize_episodes(episodes)  # the metric vocabulary of every other runner

        log = _Log(out, "sb3-maskable-ppo" if maskable else "sb3-ppo", version, seed)

        class Budget(BaseCallback):
            """Stops at the episode budget; evaluates on the bench's schedule."""

            def __init__(self) -> None:
                super().__init__()
                self.episodes, self.returns, self.current = 0, [], 0.0

            def _on_step(self) -> bool:
                self.current += float(self.locals["rewards"][0])
                if not self.locals["dones"][0]:
                    return True
                self.returns.append(self.current)
                self.current = 0.0
                before, self.episodes = self.episodes, self.episodes + 1
                if _eval_due(before, self.episodes, settings):
                    final = self.episodes >= settings.episodes
                    reward = sum(self.returns) / len(self.returns)
                    log.write(self.episodes, evaluation(), train_reward=reward, final=final)
                    self.returns = []
                    return not final
                return True

        log.write(0, evaluation())
        model.learn(total_timesteps=settings.episodes * 64, callback=Budget())  # stopped by the episode budget

    return run_sb3


# ---------------------------------------------------------------------------------------------- scripted


def _run_scripted(name: str) -> Callable[[BenchSettings, int, Path], None]:
    def run_scripted(settings: BenchSettings, seed: int, out: Path) -> None:
        from agent_gym.evaluation import evaluate, summarize
        from agent_gym.make import make_env
        from agent_gym.policies import make_policy

        env = make_env(settings.env_id, {**settings.env_kwargs, **settings.eval_env_kwargs})
        log = _Log(out, name, __version__, seed)
        summary = summarize(evaluate(env, make_policy(name, seed=seed), settings.eval_tasks, seed=seed,
                                     progress=False))
        # A scripted policy does not learn: the same held-out score at the start and at the end of the budget.
        log.write(0, summary)
        log.write(settings.episodes, summary, final=True)

    return run_scripted


RUNNERS: dict[str, Callable[[BenchSettings, int, Path], None]] = {
    "ours-grpo": _run_ours("grpo"),
    "ours-ppo": _run_ours("ppo"),
    "ours-reinforce_pp": _run_ours("reinforce_pp"),
    "trl-grpo": run_trl_grpo,
    "sb3-ppo": _run_sb3(maskable=False),
    "sb3-maskable-ppo": _run_sb3(maskable=True),
    "random": _run_scripted("random"),
    "oracle": _run_scripted("oracle"),
    "naive-rag": _run_scripted("naive-rag"),
}

DEFAULT_PEER_PYTHON = ".venv-peers/bin/python"


@dataclass(kw_only=True)
class BenchConfig:
    """The settings of ``agent-gym bench`` (its flags come from these fields, beside the env kwargs): which
    libraries, how many seeds, and the shared budget that becomes each run's :class:`BenchSettings`."""

    env: str = field(metadata={"required": True, "help": "environment id, e.g. AgentR1-SynthHop-v0"})
    libraries: str = field(default="ours-grpo,trl-grpo,sb3-ppo,random,oracle", metadata={
        "help": f"comma-separated, from: {', '.join(RUNNERS)}"})
    episodes: int = field(default=64, metadata={"help": "training budget of every library, in env episodes"})
    seeds: int = field(default=2, metadata={"help": "seeds per library (0..K-1)"})
    eval_every: int = field(default=32, metadata={"help": "training episodes between held-out evaluations"})
    eval_tasks: int = field(default=32, metadata={"help": "held-out tasks, one greedy episode each"})
    eval_env_kwargs: str = field(default='{"split": "test"}', metadata={
        "metavar": "JSON", "help": "overrides of the env kwargs for the held-out env"})
    model: str | None = field(default=None, metadata={
        "help": "starting model of the LLM libraries (default: build a tiny one and warm-start it)"})
    sft_episodes: int = field(default=256, metadata={"help": "scripted episodes of the default warm start"})
    tasks_per_step: int = field(default=4, metadata={"help": "tasks per update step of the LLM libraries"})
    group_size: int = field(default=4, metadata={"help": "episodes per task in one update step (GRPO's group)"})
    max_new_tokens: int = field(default=48, metadata={"help": "token budget of one model turn"})
    max_turns: int = field(default=4, metadata={"help": "turns per episode"})
    lr: float = field(default=1e-4, metadata={"help": "learning rate of the LLM libraries"})
    peer_python: str = field(default=DEFAULT_PEER_PYTHON, metadata={
        "help": "interpreter of the venv that holds TRL (scripts/make_peer_venv.sh)"})
    out: str = field(default="runs/bench", metadata={
        "help": "directory for results.jsonl, table.md, curves.png"})


def run(library: str, settings: BenchSettings, seed: int, out: str | Path) -> None:
    """Run one library for one seed, appending its records to ``out``."""
    if library not in RUNNERS:
        raise InvalidValue(f"unknown library {library!r}; choose from {', '.join(RUNNERS)}")
    RUNNERS[library](settings, seed, Path(out))


def settings_json(settings: BenchSettings) -> str:
    return json.dumps(asdict(settings))

