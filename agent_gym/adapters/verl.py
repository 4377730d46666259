"""verl's multi-turn rollout on any agent-gym env: an ``AgentLoopBase`` registered as ``agent_gym`` (verl 0.9.1).

verl's ``AgentLoopWorker`` runs one ``AgentLoop.run(sampling_params, **row)`` coroutine per sample of a batch,
each asking verl's server manager (vLLM or SGLang behind ``LLMServerClient``) for tokens. ``AgentGymAgentLoop``
plays one episode of the row's env in it, token in / token out, laid out by the `TokenEpisode` that our own
`RolloutCollector` uses (agent_gym/trainers/token_episode.py):

1. it makes the env (``gymnasium.make(row["extra_info"]["env_id"], **env_kwargs)``) and resets it on the row's
   task; the prompt is the env's own ``info["messages"]``, rendered with the chat template;
2. each turn, ``server_manager.generate(prompt_ids=prompt + response so far)`` samples token ids and their
   log-probs, which are appended verbatim with ``loss_mask = 1``; the env is stepped with their decoded
   text (decoded for the env only: model tokens are never re-encoded);
3. the env's new messages (tool results, or feedback on a malformed turn) are rendered as a chat-template delta
   and appended with ``loss_mask = 0``;
4. the episode ends when the env ends it, at ``multi_turn.max_assistant_turns``, or when ``response_length``
   is spent (then the env's optional ``truncate()`` pays what its own limit would): the rules are
   `EpisodeDriver`'s (agent_gym/trainers/episode_driver.py), the very ones our collector drives.

Mask names: our ``loss_mask`` (1 on model-sampled tokens) is verl's ``response_mask``; our ``response_mask``
(every response token) has no verl field, it is the response itself. The mapping is written in `_output`, once.

The ``AgentLoopOutput`` carries ``reward_score`` = the episode's return (the sum of the env's rewards, Agent-R1
Eq. 6 under the default reward spec), so verl needs no reward function; ``extra_fields`` carry the per-turn
rewards (``turn_scores``) and the env's ``reward_components`` (also as ``reward_extra_info``, which verl logs).

Rows come from ``agent-gym data export-verl ID --split train`` (``agent_gym.adapters.verl_dataset``). Per-turn
sampling: the row's ``extra_info["max_tokens_per_turn"]`` (default 1024, the Agent-R1 recipe's per-turn budget),
the env's ``stop_strings`` (kept in the output, ``include_stop_str_in_output``) and the tokenizer's end-of-turn
ids. Importing this module registers the loop; verl's workers import it through the file named by
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (examples/verl/agent_loops.yaml).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from agent_gym.contract import REWARD_COMPONENTS, STOP_STRINGS
from agent_gym.error import InvalidValue
from agent_gym.models.chat_template import turn_stop_token_ids
from agent_gym.trainers.episode_driver import EpisodeDriver

__all__ = ["AGENT_NAME", "AgentGymAgentLoop"]

AGENT_NAME = "agent_gym"
DEFAULT_MAX_TOKENS_PER_TURN = 1024  # the Agent-R1 GRPO recipe: data.max_response_length_single_turn=1024


def _json_field(value: Any) -> dict[str, Any]:
    """A row field that holds a mapping: a dict, or its JSON text (parquet keeps nested kwargs as text)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        raise InvalidValue(f"expected a mapping (or its JSON), got {type(value).__name__}")
    return dict(value)


@register(AGENT_NAME)
class AgentGymAgentLoop(AgentLoopBase):
    """Plays one episode of an agent-gym env inside verl's rollout; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        multi_turn = self.rollout_config.get("multi_turn", None) or {}
        self.max_assistant_turns = multi_turn.get("max_assistant_turns", None)
        self.render_tools = False  # our envs put the tool protocol in their system prompt
        self.stop_token_ids = turn_stop_token_ids(self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra_info = _json_field(kwargs.get("extra_info"))
        env_id = extra_info.get("env_id")
        if not env_id:
            raise InvalidValue("the row's extra_info names no env_id; make rows with `agent-gym data export-verl`")
        env_kwargs = _json_field(extra_info.get("env_kwargs"))
        reset_options = {key: extra_info[key] for key in ("task_id", "task_index") if key in extra_info}
        max_tokens_per_turn = int(extra_info.get("max_tokens_per_turn") or DEFAULT_MAX_TOKENS_PER_TURN)
        loop = asyncio.get_running_loop()
        env = await loop.run_in_executor(None, lambda: self._make_env(env_id, env_kwargs))
        try:
            return await self._play(env, reset_options, extra_info.get("seed"), sampling_params, max_tokens_per_turn)
        finally:
            await loop.run_in_executor(None, env.close)

    @staticmethod
    def _make_env(env_id: str, env_kwargs: dict[str, Any]) -> Any:
        from agent_gym.make import make_env

        return make_env(env_id, env_kwargs)

    async def _play(self, env: Any, reset_options: dict[str, Any], seed: Any, sampling_params: dict[str, Any],
                    max_tokens_per_turn: int) -> AgentLoopOutput:
        loop = asyncio.get_running_loop()
        _, info = await loop.run_in_executor(
            None, lambda: env.reset(seed=None if seed is None else int(seed), options=reset_options))
        # The rules of room, cut, pay and truncate are the driver's, as in our own RolloutCollector; one sequence
        # per episode: verl's output has one response, so a context rewrite appends its reply too.
        driver = EpisodeDriver(self.tokenizer, info, max_turns=self.max_assistant_turns or None,
                               max_response_tokens=self.response_length, render_tools=self.render_tools,
                               stop_token_ids=self.stop_token_ids, new_sample_on_rewrite=False,
                               task_id=str(reset_options.get("task_id", "")))
        stops = sorted(set(info.get(STOP_STRINGS) or []))
        metrics: dict[str, float] = {"generate_sequences": 0.0, "tool_calls": 0.0}
        request_id = uuid4().hex  # one per episode: the server keeps its prefix cache across turns
        while not driver.finished:
            room = driver.room_for_turn()
            if driver.finished:  # no room left for a turn
                break
            params = {**sampling_params, "max_tokens": min(max_tokens_per_turn, room or max_tokens_per_turn),
                      "stop_token_ids": self.stop_token_ids, "stop": stops, "include_stop_str_in_output": True}
            started = loop.time()
            output = await self.server_manager.generate(
                request_id=request_id, prompt_ids=driver.prompt_ids, sampling_params=params)
            metrics["generate_sequences"] += loop.time() - started
            token_ids = list(output.token_ids)
            action = driver.add_turn(token_ids, list(output.log_probs or [0.0] * len(token_ids)))
            if action is None:
                break
            started = loop.time()
            _, reward, terminated, truncated, step_info = await loop.run_in_executor(None, env.step, action)
            metrics["tool_calls"] += loop.time() - started
            driver.add_step(reward, terminated, truncated, step_info)
        if driver.awaits_truncation:
            truncate = getattr(env.unwrapped, "truncate", None)
            if callable(truncate):  # pay what the env pays when its own limit cuts an episode
                driver.add_truncation(*await loop.run_in_executor(None, truncate))
            else:
                driver.skip_truncation()
        return self._output(driver, metrics)

    @staticmethod
    def _output(driver: EpisodeDriver, metrics: dict[str, float]) -> AgentLoopOutput:
        """The episode as verl's output. Our mask of model-sampled tokens, ``loss_mask``, is what verl calls
        ``response_mask`` (verl has no name for "every response token": that is the response itself)."""
        sample, last_info = driver.tokens.sample, driver.last_info
        components = {key: float(value) for key, value in (last_info.get(REWARD_COMPONENTS) or {}).items()
                      if isinstance(value, (int, float))}
        return AgentLoopOutput(
            prompt_ids=sample.prompt_ids,
            response_ids=sample.response_ids,
            response_mask=sample.loss_mask,
            response_logprobs=sample.logprobs,
            reward_score=driver.tokens.outcome,
            num_turns=1 + 2 * driver.tokens.turns,  # verl counts messages: the prompt, then each turn and its reply
            metrics=AgentLoopMetrics(**metrics),
            extra_fields={
                "turn_scores": list(sample.turn_rewards),
                "tool_rewards": [],
                "reward_components": components,
                "reward_extra_info": components,
                "task_id": driver.summary.task_id or None,
                "truncated_by": "agent_loop" if driver.tokens.cut_reason else None,
            },
        )
