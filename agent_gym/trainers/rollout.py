"""Token-in/token-out multi-turn rollouts of a policy in any env that follows the DESIGN §2 contract.

Each round, every live episode contributes its context (exact token ids) to one batched `generate` call; the
sampled ids and their log-probs are appended verbatim (`loss_mask = 1`), the decoded turns go to the envs,
and each env's new messages are rendered with the chat template as a delta (`loss_mask = 0`).
Model output is never decoded and re-encoded for training (Agent-R1 issue #30: its NaN came from that).
Finished episodes free their env, which starts the next pending episode in the next round.

The round's turns are one batch: the collector resets, steps and truncates its envs through an `EnvBatch`
(env_batch.py), one call per round for each. In-process (`LocalEnvBatch`), the `ToolEnv`s among the envs step
together through `agent_gym.env.step_turns` (one search for all their calls, as `agent-gym eval`'s vector env
does); any other env steps alone. `agent_gym.distributed.RayEnvPool` is the same interface over Ray actors, one
call per actor per batch. An env the batch reports lost (`EnvLost`: its worker died or timed out) has its
episode dropped and counted (`dropped_episodes`); the others go on.

An episode the collector cuts itself (its `max_turns`, or its token budget) is ended through the env's
optional `truncate() -> (reward, info)`, so it pays what the env pays when its own limit cuts an episode
(`ToolEnv`: the outcome without an answer, `format_score - 1` under Agent-R1 Eq. 6). The reward goes on the
episode's last turn. An env without `truncate()` keeps the rewards it paid so far (a warning says so).

When the env rewrites its context (`info["context_rewritten"]`), the episode continues as a new step-level
sample whose prompt is the rewritten `info["messages"]` (Agent-R1 v0.1); all samples of an episode share
its group id and its outcome.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from agent_gym.env_batch import EnvBatch, EnvLost, LocalEnvBatch, ResetResult, RolloutError, StepResult
from agent_gym.models.chat_template import render_delta, render_prompt, turn_stop_token_ids
from agent_gym.trainers.backends.base import Generation, GenerationBackend, SamplingParams
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
class _Sample:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_end_indices: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def append(self, token_ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.response_ids.extend(token_ids)
        if logprobs is None:  # env tokens
            self.loss_mask.extend([0] * len(token_ids))
            self.logprobs.extend([0.0] * len(token_ids))
        else:
            self.loss_mask.extend([1] * len(token_ids))
            self.logprobs.extend(logprobs)


@dataclass
class _Episode:
    env_index: int
    group_id: str
    spec_index: int
    tools: list[dict]
    stop_strings: list[str]
    samples: list[_Sample]
    turns: int = 0
    finished: bool = False
    action: str = ""  # the decoded turn the env is stepped with this round
    ended_with_stop_token: str | None = None  # the turn's last token, decoded, when it is a stop token
    last_info: dict = field(default_factory=dict)
    finish_reasons: list[str] = field(default_factory=list)
    truncated_by: str | None = None
    awaits_truncate: bool = False  # cut by the collector: the env's truncate() pays at the end of the round
    lost: bool = False  # its env's worker died or timed out: dropped, not returned
    tool_calls: int = 0
    tool_calls_ok: int = 0

    def count_tool_calls(self, info: Mapping[str, Any]) -> None:
        for call in info.get("tool_calls") or ():
            if isinstance(call, Mapping) and isinstance(call.get("ok"), bool):
                self.tool_calls += 1
                self.tool_calls_ok += int(call["ok"])


def _reset_kwargs(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """A reset spec: a task id string, or a dict with optional "seed" and "options" (e.g. task_index)."""
    if isinstance(spec, str):
        return {"seed": None, "options": {"task_id": spec}}
    unknown = set(spec) - {"seed", "options"}
    if unknown:
        raise ValueError(f"reset spec has unknown keys {sorted(unknown)}; use 'seed' and 'options'")
    return {"seed": spec.get("seed"), "options": dict(spec.get("options") or {})}


def _unwrap_envs(envs: Any) -> list[Any]:
    if hasattr(envs, "num_envs"):  # a gymnasium VectorEnv: drive its sub-envs one by one
        sub_envs = getattr(envs, "envs", None)
        if sub_envs is None:
            raise TypeError(
                f"{type(envs).__name__} does not expose its sub-envs (.envs); pass a list of envs or a "
                "SyncVectorEnv / agent_gym ToolVectorEnv"
            )
        return list(sub_envs)
    envs = list(envs)
    if not envs:
        raise ValueError("RolloutCollector needs at least one env")
    return envs


class RolloutCollector:
    """Plays many episodes at once with a generation backend; returns token-level `Trajectory` records.

    Args:
        envs: a list of envs (DESIGN §2 contract), or a vector env exposing `.envs` (its sub-envs are stepped
            by the collector, so `ToolVectorEnv` and a list of `ToolEnv`s batch their tool calls alike), or an
            `EnvBatch` (e.g. `agent_gym.distributed.RayEnvPool`); episodes run on them concurrently, one per env
            at a time.
        backend: the `GenerationBackend` that samples turns.
        tokenizer: the policy's tokenizer, with a chat template.
        config: sampling settings and limits.
    """

    def __init__(
        self, envs: Any, backend: GenerationBackend, tokenizer: Any, config: RolloutConfig | None = None
    ) -> None:
        if isinstance(envs, EnvBatch):
            self.env_batch: EnvBatch = envs
            self.envs: list[Any] = []
        else:
            self.envs = _unwrap_envs(envs)
            self.env_batch = LocalEnvBatch(self.envs)
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
            raise ValueError(f"group_size must be >= 1, got {group_size}")
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
                generations = self.backend.generate(
                    [episode.samples[-1].prompt_ids + episode.samples[-1].response_ids for episode in active],
                    params,
                )
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
                episodes.append(_Episode(env_index=env_index, group_id="", spec_index=spec_index, tools=[],
                                         stop_strings=[], samples=[], finished=True, lost=True))
            else:
                episodes.append(self._episode(env_index, spec_index, reset_kwargs[spec_index], reset))
        return episodes

    def _episode(self, env_index: int, spec_index: int, kwargs: dict[str, Any], reset: ResetResult) -> _Episode:
        _, info = reset
        messages = info.get("messages")
        if not messages:
            raise RolloutError(f"env {env_index} returned no info['messages'] from reset (DESIGN §2)")
        tools = list(info.get("tools") or [])
        prompt = render_prompt(self.tokenizer, messages, tools if self.config.render_tools else None)
        task_id = info.get("task_id", kwargs["options"].get("task_id", ""))
        return _Episode(
            env_index=env_index,
            group_id=f"{spec_index}:{task_id}",
            spec_index=spec_index,
            tools=tools,
            stop_strings=list(info.get("stop_strings") or []),
            samples=[_Sample(prompt_ids=prompt)],
            last_info={"task_id": task_id},
        )

    def _record_turn(self, episode: _Episode, generation: Generation) -> bool:
        """Append a sampled turn and decode it for the env; False (episode cut) when the context is full."""
        sample = episode.samples[-1]
        budget = self.config.max_context_tokens - sample.length
        token_ids, logprobs = generation.token_ids[:budget], generation.logprobs[:budget]
        if not token_ids:  # the context is full before the turn starts
            self._cut(episode, "context")
            return False
        sample.append(token_ids, logprobs)
        sample.turn_end_indices.append(len(sample.response_ids) - 1)
        episode.turns += 1
        episode.finish_reasons.append(
            generation.finish_reason if len(token_ids) == len(generation.token_ids) else "context"
        )
        episode.action = self.tokenizer.decode(token_ids, skip_special_tokens=True)  # for the env only
        # Only a stop token can be the start of the template's turn closing (e.g. <|im_end|>).
        last = token_ids[-1]
        episode.ended_with_stop_token = self.tokenizer.decode([last]) if last in self.stop_token_ids else None
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
        episode.finished, episode.lost, episode.awaits_truncate = True, True, False
        self.dropped_episodes += 1

    def _apply_step(self, episode: _Episode, step: StepResult) -> None:
        """Pay the turn's reward, then finish the episode or append the env's reply."""
        _, reward, terminated, truncated, info = step
        sample = episode.samples[-1]
        sample.turn_rewards.append(float(reward))
        episode.last_info = info
        episode.count_tool_calls(info)
        if terminated or truncated:
            episode.finished = True
            episode.truncated_by = "env" if truncated and not terminated else None
            return
        if self.config.max_turns is not None and episode.turns >= self.config.max_turns:
            self._cut(episode, "max_turns")
            return
        messages = info.get("messages")
        if not messages:
            raise RolloutError(f"env {episode.env_index} returned no info['messages'] from step (DESIGN §2)")
        if info.get("context_rewritten"):
            tools = episode.tools if self.config.render_tools else None
            episode.samples.append(_Sample(prompt_ids=render_prompt(self.tokenizer, messages, tools)))
            if episode.samples[-1].length >= self.config.max_context_tokens:
                self._cut(episode, "context")
            return
        new_messages = _messages_after_last_assistant(messages)
        delta = render_delta(self.tokenizer, new_messages, episode.ended_with_stop_token)
        if sample.length + len(delta) >= self.config.max_context_tokens:
            self._cut(episode, "context")
            return
        sample.append(delta, None)

    def _cut(self, episode: _Episode, reason: str) -> None:
        """End an episode the env has not ended; the env's `truncate()` pays at the end of the round (see the
        module docstring), in one batch with the round's other cuts."""
        episode.finished, episode.truncated_by = True, reason
        # No turn sampled: nothing to train on, nothing to pay.
        episode.awaits_truncate = any(sample.turn_end_indices for sample in episode.samples)

    def _truncate_cut(self, episodes: Sequence[_Episode]) -> None:
        """Pay the round's cut episodes what their envs' `truncate()` pays, on each episode's last turn."""
        if not episodes:
            return
        started = time.perf_counter()
        results = self.env_batch.truncate_batch([episode.env_index for episode in episodes])
        self.env_seconds += time.perf_counter() - started
        for episode, result in zip(episodes, results, strict=True):
            episode.awaits_truncate = False
            if isinstance(result, EnvLost):
                self._drop(episode)
            elif result is None:
                self._warn_no_truncate(episode)
            else:
                reward, info = result
                samples = [sample for sample in episode.samples if sample.turn_end_indices]
                samples[-1].turn_rewards[-1] += float(reward)
                episode.last_info = {**episode.last_info, **info}  # the last step's tool calls stay

    def _warn_no_truncate(self, episode: _Episode) -> None:
        if self._warned_no_truncate:
            return
        self._warned_no_truncate = True
        name, reason = self.env_batch.env_name(episode.env_index), episode.truncated_by
        warnings.warn(
            f"{name} has no truncate(): episodes cut by the collector's {reason} limit "
            "end without the outcome the env pays when its own limit cuts them; give the env that "
            "limit (e.g. its max_turns) or a truncate() -> (reward, info) method",
            stacklevel=4,
        )

    def _trajectories(self, episode: _Episode) -> list[Trajectory]:
        outcome = sum(reward for sample in episode.samples for reward in sample.turn_rewards)
        info = _episode_info(episode)
        samples = [sample for sample in episode.samples if sample.turn_end_indices]
        return [
            Trajectory(
                prompt_ids=sample.prompt_ids,
                response_ids=sample.response_ids,
                loss_mask=sample.loss_mask,
                sampling_logprobs=sample.logprobs,
                turn_end_indices=sample.turn_end_indices,
                turn_rewards=sample.turn_rewards,
                outcome=outcome,
                group_id=episode.group_id,
                info={**info, "sample_index": index, "num_samples": len(samples)},
            )
            for index, sample in enumerate(samples)
        ]

    def close(self) -> None:
        """Close the envs and the backend."""
        self.env_batch.close()
        self.backend.close()


def _messages_after_last_assistant(messages: Sequence[dict]) -> list[dict]:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return list(messages[index + 1 :])
    raise RolloutError("the env's info['messages'] holds no assistant message after a step (DESIGN §2)")


def _episode_info(episode: _Episode) -> dict[str, Any]:
    last = episode.last_info
    info: dict[str, Any] = {
        "task_id": last.get("task_id"),
        "turns": episode.turns,
        "finish_reasons": list(episode.finish_reasons),
        "truncated_by": episode.truncated_by,
    }
    for key in ("reward_components", "answer", "gold_answers", "tool_calls"):
        if key in last:
            info[key] = last[key]
    info["episode_tool_calls"] = episode.tool_calls  # every turn's calls ("tool_calls" holds the last step's)
    if episode.tool_calls:
        info["tool_call_validity"] = episode.tool_calls_ok / episode.tool_calls
    components = last.get("reward_components") or {}
    for key in ("em", "f1"):
        if key in components:
            info[key] = components[key]
    return info


def evaluate(
    collector: RolloutCollector, specs: Sequence[Mapping[str, Any] | str], seed: int | None = 0
) -> tuple[dict[str, float], list[Trajectory]]:
    """Greedy episodes on held-out tasks (one per spec); returns mean reward / EM / F1 / turns and the
    trajectories (the first step-level sample of each episode is counted once)."""
    trajectories = collector.collect(specs, group_size=1, greedy=True, seed=seed)
    firsts = [t for t in trajectories if t.info.get("sample_index", 0) == 0]
    if not firsts:
        return {}, trajectories
    metrics = {
        "reward": sum(t.outcome for t in firsts) / len(firsts),
        "turns": sum(t.info["turns"] for t in firsts) / len(firsts),
        "episodes": float(len(firsts)),
    }
    for key in ("em", "f1"):
        values = [float(t.info[key]) for t in firsts if isinstance(t.info.get(key), (int, float))]
        if values:
            metrics[key] = sum(values) / len(values)
    return metrics, trajectories
