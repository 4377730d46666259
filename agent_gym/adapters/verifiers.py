"""verifiers' ``verifiers.v1`` API over any agent-gym env (tested with verifiers 0.4.0, whose only API is v1).

The v1 way: a *taskset* yields tasks, an ``Env`` decides how one task becomes an episode, and agents (a model
driven through a *harness*, whose model calls verifiers intercepts and records in a trace) play it.

- :class:`AgentGymTaskset` (config :class:`AgentGymTasksetConfig`: ``env_id``, ``env_kwargs``, ``num_tasks``)
  yields one task per env task: its prompt is the env's question, its system prompt the env's.
- :class:`AgentGymEnv` runs an episode as verifiers' TextArena env runs a game: it resets our env to the task,
  takes the agent's opening reply with ``interaction.turn()``, steps our env with each reply, and sends the env's
  observation back as the next user turn, until the env ends the episode. The trace records our reward
  (``env_return``, weight 1) and the env's EM and F1 as metrics.
- :class:`ChatHarness`: a minimal in-process harness, one chat-completions request per segment through the
  interception endpoint verifiers hands it; resumed segments replay the conversation (``SUPPORTS_RESUME``).
  No program, runtime image or sandbox is needed, so it runs in the ``subprocess`` runtime on a CPU machine.

verifiers loads tasksets, envs and harnesses by a top-level module id, so importing this module also registers it
as ``agent_gym_verifiers`` (:data:`VERIFIERS_ID`): ``EnvConfig(taskset=AgentGymTasksetConfig(id=VERIFIERS_ID,
env_id=...))``. :func:`make_env_config` builds the whole config for a model behind an OpenAI-compatible URL.
"""

from __future__ import annotations

import sys
from typing import Any

import httpx
import verifiers.v1 as vf

from agent_gym.contract import MESSAGES, TASK_ID
from agent_gym.episode_summary import EpisodeSummary
from agent_gym.make import make_env

__all__ = ["AgentGymEnv", "AgentGymTaskset", "ChatHarness"]

VERIFIERS_ID = "agent_gym_verifiers"
API_KEY_VAR = "AGENT_GYM_MODEL_API_KEY"
sys.modules.setdefault(VERIFIERS_ID, sys.modules[__name__])  # verifiers' loaders import plugins by top-level id


class AgentGymTasksetConfig(vf.TasksetConfig):
    env_id: str = "AgentR1-SynthHop-v0"
    """Gymnasium id of the env (any env that follows agent-gym's contract)."""
    env_kwargs: dict[str, Any] = {}
    """Keyword arguments for ``gym.make``."""
    num_tasks: int = 32
    """Tasks ``start .. start + num_tasks - 1`` of the env's list (``reset(options={"task_index": i})``)."""
    start: int = 0


class AgentGymTaskData(vf.TaskData):
    info: dict
    """The env's ``task_index`` and ``task_id`` of this task."""


class AgentGymTask(vf.Task[AgentGymTaskData, vf.State, vf.TaskConfig]):
    pass


class AgentGymTaskset(vf.Taskset[AgentGymTask, AgentGymTasksetConfig]):
    """One task per env task; the env itself plays the user in :class:`AgentGymEnv`."""

    def load(self) -> list[AgentGymTask]:
        env = make_env(self.config.env_id, dict(self.config.env_kwargs))
        tasks = []
        for index in range(self.config.start, self.config.start + self.config.num_tasks):
            question, info = env.reset(seed=index, options={"task_index": index})
            system = next((m["content"] for m in info[MESSAGES] if m.get("role") == "system"), None)
            data = AgentGymTaskData(name=str(info.get(TASK_ID, index)), prompt=question, system_prompt=system,
                                    info={"task_index": index, "task_id": info.get(TASK_ID)})
            tasks.append(AgentGymTask(data, self.config.task))
        env.close()
        return tasks


class AgentGymEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    """The one seat: the policy under evaluation or training."""


class AgentGymEnv(vf.Env[AgentGymEnvConfig]):
    """Each episode: our env is the user; every agent reply is one env step; our reward is the trace's reward."""

    async def run(self, task: AgentGymTask, agents: Any) -> None:
        taskset = self.config.taskset
        env = make_env(taskset.env_id, dict(taskset.env_kwargs))
        index = task.data.info["task_index"]
        _, info = env.reset(seed=index, options={"task_index": index})
        episode = EpisodeSummary.from_reset(info)
        try:
            async with agents.agent.interaction(task) as interaction:
                segment = await interaction.turn()
                while not segment.terminated:
                    observation, reward, terminated, truncated, info = env.step(segment.last_reply)
                    episode.add_step(reward, terminated, truncated, info)
                    if terminated or truncated:
                        break  # the env ended the episode: end the exchange
                    segment = await interaction.turn(observation)
                else:  # the agent's run ended first (its turn limit): pay what the env pays for a cut
                    truncate = getattr(env.unwrapped, "truncate", None)
                    if callable(truncate):
                        episode.add_truncation(*truncate())
            trace = interaction.trace
            trace.record_reward("env_return", episode.reward, 1.0)
            for key in ("em", "f1"):
                if (value := getattr(episode, key)) is not None:
                    trace.record_metric(key, value)
        finally:
            env.close()


class ChatHarnessConfig(vf.HarnessConfig):
    max_tokens: int = 256
    """Token budget of one reply."""
    temperature: float = 1.0


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """One chat-completions request per segment, made in-process through verifiers' interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any, tool_interception_url: str | None = None) -> Any:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages.extend(message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else
                            dict(message) for message in prompt)
        body = {"model": ctx.model, "messages": messages, "max_tokens": self.config.max_tokens,
                "temperature": self.config.temperature}
        async with httpx.AsyncClient(timeout=300) as client:
            answer = await client.post(f"{endpoint.rstrip('/')}/chat/completions", json=body,
                                       headers={"Authorization": f"Bearer {secret}"})
        ok = answer.status_code < 400
        return vf.ProgramResult(exit_code=0 if ok else 1, stdout="", stderr="" if ok else answer.text[-2000:])


def make_env_config(env_id: str, *, base_url: str, model: str, num_tasks: int = 32, max_turns: int = 8,
                    **env_kwargs: Any) -> AgentGymEnvConfig:
    """The v1 config of :class:`AgentGymEnv` over ``env_id``, its agent a model behind an OpenAI-compatible URL.

    The agent runs :class:`ChatHarness` in the ``subprocess`` runtime (nothing is launched: the harness calls the
    model in-process). The key sent to the server is ``$AGENT_GYM_MODEL_API_KEY`` (verifiers sends ``EMPTY`` when
    it is unset, which a local server accepts).
    """
    return AgentGymEnvConfig(
        taskset=AgentGymTasksetConfig(id=VERIFIERS_ID, env_id=env_id, env_kwargs=env_kwargs, num_tasks=num_tasks),
        agent=vf.AgentConfig(harness=ChatHarnessConfig(id=VERIFIERS_ID), runtime=vf.SubprocessConfig(),
                             model=model, client=vf.EvalClientConfig(base_url=base_url, api_key_var=API_KEY_VAR),
                             max_turns=max_turns),
    )
