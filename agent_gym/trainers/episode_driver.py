"""One episode of a policy in an env, token in / token out: the one home of the rules of room, cut, pay and truncate.

`EpisodeDriver` holds an episode's token layout (`TokenEpisode`) and its record (`EpisodeSummary`) and decides,
from what the model sampled and what the env returned, how the episode goes on. It does no I/O itself, so each
caller keeps its own way of generating and stepping: the rollout collector batches many drivers' turns into one
`generate` and one env batch per round; verl's agent loop (adapters/verl.py) awaits one server and one env per
episode. Both run the same loop, which `run_episode` spells out for a synchronous policy::

    driver = EpisodeDriver(tokenizer, reset_info, ...)
    while not driver.finished:
        room = driver.room_for_turn()               # None: no budget; 0 ends the episode (cut "context")
        ...generate at most `room` tokens from driver.prompt_ids...
        action = driver.add_turn(ids, logprobs)     # the decoded turn, or None: cut (no room left)
        if action is not None:
            driver.add_step(*env.step(action)[1:])  # pay; then end, cut or take the env's reply
    if driver.awaits_truncation:
        driver.add_truncation(*env.unwrapped.truncate())  # pay what the env's own limit would pay

The episode stops, in this order of checks:

- the context is full before a turn starts: cut, ``"context"``;
- the env ended it (terminated: an answer; truncated: its own limit): it keeps what the env paid;
- the driver's turn cap (``max_turns``): cut, ``"max_turns"``;
- the env's reply leaves no room for one more model token: cut, ``"context"``.

A cut episode with a turn played awaits the env's optional ``truncate() -> (reward, info)``, whose reward goes on
the last turn, so a cut pays what the env pays when its own limit cuts (`ToolEnv`: the outcome without an answer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent_gym.contract import MESSAGES, TOOLS
from agent_gym.env_batch import RolloutError
from agent_gym.episode_summary import EpisodeSummary
from agent_gym.trainers.token_episode import TokenEpisode
from agent_gym.trainers.trajectory import Trajectory

__all__ = ["EpisodeDriver", "run_episode"]


class EpisodeDriver:
    """One episode, driven turn by turn from reset's info (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer, with a chat template.
        reset_info: the env's reset info (its ``messages`` are the first context).
        max_turns: model turns before the driver cuts the episode (None: the env's own limit only).
        max_context_tokens: prompt + response tokens of one step-level sample (None: no limit).
        max_response_tokens: response tokens of one sample (None: no limit).
        render_tools: render reset's ``info["tools"]`` with the chat template (our envs put them in their
            system prompt already).
        stop_token_ids: ids that end a turn (default: the tokenizer's).
        new_sample_on_rewrite: a context rewrite starts a new step-level sample (False: one sequence per
            episode, as verl's output holds).
        task_id: the episode's task id when the env's info names none (e.g. the reset option).
    """

    def __init__(self, tokenizer: Any, reset_info: Mapping[str, Any], *, max_turns: int | None = None,
                 max_context_tokens: int | None = None, max_response_tokens: int | None = None,
                 render_tools: bool = False, stop_token_ids: Sequence[int] | None = None,
                 new_sample_on_rewrite: bool = True, task_id: str = "") -> None:
        messages = reset_info.get(MESSAGES)
        if not messages:
            raise RolloutError("the env returned no info['messages'] from reset (docs/DESIGN.md §2)")
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.tokens = TokenEpisode(
            tokenizer, messages, tools=list(reset_info.get(TOOLS) or []) if render_tools else None,
            stop_token_ids=stop_token_ids, max_context_tokens=max_context_tokens,
            max_response_tokens=max_response_tokens, new_sample_on_rewrite=new_sample_on_rewrite)
        self.summary = EpisodeSummary.from_reset(reset_info)
        if not self.summary.task_id:
            self.summary.task_id = task_id
        self.last_info: dict[str, Any] = dict(reset_info)  # the env's latest info (a truncation's merged in)
        self.finished = False
        self._truncation_settled = False

    @property
    def prompt_ids(self) -> list[int]:
        """The exact token ids the next turn is sampled from: the current sample's prompt and response so far."""
        sample = self.tokens.sample
        return sample.prompt_ids + sample.response_ids

    def room_for_turn(self) -> int | None:
        """Tokens the next turn may hold (None: no budget). With none left, the episode is cut first."""
        room = self.tokens.room
        if room == 0:
            self._cut("context")  # stop: the context is full before the turn starts
        return room

    def add_turn(self, token_ids: Sequence[int], logprobs: Sequence[float] | None = None,
                 finish_reason: str = "stop") -> str | None:
        """Append a sampled turn (cut to the room left); return its text for the env, or None when the episode
        was cut instead (no room left). The text is decoded for the env only: the ids are trained on as they are."""
        kept = self.tokens.add_model_turn(token_ids, logprobs, finish_reason)
        if kept is None:
            self._cut("context")  # stop: no room for a single token of this turn
            return None
        return self.tokenizer.decode(kept, skip_special_tokens=True)

    def add_step(self, reward: float, terminated: bool, truncated: bool, info: Mapping[str, Any]) -> None:
        """Pay the turn's reward, then end the episode, cut it, or append the env's reply."""
        self.tokens.pay(reward)
        self.summary.add_step(reward, terminated, truncated, info)
        self.last_info = dict(info)
        if terminated or truncated:
            self.finished = True  # stop: the env ended it (an answer, or its own limit); nothing to truncate
            return
        if self.max_turns is not None and self.tokens.turns >= self.max_turns:
            self._cut("max_turns")  # stop: the driver's turn cap; the env's truncate() pays
            return
        if not info.get(MESSAGES):
            raise RolloutError("the env returned no info['messages'] from step (docs/DESIGN.md §2)")
        if not self.tokens.add_env_reply(info):
            self._cut("context")  # stop: the env's reply leaves no room for a model token

    @property
    def awaits_truncation(self) -> bool:
        """Cut by the driver with a turn played: the env's ``truncate()`` should pay now."""
        return self.finished and self.tokens.needs_truncation and not self._truncation_settled

    def add_truncation(self, reward: float, info: Mapping[str, Any]) -> None:
        """What the env's ``truncate()`` paid for the cut, on the last turn."""
        self._truncation_settled = True
        self.tokens.pay(reward)
        self.summary.add_truncation(reward, info)
        self.last_info = {**self.last_info, **info}  # the last step's keys (its tool calls) stay

    def skip_truncation(self) -> None:
        """The env has no ``truncate()``: the episode keeps the rewards paid so far."""
        self._truncation_settled = True

    def trajectories(self, group_id: str) -> list[Trajectory]:
        """The episode's step-level samples, each carrying its `EpisodeSummary` (``trajectory.episode``)."""
        return self.tokens.trajectories(group_id, episode=self.summary)

    def _cut(self, reason: str) -> None:
        if self.tokens.cut_reason is None:
            self.tokens.cut(reason)
        self.summary.cut(self.tokens.cut_reason or reason)
        self.finished = True


def run_episode(driver: EpisodeDriver, env: Any, generate: Callable[[list[int], int | None], tuple[Sequence[int],
                Sequence[float] | None]]) -> EpisodeDriver:
    """Play ``driver``'s episode to its end in ``env`` with ``generate(prompt_ids, room) -> (ids, logprobs)``, the
    loop of the module docstring for a synchronous policy (the collector and verl's loop run the same steps with
    their own batching and awaiting)."""
    while not driver.finished:
        room = driver.room_for_turn()
        if driver.finished:
            break
        token_ids, logprobs = generate(driver.prompt_ids, room)
        action = driver.add_turn(token_ids, logprobs)
        if action is not None:
            driver.add_step(*env.step(action)[1:])
    if driver.awaits_truncation:
        truncate = getattr(getattr(env, "unwrapped", env), "truncate", None)
        if callable(truncate):
            driver.add_truncation(*truncate())
        else:
            driver.skip_truncation()
    return driver
