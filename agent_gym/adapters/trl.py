"""TRL's ``GRPOTrainer`` on any agent-gym env, through both of TRL's own entry points (tested with trl 1.16.0).

**``environment_factory``** (:func:`make_environment_factory`): a class whose public methods are the env's tools,
with signatures and docstrings built from the env's tool schemas, plus ``answer`` (the path to the env's scorer:
it sends ``<answer>...</answer>``), ``reset`` and ``get_reward``. TRL parses each completion's tool calls with the
tokenizer's response parser, calls the methods, renders their results with the chat template, and generates on.
Each method returns the tool's raw result text: TRL wraps it in a ``tool`` message itself (a method that returned
the env's observation would come back wrapped twice, ``<tool_response>`` inside ``<tool_response>``).
``get_reward`` returns the env's episode return; an episode the model left without an answer is ended through the
env's ``truncate()``, so it pays what the env pays when its own limit cuts it. TRL ships response parsers only
for chat templates it knows; :func:`prepare_tokenizer` gives ours (Qwen2.5's hermes ``<tool_call>`` layout) TRL's
Qwen parser.

**``rollout_func``** (:class:`RolloutFunc`): our token-in/token-out ``RolloutCollector`` plays each prompt's
episode with the trainer's own model and hands TRL the exact ids: the prompt, the completion (every sampled token
and every env token, in order), the sampling log-probs, and ``env_mask`` = our ``loss_mask``. The env's own text
(tool results and its feedback on malformed turns, as the env wrote them) reaches the model token for token, and
the env reward comes back in the ``env_reward`` column, read by :func:`env_reward`.

Which keeps env tokens out of the loss: both do, and ``tests/test_adapter_trl.py`` checks each on TRL's own
masks. With ``rollout_func``, TRL's loss mask is ``env_mask``, so the env's tokens (exactly the ones our collector
rendered, loss mask 0) carry no gradient and every sampled token does. With ``environment_factory``, TRL's
``tool_mask`` zeroes the tokens of *its own rendering* of each tool result; those are not the env's observation
(the env's wire format, its feedback on malformed turns and its context policy never reach the model: a turn TRL
cannot parse as a tool call simply ends the rollout). Use ``rollout_func`` for the env's exact MDP; use
``environment_factory`` where TRL's tool loop, vLLM server mode or its multi-environment routing are wanted.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from agent_gym.contract import MESSAGES, TOOL_FORMAT, TOOLS, check_tool_env_contract, new_messages
from agent_gym.error import InvalidValue
from agent_gym.formats import ToolCall, get_format
from agent_gym.make import make_env

__all__ = ["RolloutFunc", "env_reward", "make_environment_factory", "make_tool_dataset", "prepare_tokenizer"]

_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}
ANSWER_TOOL = "answer"


# ---------------------------------------------------------------------------------------------- environment_factory


class _EnvironmentBase:
    """What every generated environment class shares; TRL lists only public methods as tools, so all is private."""

    _env_source: str | Callable[[], gym.Env]
    _env_kwargs: dict[str, Any]

    def __init__(self) -> None:
        self._env = make_env(self._env_source, self._env_kwargs, instance_ok=False)
        self._format = None
        self._return = 0.0
        self._over = True
        self._last_info: dict[str, Any] = {}

    def reset(self, **row: Any) -> str:
        """Start an episode (the dataset row's ``task_index`` / ``task_id`` / ``seed`` pick it); return the question.

        TRL appends the returned text to the prompt's last user message.
        """
        options = {key: row[key] for key in ("task_id", "task_index") if row.get(key) is not None}
        question, info = self._env.reset(seed=row.get("seed"), options=options or None)
        self._format = get_format(info.get(TOOL_FORMAT, "hermes"))
        self._return, self._over, self._last_info = 0.0, False, info
        return question

    def get_reward(self) -> float:
        """The env's return for the episode; an unfinished episode is ended through the env's ``truncate()``."""
        if not self._over:
            truncate = getattr(self._env.unwrapped, "truncate", None)
            if callable(truncate):
                reward, self._last_info = truncate()
                self._return += float(reward)
            self._over = True
        return self._return

    def _act(self, text: str) -> str:
        if self._over:
            return "The episode is over; no further calls run."
        _, reward, terminated, truncated, info = self._env.step(text)
        self._return += float(reward)
        self._last_info = info
        self._over = bool(terminated or truncated)
        if terminated:
            return "Your answer is recorded."
        results = [str(message.get("content", "")) for message in new_messages(info)]
        if truncated:
            results.append("The episode is over (turn or context limit).")
        return "\n".join(results)

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        assert self._format is not None, "reset() first"
        return self._act(self._format.render_call(ToolCall(name, arguments)))


def _tool_method(schema: dict[str, Any]) -> Callable[..., str]:
    """A method named after the tool, whose signature and Google-style docstring are the tool's schema."""
    function = schema.get("function", schema)
    name, parameters = function["name"], function.get("parameters") or {}
    properties, required = parameters.get("properties", {}), set(parameters.get("required") or [])
    if not name.isidentifier() or name.startswith("_") or name in ("reset", "get_reward", ANSWER_TOOL):
        raise InvalidValue(f"tool {name!r} cannot be a method of TRL's environment class (it must be a public "
                         f"identifier other than reset, get_reward and {ANSWER_TOOL})")
    arguments = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    lines = []
    for argument, spec in properties.items():
        kind = _JSON_TYPES.get(spec.get("type"), str)
        default = inspect.Parameter.empty if argument in required else None
        arguments.append(inspect.Parameter(argument, inspect.Parameter.KEYWORD_ONLY, default=default,
                                           annotation=kind if argument in required else kind | None))
        annotations[argument] = arguments[-1].annotation
        lines.append(f"    {argument}: {spec.get('description') or f'the {argument}'}")

    def method(self: _EnvironmentBase, **kwargs: Any) -> str:
        return self._call(name, {key: value for key, value in kwargs.items() if value is not None})

    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(arguments, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    description = function.get("description") or f"Call the {name} tool."
    method.__doc__ = f"{description}\n\nArgs:\n" + "\n".join(lines) + "\n\nReturns:\n    The tool's result."
    if not lines:
        method.__doc__ = f"{description}\n\nReturns:\n    The tool's result."
    return method


def _answer(self, answer: str) -> str:  # noqa: ANN001 - an annotated self would become a tool argument
    """Give your final answer to the user's question; this ends the episode and scores it.

    Args:
        answer: the final answer, as briefly as possible (a name, a date, a number, yes or no).

    Returns:
        A confirmation that the answer is recorded.
    """
    assert self._format is not None, "reset() first"
    return self._act(self._format.render_answer(answer))


_answer.__name__ = _answer.__qualname__ = ANSWER_TOOL  # TRL names each tool after its method's __name__


def make_environment_factory(env: str | Callable[[], gym.Env], **env_kwargs: Any) -> type:
    """A class for ``GRPOTrainer(environment_factory=...)``: one instance per rollout, each holding its own env.

    ``env`` is an env id (with ``gym.make`` kwargs) or a factory. The class's tool methods come from the env's
    ``reset`` info (``tools``); ``answer`` ends the episode through the env's answer format. The env is held to
    the env contract first (`check_tool_env_contract`), so a broken env fails here, not inside TRL's loop.
    """
    probe = make_env(env, env_kwargs, instance_ok=False)
    try:
        check_tool_env_contract(probe)
        _, info = probe.reset(seed=0)
    finally:
        probe.close()
    namespace: dict[str, Any] = {"_env_source": staticmethod(env) if callable(env) else env,
                                 "_env_kwargs": dict(env_kwargs), ANSWER_TOOL: _answer}
    for schema in info.get(TOOLS) or []:
        method = _tool_method(schema)
        namespace[method.__name__] = method
    name = "".join(part for part in str(getattr(env, "__name__", env)).replace("-", "_").split("_") if part.isalnum())
    return type(f"{name or 'AgentGym'}TRLEnvironment", (_EnvironmentBase,), namespace)


def make_tool_dataset(env: str | Callable[[], gym.Env], num_tasks: int, *, start: int = 0,
                      **env_kwargs: Any) -> Any:
    """A ``datasets.Dataset`` for ``environment_factory`` training: one row per task of the env's list.

    Each row's ``prompt`` is the env's system message and an empty user message (``reset`` appends the task's
    question to it); ``task_index`` picks the task.
    """
    from datasets import Dataset

    probe = make_env(env, env_kwargs, instance_ok=False)
    _, info = probe.reset(seed=0)
    probe.close()
    system = [message for message in info[MESSAGES] if message.get("role") == "system"][:1]
    rows = [{"prompt": [*system, {"role": "user", "content": ""}], "task_index": index}
            for index in range(start, start + num_tasks)]
    return Dataset.from_list(rows)


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Give a tokenizer whose chat template writes hermes ``<tool_call>`` JSON (ours, Qwen2.5's) TRL's Qwen parser.

    TRL's ``add_response_schema`` recognises only the exact templates it ships; ours renders assistant tool calls
    and tool results the same way as Qwen2.5's, so the same parser reads them. A tokenizer that already has a
    response template is left alone.
    """
    from trl.chat_template_utils import qwen3_template

    if getattr(tokenizer, "response_template", None) is None and "<tool_call>" in (tokenizer.chat_template or ""):
        tokenizer.response_template = qwen3_template
    return tokenizer


# ---------------------------------------------------------------------------------------------- rollout_func


def _prompt_key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


class RolloutFunc:
    """``GRPOTrainer(rollout_func=...)``: episodes played by our ``RolloutCollector`` with the trainer's model.

    Args:
        env: an env id (with ``env_kwargs``) or a factory; ``num_envs`` copies play a batch's episodes at once.
        num_envs: envs stepped together (one turn batch per round).
        config: the collector's ``RolloutConfig`` (per-turn ``max_new_tokens``, ``max_turns``, context budget);
            its temperature and top-p are replaced by the trainer's.

    :meth:`dataset` builds the prompts (each task's ``reset`` messages); a prompt it did not build is refused,
    since the collector must know which task to reset. Each prompt yields one completion (TRL repeats prompts
    ``num_generations`` times itself). Returned columns: ``prompt_ids``, ``completion_ids``, ``logprobs``,
    ``env_mask`` (our ``loss_mask``), and for reward functions ``env_reward`` (the episode return), ``em``, ``f1``.
    """

    def __init__(self, env: str | Callable[[], gym.Env], *, num_envs: int = 8, config: Any = None,
                 **env_kwargs: Any) -> None:
        from agent_gym.trainers.rollout import RolloutConfig

        if num_envs < 1:
            raise InvalidValue(f"num_envs must be at least 1, got {num_envs}")
        self.envs = [make_env(env, env_kwargs, instance_ok=False) for _ in range(num_envs)]
        check_tool_env_contract(self.envs[0])  # a broken env fails here, not inside TRL's loop
        self.config = config or RolloutConfig(show_progress=False)
        self._specs: dict[str, dict[str, Any]] = {}
        self._collector: Any = None
        self._calls = 0
        self.last_trajectories: list[Any] = []

    def dataset(self, num_tasks: int, *, start: int = 0) -> Any:
        """A ``datasets.Dataset`` of ``prompt`` rows: the reset messages of tasks ``start .. start+num_tasks-1``."""
        from datasets import Dataset

        rows = []
        for index in range(start, start + num_tasks):
            spec = {"seed": index, "options": {"task_index": index}}
            _, info = self.envs[0].reset(**spec)
            self._specs[_prompt_key(info[MESSAGES])] = spec
            rows.append({"prompt": list(info[MESSAGES]), "task_index": index})
        return Dataset.from_list(rows)

    def _collector_for(self, trainer: Any) -> Any:
        from dataclasses import replace

        from agent_gym.trainers.backends import TransformersBackend
        from agent_gym.trainers.rollout import RolloutCollector

        if self._collector is None:
            tokenizer = trainer.processing_class
            model = trainer.accelerator.unwrap_model(trainer.model)
            config = replace(self.config, temperature=float(trainer.temperature), top_p=float(trainer.top_p))
            self._collector = RolloutCollector(self.envs, TransformersBackend(model, tokenizer), tokenizer, config)
        return self._collector

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        specs = []
        for prompt in prompts:
            spec = self._specs.get(_prompt_key(prompt))
            if spec is None:
                raise InvalidValue("rollout_func got a prompt that RolloutFunc.dataset() did not build; train on "
                                 "RolloutFunc.dataset(N), whose prompts name their tasks")
            specs.append(spec)
        collector = self._collector_for(trainer)
        self._calls += 1
        trajectories = collector.collect(specs, group_size=1, greedy=not trainer.model.training,
                                         seed=int(trainer.args.seed) * 100_003 + self._calls)
        if len(trajectories) != len(specs):
            raise InvalidValue(f"{len(specs)} episodes gave {len(trajectories)} samples: rollout_func needs one sample "
                             "per episode, so use an env whose context policy is 'append' (the default)")
        self.last_trajectories = trajectories
        return {
            "prompt_ids": [list(t.prompt_ids) for t in trajectories],
            "completion_ids": [list(t.response_ids) for t in trajectories],
            "logprobs": [list(t.sampling_logprobs) for t in trajectories],
            "env_mask": [list(t.loss_mask) for t in trajectories],
            "env_reward": [float(t.outcome) for t in trajectories],
            "em": [float(t.episode.em or 0.0) for t in trajectories],
            "f1": [float(t.episode.f1 or 0.0) for t in trajectories],
        }


def env_reward(completions: Sequence[Any], env_reward: Sequence[float] | None = None, **_: Any) -> list[float]:
    """TRL reward function for :class:`RolloutFunc`: the env's episode return, passed through."""
    if env_reward is None:
        raise InvalidValue("env_reward reads the 'env_reward' column that RolloutFunc returns; pair it with "
                         "GRPOTrainer(rollout_func=RolloutFunc(...))")
    return [float(value) for value in env_reward]
