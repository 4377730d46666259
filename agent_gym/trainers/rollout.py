"""Token-in/token-out multi-turn rollouts of a policy in any env that follows the docs/DESIGN.md §2 contract.

Each round, every live episode contributes its context (exact token ids) to one batched `generate` call; the
sampled ids and their log-probs are appended verbatim (`loss_mask = 1`), the decoded turns go to the envs,
and each env's new messages (`info["new_messages"]`) are rendered with the chat template as a delta
(`loss_mask = 0`). Model output is never decoded and re-encoded for training (Agent-R1 issue #30: its NaN came
from that). The token layout, its budget and its stop-token rule are `TokenEpisode`'s (token_episode.py), shared
with verl's agent loop and SFT; the collector keeps only the scheduling. Finished episodes free their env, which
starts the next pending episode in the next round.

The round's turns are one batch: the collector resets, steps and truncates its envs through an `EnvBatch`
(agent_gym/env_batch.py), one call per round for each, and takes any env batch as it is: a list of envs
(`LocalEnvBatch`: its `ToolEnv`s step together through `agent_gym.env.step_turns`, one search for all their
calls; any other env steps alone), the native `ToolVectorEnv` (an `EnvBatch` itself), or
`agent_gym.distributed.RayEnvPool` (the same interface over Ray actors, one call per actor per batch). An env
the batch reports lost (`EnvLost`: its worker died or timed out) has its episode dropped and counted
(`dropped_episodes`); the others go on.

An episode the collector cuts itself (its `max_turns`, or its token budget) is ended through the env's
optional `truncate() -> (reward, info)`, so it pays what the env pays when its own limit cuts an episode
(`ToolEnv`: the outcome without an answer, `format_score - 1` under Agent-R1 Eq. 6). The reward goes on the
episode's last turn. An env without `truncate()` keeps the rewards it paid so far (a warning says so).

When the env rewrites its context (`info["context_rewritten"]`), the episode continues as a new step-level
sample whose prompt is the rewritten `info["messages"]` (Agent-R1 v0.1); all samples of an episode share
its group id and its outcome. Episode statistics (tool-call validity, EM, how it ended...) are `EpisodeSummary`'s,
which every trajectory of the episode carries as it is (`trajectory.episode`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from agent_gym.contract import MESSAGES, STOP_STRINGS
from agent_gym.env_batch import EnvBatch, EnvLost, ResetResult, RolloutError, StepResult, as_env_batch
from agent_gym.episode_summary import summarize_episodes
from agent_gym.error import InvalidValue
from agent_gym.models.chat_template import turn_stop_token_ids
from agent_gym.trainers.backends.base import Generation, GenerationBackend, SamplingParams
from agent_gym.trainers.episode_driver import EpisodeDriver
from agent_gym.trainers.trajectory import Trajectory

__all__ = ["RolloutCollector", "RolloutConfig", "RolloutError", "evaluate"]


@dataclass
class RolloutConfig:
    """Sampling settings and the limits of one episode."""

    max_new_tokens: int = 256  # per turn
    max_turns: int | None = None  # model turns per episode (a cut pays the env's truncate()); None: the env's
    max_context_tokens: int = 4096  # prompt + response tokens of one step-level sample
    temperature: float = 1.0
    top_p: float = 1.0
    # Our envs put the tool instructions in their system prompt already; set True for envs that rely on the
    # chat template to render info["tools"] (Qwen2.5's native way).
    render_tools: bool = False
    extra_stop_token_ids: tuple[int, ...] = ()
    show_progress: bool = True


@dataclass
class _Episode:
    """One episode's scheduling state; the rules of its play (room, cut, pay, truncate) are its `EpisodeDriver`'s."""

    env_index: int
    group_id: str
    spec_index: int
    stop_strings: list[str]
    driver: EpisodeDriver | None  # None for an episode whose env was lost at reset
    finished: bool = False
    action: str = ""  # the decoded turn the env is stepped with this round
    lost: bool = False  # its env's worker died or timed out: dropped, not returned

    @property
    def awaits_truncate(self) -> bool:
        """Cut by the collector: the env's truncate() pays at the end of the round."""
        return not self.lost and self.driver is not None and self.driver.awaits_truncation


def _reset_kwargs(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """A reset spec: a task id string, or a dict with optional "seed" and "options" (e.g. task_index)."""
    if isinstance(spec, str):
        return {"seed": None, "options": {"task_id": spec}}
    unknown = set(spec) - {"seed", "options"}
    if unknown:
        raise InvalidValue(f"reset spec has unknown keys {sorted(unknown)}; use 'seed' and 'options'")
    return {"seed": spec.get("seed"), "options": dict(spec.get("options") or {})}


class RolloutCollector:
    """Plays many episodes at once with a generation backend; returns token-level `Trajectory` records.

    Args:
        envs: an env batch (`agent_gym.env_batch.as_env_batch`): a list of envs (docs/DESIGN.md §2 contract), a vector
            env (`ToolVectorEnv` is an `EnvBatch` itself; a Gymnasium `SyncVectorEnv` lends its sub-envs), or
            any `EnvBatch` (e.g. `agent_gym.distributed.RayEnvPool`); episodes run on them concurrently, one per
            env at a time.
        backend: the `GenerationBackend` that samples turns.
        tokenizer: the policy's tokenizer, with a chat template.
        config: sampling settings and limits.
    """

    def __init__(
        self, envs: Any, backend: GenerationBackend, tokenizer: Any, config: RolloutConfig | None = None
    ) -> None:
        self.env_batch: EnvBatch = as_env_batch(envs)
        self.envs: list[Any] = list(getattr(self.env_batch, "envs", None) or [])  # in-process envs, if any
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config or RolloutConfig()
        self.stop_token_ids = sorted({*turn_stop_token_ids(tokenizer), *self.config.extra_stop_token_ids})
        self.env_seconds = 0.0  # wall time spent inside the envs (reset, step, tool calls), over all collects
        self.dropped_episodes = 0  # episodes whose env was lost (EnvLost), over all collects
        self._warned_no_truncate = False

    def collect(
        self,
        specs: Sequence[Mapping[str, Any] | str],
        group_size: int = 1,
        greedy: bool = False,
        seed: int | None = None,
    ) -> list[Trajectory]:
        """Play `group_size` episodes of each reset spec; return their step-level samples.

        Args:
            specs: one per task: a task id, or `{"seed": ..., "options": {...}}` passed to `env.reset`.
            group_size: episodes per spec; they share a `group_id` (GRPO / RLOO groups).
            greedy: sample at temperature 0 (evaluation).
            seed: sampling seed (round r uses seed + r), for reproducible rollouts.
        """
        if group_size < 1:
            raise InvalidValue(f"group_size must be >= 1, got {group_size}")
        reset_kwargs = [_reset_kwargs(spec) for spec in specs]
        pending = [(index, member) for index in range(len(reset_kwargs)) for member in range(group_size)]
        pending.reverse()  # pop() from the end keeps spec order
        free_envs = list(range(self.env_batch.num_envs))[::-1]
        active: list[_Episode] = []
        done: list[_Episode] = []
        progress = tqdm(
            total=len(pending), desc="rollout", unit="ep", disable=not self.config.show_progress, leave=False
        )
        round_index = tokens = 0
        try:
            while pending or active:
                starting = []
                while pending and free_envs:
                    spec_index, _ = pending.pop()
                    starting.append((free_envs.pop(), spec_index))
                for episode in self._start(starting, reset_kwargs):
                    if episode.lost:
                        free_envs.append(episode.env_index)
                        progress.update(1)
                    else:
                        active.append(episode)
                if not active:
                    continue
                params = SamplingParams(
                    max_new_tokens=self.config.max_new_tokens,
                    temperature=0.0 if greedy else self.config.temperature,
                    top_p=1.0 if greedy else self.config.top_p,
                    stop_token_ids=self.stop_token_ids,
                    stop_strings=sorted({stop for episode in active for stop in episode.stop_strings}),
                    seed=None if seed is None else seed + round_index,
                )
                # episodes mostly end together, so the count alone sits at 0 for minutes on a CPU: show the turn
                progress.set_postfix_str(f"turn {round_index + 1} of {len(active)} episodes, {tokens} tokens")
                # No room check before generating: a turn is cut to the room left by `add_turn` (the batch's
                # composition, and so its sampling, stays what it was).
                generations = self.backend.generate([episode.driver.prompt_ids for episode in active], params)
                round_index += 1
                tokens += sum(len(generation.token_ids) for generation in generations)
                progress.set_postfix_str(f"turn {round_index} done, {tokens} tokens")
                stepping = [
                    episode
                    for episode, generation in zip(active, generations, strict=True)
                    if self._record_turn(episode, generation)
                ]
                for episode, step in zip(stepping, self._step_envs(stepping), strict=True):
                    if isinstance(step, EnvLost):
                        self._drop(episode)
                    else:
                        self._apply_step(episode, step)
                self._truncate_cut([episode for episode in active if episode.awaits_truncate])
                for episode in [episode for episode in active if episode.finished]:
                    active.remove(episode)
                    free_envs.append(episode.env_index)
                    if not episode.lost:
                        done.append(episode)
                    progress.update(1)
        finally:
            progress.close()
            # Every episode has ended: the KV kept for their next turns is dead, and on SmolLM2 it holds up to
            # the backend's budget (1 GB) beside the update's activations.
            self.backend.release_cache()
        done.sort(key=lambda episode: episode.spec_index)
        return [trajectory for episode in done for trajectory in self._trajectories(episode)]

    def _start(self, starting: Sequence[tuple[int, int]], reset_kwargs: Sequence[dict[str, Any]]) -> list[_Episode]:
        """Reset the envs of `starting` ((env index, spec index) pairs) in one batch; an episode whose env is
        lost comes back dropped (`lost`)."""
        if not starting:
            return []
        started = time.perf_counter()
        resets = self.env_batch.reset_batch(
            [env_index for env_index, _ in starting], [reset_kwargs[spec_index] for _, spec_index in starting]
        )
        self.env_seconds += time.perf_counter() - started
        episodes = []
        for (env_index, spec_index), reset in zip(starting, resets, strict=True):
            if isinstance(reset, EnvLost):
                self.dropped_episodes += 1
                episodes.append(_Episode(env_index=env_index, group_id="", spec_index=spec_index, stop_strings=[],
                                         driver=None, finished=True, lost=True))
            else:
                episodes.append(self._episode(env_index, spec_index, reset_kwargs[spec_index], reset))
        return episodes

    def _episode(self, env_index: int, spec_index: int, kwargs: dict[str, Any], reset: ResetResult) -> _Episode:
        _, info = reset
        if not info.get(MESSAGES):
            raise RolloutError(f"env {env_index} returned no info['messages'] from reset (docs/DESIGN.md §2)")
        config = self.config
        driver = EpisodeDriver(self.tokenizer, info, max_turns=config.max_turns,
                               max_context_tokens=config.max_context_tokens, render_tools=config.render_tools,
                               stop_token_ids=self.stop_token_ids,
                               task_id=str(kwargs["options"].get("task_id", "")))  # an env that names no task
        return _Episode(
            env_index=env_index,
            group_id=f"{spec_index}:{driver.summary.task_id}",
            spec_index=spec_index,
            stop_strings=list(info.get(STOP_STRINGS) or []),
            driver=driver,
        )

    def _record_turn(self, episode: _Episode, generation: Generation) -> bool:
        """Append a sampled turn and decode it for the env; False (episode cut) when the context is full."""
        action = episode.driver.add_turn(generation.token_ids, generation.logprobs, generation.finish_reason)
        if action is None:
            episode.finished = True
            return False
        episode.action = action
        return True

    def _step_envs(self, episodes: Sequence[_Episode]) -> list[StepResult | EnvLost]:
        """Step each episode's env with its turn, all in one batch (see the module docstring)."""
        if not episodes:
            return []
        started = time.perf_counter()
        steps = self.env_batch.step_batch(
            [episode.env_index for episode in episodes], [episode.action for episode in episodes]
        )
        self.env_seconds += time.perf_counter() - started
        return steps

    def _drop(self, episode: _Episode) -> None:
        """Its env was lost: the episode ends, is counted, and yields no trajectory."""
        episode.finished, episode.lost = True, True
        self.dropped_episodes += 1

    def _apply_step(self, episode: _Episode, step: StepResult) -> None:
        """The driver pays the turn's reward, then ends the episode, cuts it, or appends the env's reply."""
        _, reward, terminated, truncated, info = step
        try:
            episode.driver.add_step(reward, terminated, truncated, info)
        except RolloutError as error:
            raise RolloutError(f"env {episode.env_index}: {error}") from error
        episode.finished = episode.driver.finished

    def _truncate_cut(self, episodes: Sequence[_Episode]) -> None:
        """Pay the round's cut episodes what their envs' `truncate()` pays, in one batch (see the module
        docstring)."""
        if not episodes:
            return
        started = time.perf_counter()
        results = self.env_batch.truncate_batch([episode.env_index for episode in episodes])
        self.env_seconds += time.perf_counter() - started
        for episode, result in zip(episodes, results, strict=True):
            if isinstance(result, EnvLost):
                self._drop(episode)
            elif result is None:
                episode.driver.skip_truncation()
                self._warn_no_truncate(episode)
            else:
                episode.driver.add_truncation(*result)

    def _warn_no_truncate(self, episode: _Episode) -> None:
        if self._warned_no_truncate:
            return
        self._warned_no_truncate = True
        name, reason = self.env_batch.env_name(episode.env_index), episode.driver.summary.truncated_by
        warnings.warn(
            f"{name} has no truncate(): episodes cut by the collector's {reason} limit "
            "end without the outcome the env pays when its own limit cuts them; give the env that "
            "limit (e.g. its max_turns) or a truncate() -> (reward, info) method",
            stacklevel=4,
        )

    def _trajectories(self, episode: _Episode) -> list[Trajectory]:
        return episode.driver.trajectories(episode.group_id)

    def close(self) -> None:
        """Close the envs and the backend."""
        self.env_batch.close()
        self.backend.close()


def evaluate(
    collector: RolloutCollector, specs: Sequence[Mapping[str, Any] | str], seed: int | None = 0
) -> tuple[dict[str, float], list[Trajectory]]:
    """Greedy episodes on held-out tasks (one per spec); returns their metrics (`summarize_episodes`: mean
    reward, EM, F1, turns, tool-call validity, ...) and the trajectories (an episode split into step-level
    samples is counted once)."""
    trajectories = collector.collect(specs, group_size=1, greedy=True, seed=seed)
    episodes = [t.episode for t in trajectories if t.info.get("sample_index", 0) == 0]
    if not episodes:
        return {}, trajectories
    return summarize_episodes(episodes), trajectories
