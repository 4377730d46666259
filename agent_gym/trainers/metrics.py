"""Training metrics under stable names, written to JSONL and TensorBoard.

A curve can be compared across runs (and with CleanRL-style tools) only if a name means the same thing
everywhere, so every name the trainer logs is a constant here.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agent_gym.episode_summary import summarize_episodes
from agent_gym.jsonl import iter_jsonl
from agent_gym.trainers.losses import PolicyLossOutput, masked_mean
from agent_gym.trainers.trajectory import episode_summary

# --- rollout statistics (training episodes) ---
REWARD = "charts/reward"  # mean episode return
EM = "charts/em"  # exact match of the final answer
F1 = "charts/f1"
TURNS = "charts/turns"  # model turns per episode
TOOL_CALL_VALIDITY = "charts/tool_call_validity"  # valid calls over all calls (agent_gym.episode_summary)
RESPONSE_LENGTH = "charts/response_length"  # model tokens per episode (env tokens excluded)
INFORMATIVE_GROUPS = "charts/informative_groups"  # groups whose returns differ, over groups sampled; + "/<kind>"
SAMPLING_ROUNDS = "charts/sampling_rounds"  # rollouts a step played to fill its batch (dynamic sampling)
# --- losses and optimisation ---
POLICY_LOSS = "losses/policy_loss"
VALUE_LOSS = "losses/value_loss"
APPROX_KL = "losses/approx_kl"  # KL(old || new), k3 estimate, CleanRL's name
CLIPFRAC = "losses/clipfrac"
DUAL_CLIPFRAC = "losses/dual_clipfrac"
VALUE_CLIPFRAC = "losses/value_clipfrac"
ENTROPY = "losses/entropy"  # mean next-token entropy over model tokens (env tokens never count)
KL_REF = "losses/kl_ref"  # KL to the reference model, the estimator chosen in the config
GRAD_NORM = "losses/grad_norm"
ADVANTAGE_MEAN = "losses/advantage_mean"
LEARNING_RATE = "charts/learning_rate"
# --- performance ---
TOKENS_PER_S = "perf/tokens_per_s"  # rollout tokens (model + env) processed per second of the whole step
ROLLOUT_TIME = "perf/rollout_s"
UPDATE_TIME = "perf/update_s"
SAMPLER_LOGPROB_DIFF = "perf/sampler_logprob_abs_diff"  # |sampler - trainer| log-prob, backend mismatch
UPDATE_TOKENS = "perf/update_tokens"  # positions the update's forward ran per optimizer step (shared prefix once)
UPDATE_BF16 = "perf/update_bf16"  # 1 where the update computed in bf16 (autocast), 0 in fp32
RESIDENT_MB = "perf/resident_mb"  # the process's resident memory after the step, its freed heap returned
DROPPED_EPISODES = "perf/dropped_episodes"  # episodes of the step's rollout lost with a dead or hung env worker
# --- held-out evaluation (greedy) ---
EVAL_REWARD = "eval/reward"
EVAL_EM = "eval/em"
EVAL_F1 = "eval/f1"
EVAL_TURNS = "eval/turns"
EVAL_TOOL_CALL_VALIDITY = "eval/tool_call_validity"

METRICS_FILE = "metrics.jsonl"


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


#: the `summarize_episodes` metrics the trainer logs per rollout and per held-out evaluation
LOGGED_EPISODE_METRICS = ("reward", "turns", "em", "f1", "tool_call_validity")


def episode_metrics(trajectories: Iterable[Any], prefix: str = "charts") -> dict[str, float]:
    """`summarize_episodes` of the trajectories' episodes (reward, turns, EM, F1, tool-call validity), under
    ``prefix/``, plus the response length of a rollout (``charts``).

    An episode split into several step-level samples (context rewritten) counts once, by its first sample
    (``info["sample_index"] == 0``); response length averages over all samples. A metric no episode reports is
    left out rather than logged as 0 (EM and F1 are NaN for no episode at all).
    """
    trajectories = list(trajectories)
    summary = summarize_episodes(episode_summary(t) for t in trajectories if t.info.get("sample_index", 0) == 0)
    metrics = {f"{prefix}/{key}": float(summary.get(key, float("nan"))) for key in ("reward", "turns")}
    if prefix == "charts":
        metrics[RESPONSE_LENGTH] = _mean([float(sum(t.loss_mask)) for t in trajectories])
    metrics.update({f"{prefix}/{key}": float(summary[key]) for key in LOGGED_EPISODE_METRICS[2:] if key in summary})
    return metrics


class UpdateStats:
    """The metrics of one optimizer step, summed over its micro-batches.

    Token-averaged metrics weigh each micro-batch by its share of the mini-batch's loss tokens, so they equal the
    mini-batch's own average; entropy and the sampler's log-prob gap average over model tokens whatever the loss
    mask, so runs with it on and off stay comparable.
    """

    def __init__(self, loss_tokens: torch.Tensor, model_tokens: torch.Tensor) -> None:
        """``loss_tokens``: the mini-batch's tokens in the policy loss; ``model_tokens``: those the policy sampled."""
        self._loss_token_count = float(loss_tokens.sum().clamp(min=1.0))
        self._model_token_count = float(model_tokens.sum().clamp(min=1.0))
        self._sums: dict[str, float] = defaultdict(float)

    def add(
        self,
        *,
        loss_tokens: torch.Tensor,
        model_tokens: torch.Tensor,
        policy: PolicyLossOutput,
        entropy: torch.Tensor,
        old_logprobs: torch.Tensor,
        sampling_logprobs: torch.Tensor,
        tokens_computed: int,
        kl: torch.Tensor | None = None,
        value_loss: torch.Tensor | None = None,
        value_clipfrac: torch.Tensor | None = None,
    ) -> None:
        """Add one micro-batch: its tokens in the loss and sampled by the policy, its per-token entropy, KL to the
        reference and log-probs."""
        sums = self._sums
        share = float(loss_tokens.sum()) / self._loss_token_count  # this micro-batch's weight in token averages
        model_tokens = model_tokens.float()
        sums[UPDATE_TOKENS] += tokens_computed
        sums[POLICY_LOSS] += float(policy.loss.detach())
        sums[CLIPFRAC] += share * float(policy.clipfrac)
        sums[APPROX_KL] += share * float(policy.approx_kl)
        sums[DUAL_CLIPFRAC] += share * float(policy.dual_clipfrac)
        sums[ENTROPY] += float((entropy.detach() * model_tokens).sum()) / self._model_token_count
        sums[SAMPLER_LOGPROB_DIFF] += float(
            ((old_logprobs - sampling_logprobs).abs() * model_tokens).sum() / self._model_token_count
        )
        if kl is not None:
            sums[KL_REF] += share * float(masked_mean(kl.detach(), loss_tokens))
        if value_loss is not None:
            sums[VALUE_LOSS] += float(value_loss.detach())
            sums[VALUE_CLIPFRAC] += share * float(value_clipfrac if value_clipfrac is not None else 0.0)

    def result(self, grad_norm: float) -> dict[str, float]:
        """The step's metrics, its gradient norm (before clipping) included."""
        return {**self._sums, GRAD_NORM: float(grad_norm)}


def _step_of(line: str) -> int | None:
    """The step of a JSONL record; None for blank or torn lines (a run killed mid-write)."""
    try:
        return int(json.loads(line)["step"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def drop_records_after(path: Path, step: int) -> None:
    """Keep the records of a JSONL file up to ``step`` (and drop torn lines): a resumed run writes each later step
    again. The file is replaced whole (`_replace_lines`), never truncated in place."""
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if (number := _step_of(line)) is not None and number <= step]
    if kept != lines:
        _replace_lines(path, path.with_name(path.name + ".tmp"), kept)


def _replace_lines(path: Path, temporary: Path, lines: Sequence[str]) -> None:
    """Make ``path`` hold ``lines``, all at once: written to ``temporary``, synced, then renamed over ``path``."""
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            handle.writelines(line + "\n" for line in lines)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


class MetricsLogger:
    """Appends ``{"step", "time", name: value, ...}`` lines to ``metrics.jsonl``, mirrored to TensorBoard.

    On resume from step N, lines logged after step N by the killed run are dropped (and TensorBoard purges
    them), so each step appears once. The kept lines are written to a temporary file that then replaces the
    history, so a run killed during that rewrite leaves the whole history, never a truncated one.
    """

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, resume_step: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        rewrite = self.path.with_name(self.path.name + ".tmp")
        rewrite.unlink(missing_ok=True)  # left by a run killed during its own rewrite; the history is intact
        if resume_step is not None and self.path.exists():
            drop_records_after(self.path, resume_step)
        elif resume_step is None and self.path.exists():
            self.path.unlink()  # a fresh run does not mix with an old one's curves
        self._file = self.path.open("a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self._writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=purge)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write one record; non-finite values are written as null in JSON."""
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        for name, value in metrics.items():
            value = float(value)
            record[name] = value if math.isfinite(value) else None
            if self._writer is not None and math.isfinite(value):
                self._writer.add_scalar(name, value, global_step=step)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All records of a run's ``metrics.jsonl``, in order; a clear error when the file is missing."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {run_dir} an `agent-gym train` output directory?")
    return [record for _, record in iter_jsonl(path.read_text(encoding="utf-8").splitlines(), path)]
