"""ToolEnv: the step-level MDP of a tool-using language agent (docs/DESIGN.md §2, Agent-R1 v0.1).

State is the context the environment hands the agent for its next turn (``info["messages"]``). An action is
the agent's whole turn as text. The environment parses it with a wire format, runs the tools it calls,
appends their results to the context and pays rewards. Malformed turns never raise: they become an
observation that says what was wrong, and a lower format score.
"""

from __future__ import annotations

import copy
import functools
import json
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium.error import ResetNeeded

from agent_gym.context_summary import SUMMARY_HEADER, extractive_summary
from agent_gym.contract import (
    ANSWER,
    CHECK,
    CONTEXT_REWRITTEN,
    EVIDENCE_RECALL,
    FORMAT_ERRORS,
    GOLD_ANSWERS,
    IGNORED_TOOL_CALLS,
    MESSAGES,
    NEW_MESSAGES,
    REWARD_COMPONENTS,
    REWARD_SCORES,
    REWARD_SPEC,
    REWARD_TERMS,
    STOP_STRINGS,
    TASK_FIELDS,
    TASK_ID,
    TOOL_CALLS,
    TOOL_FORMAT,
    TOOLS,
    TURN,
)
from agent_gym.error import InvalidType, InvalidValue
from agent_gym.formats import ParsedAction, ToolCall, ToolFormat, get_format
from agent_gym.rewards import AnswerScores, RewardSpec, get_reward_spec, score_answer
from agent_gym.spaces import UnicodeText
from agent_gym.tasks import CheckResult, Task, TaskSet
from agent_gym.tools import Tool, ToolResult, validate_arguments
from agent_gym.utf8 import valid_utf8, valid_utf8_json
from agent_gym.validation import require_int

__all__ = ["ToolEnv", "DEFAULT_INSTRUCTION", "step_turns", "task_fields"]

DEFAULT_INSTRUCTION = (
    "Answer the user's question. Think step by step, and use the tools to find the facts you need: do not "
    "guess. When you know the final answer, give it as briefly as possible (a name, a date, a number, yes or "
    "no) within <answer></answer> tags."
)
CONTEXT_POLICIES = ("append", "window", "summarize")
MIN_SUMMARY_CHARS = 100  # the summary message's header and one short entry
_TRUNCATION_NOTE = "\n[... truncated {} characters]"


def task_fields(task: Task) -> dict[str, Any]:
    """``info["task_fields"]``: the task's kind and the scalar values of its metadata (hop count, split...)."""
    scalars = {key: value for key, value in task.metadata.items() if isinstance(value, str | int | float | bool)}
    return {"kind": task.kind, **scalars} if task.kind else scalars


def _clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending with a note of how much was cut when it fits."""
    if len(text) <= limit:
        return text
    note = _TRUNCATION_NOTE.format(len(text) - limit)
    if len(note) >= limit:
        return text[:limit]
    return text[: limit - len(note)] + note


def _clean_text(text: str) -> str:
    """Make arbitrary input safe to store and serialise: drop NUL, replace lone surrogates."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    return valid_utf8(text)


@dataclass
class PendingTurn:
    """A parsed turn whose tool calls have not run yet (`step_turns` batches them across environments)."""

    action: str
    parsed: ParsedAction
    problems: list[str]
    runnable: list[ToolCall] = field(default_factory=list)


class ToolEnv(gym.Env[str, str]):
    """A multi-turn text environment in which an agent answers a task by calling tools.

    Args:
        tasks: the tasks an episode can be about, or a factory returning them.
        tools: the tools the agent may call, or a factory returning them.
        tool_format: wire format name (``hermes``, ``xml``, ``openai``) or a :class:`ToolFormat`.
        reward: reward spec name (``paper``, ``dense``, ``dense_charged``) or a :class:`RewardSpec`.
        max_turns: turns before the episode is truncated.
        max_calls_per_turn: tool calls run per turn; extra calls are a format error.
        max_action_chars: longest turn that is parsed; longer turns are refused as malformed.
        max_tool_output_chars: each tool result is clipped to this many characters.
        max_context_chars: the context budget; the episode is truncated when the context outgrows it.
        context: ``append`` keeps the whole history; ``window`` keeps the prompt and the last ``window_turns``
            turns; ``summarize`` keeps them too, and folds the older turns into one summary message after the
            prompt. Both flag ``info["context_rewritten"]`` on the steps that rewrite the context.
        window_turns: turns kept word for word by the ``window`` and ``summarize`` policies.
        summary_chars: the longest summary message of the ``summarize`` policy (at least 100 characters).
        summarizer: ``summarizer(messages) -> str`` replaces the default extractive summary
            (:func:`~agent_gym.context_summary.extractive_summary`); it receives every folded message so far.
        instruction: the task instruction put in the system prompt before the tool protocol.
        render_mode: ``ansi`` (return text) or ``human`` (print it).
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(
        self,
        tasks: Sequence[Task] | Callable[[], Sequence[Task]],
        tools: Sequence[Tool] | Callable[[], Sequence[Tool]],
        *,
        tool_format: str | ToolFormat = "hermes",
        reward: str | RewardSpec = "paper",
        max_turns: int = 8,
        max_calls_per_turn: int = 3,
        max_action_chars: int = 8_192,
        max_tool_output_chars: int = 6_000,
        max_context_chars: int = 64_000,
        context: str = "append",
        window_turns: int = 4,
        summary_chars: int = 2_000,
        summarizer: Callable[[list[dict[str, Any]]], str] | None = None,
        instruction: str = DEFAULT_INSTRUCTION,
        render_mode: str | None = None,
    ) -> None:
        if context not in CONTEXT_POLICIES:
            raise InvalidValue(f"context must be one of {CONTEXT_POLICIES}, got {context!r}")
        if summarizer is not None and (context != "summarize" or not callable(summarizer)):
            raise InvalidValue(f"summarizer is used only with context='summarize', and must be callable; got "
                               f"context={context!r}, summarizer={summarizer!r:.80}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise InvalidValue(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        for name, value in (("max_turns", max_turns), ("max_calls_per_turn", max_calls_per_turn),
                            ("window_turns", window_turns), ("max_action_chars", max_action_chars),
                            ("max_tool_output_chars", max_tool_output_chars), ("max_context_chars", max_context_chars)):
            require_int(name, value)
        task_list = tasks() if callable(tasks) else tasks
        if not isinstance(task_list, TaskSet):
            task_list = list(task_list)
            for index, task in enumerate(task_list):
                if not isinstance(task, Task):
                    raise InvalidType(f"tasks[{index}] is a {type(task).__name__}, not a Task; "
                                      "build tasks with agent_gym.Task(id=..., question=..., answers=(...))")
            task_list = TaskSet(task_list)
        self.tasks: TaskSet = task_list
        if len(self.tasks) == 0:
            raise InvalidValue("ToolEnv needs at least one task")
        tool_list = list(tools() if callable(tools) else tools)
        self.tools: dict[str, Tool] = {}
        for index, item in enumerate(tool_list):
            if not isinstance(item, Tool):
                raise InvalidType(f"tools[{index}] is a {type(item).__name__}, not a Tool; decorate it with "
                                  "@agent_gym.tool or subclass agent_gym.Tool")
            if item.name in self.tools:
                raise InvalidValue(f"two tools are named {item.name!r}")
            self.tools[item.name] = item
        self.tool_format = get_format(tool_format)
        self.tool_format.check_tools([item.schema() for item in self.tools.values()])
        self.reward_spec = get_reward_spec(reward)
        self.max_turns = max_turns
        self.max_calls_per_turn = max_calls_per_turn
        self.max_action_chars = max_action_chars
        self.max_tool_output_chars = max_tool_output_chars
        self.max_context_chars = max_context_chars
        self.context_policy = context
        self.window_turns = window_turns
        self.summary_chars = require_int("summary_chars", summary_chars, minimum=MIN_SUMMARY_CHARS)
        self.summarizer = summarizer
        self.instruction = instruction
        self.render_mode = render_mode
        self._human_shown: str | None = None  # the text human mode printed last
        self.tool_schemas = [item.schema() for item in self.tools.values()]
        system_chars = len(self._system_prompt())
        if max_context_chars <= system_chars:
            raise InvalidValue(
                f"max_context_chars={max_context_chars} cannot hold the system prompt ({system_chars} characters) "
                "and a question; give a budget above that, e.g. the default 64000"
            )
        self.observation_space = UnicodeText(max_length=max_context_chars)
        self.action_space = UnicodeText(max_length=max_action_chars)
        self.task: Task | None = None
        self._messages: list[dict[str, Any]] = []
        self._prompt_length = 0  # messages that every context policy keeps (system + question)
        self._turn_sizes: list[int] = []  # messages each turn appended, for the window policy
        self._folded: list[dict[str, Any]] = []  # messages the summarize policy folded, this episode
        self._done = True

    # ------------------------------------------------------------------------------------------ episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        chosen = self._task_for(options)  # first: a refused reset leaves the env, and its RNG, as they were
        super().reset(seed=seed)
        self.task = chosen if chosen is not None else self.tasks[int(self.np_random.integers(len(self.tasks)))]
        system = self._system_prompt()
        question = _clip(self.task.question, self.max_context_chars // 2)
        self._messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        self._prompt_length = len(self._messages)
        self._turn_sizes = []
        self._folded = []
        self._turn = 0
        self._well_formed_turns = 0
        self._process_paid = 0.0
        self._idle_charged = 0.0
        self._found_titles: set[str] = set()
        self._retrieved_titles: set[str] = set()
        self._best_progress = 0.0
        self._check_details: dict[str, Any] | None = None
        self._done = False
        self._last_observation = question
        info = self._base_info(context_rewritten=False, new_messages=self._messages)
        info[TOOL_CALLS] = []
        _put_reward(info, _paid_terms(), {"format": 0.0})
        info[TOOLS] = copy.deepcopy(self.tool_schemas)
        info[TOOL_FORMAT] = self.tool_format.name
        info[STOP_STRINGS] = list(self.tool_format.stop_strings_for(self.tool_schemas))
        info[REWARD_SPEC] = self.reward_spec.name
        info[TASK_FIELDS] = task_fields(self.task)
        if self.render_mode == "human":
            self.render()
        return question, info

    _RESET_OPTIONS = ("task_id", "task_index")

    def _task_for(self, options: Mapping[str, Any] | None) -> Task | None:
        """The task that ``reset``'s options pick; None when they pick none (one is then drawn with the env's
        seeded RNG). Raises for options it cannot use."""
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise InvalidType(f"reset options must be a dict such as {{'task_id': ...}}, got {type(options).__name__} "
                              f"{options!r:.80}")
        unknown = [key for key in options if key not in self._RESET_OPTIONS]
        if unknown:
            raise InvalidValue(f"unknown reset option(s) {', '.join(map(repr, unknown))}; "
                               "ToolEnv takes 'task_id' or 'task_index'")
        if len(options) > 1:
            raise InvalidValue("give one of 'task_id' and 'task_index', not both")
        if "task_id" in options:
            return self.tasks.by_id(str(options["task_id"]))
        if "task_index" in options:
            index = options["task_index"]
            if isinstance(index, bool) or not isinstance(index, numbers.Integral):
                raise InvalidValue(f"task_index must be an int (taken modulo the {len(self.tasks)} tasks), "
                                   f"got {index!r:.80}")
            return self.tasks[int(index) % len(self.tasks)]
        return None

    def _system_prompt(self) -> str:
        return f"{self.instruction}\n\n{self.tool_format.instructions(self.tool_schemas)}"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return step_turns([self], [action])[0]

    def truncate(self) -> tuple[float, dict[str, Any]]:
        """End the episode now, cut short by a limit outside the env (e.g. a trainer's own turn cap).

        Pays what the env's own ``max_turns`` would pay: the outcome of an episode without an answer (Agent-R1
        Eq. 6: ``format_score - 1``). Returns ``(reward, info)``, with the end-of-episode info keys.
        """
        if self._done:
            raise ResetNeeded("the episode is over (or was never started): call reset() before truncate()")
        terms, scores = _paid_terms(), {}
        info = self._base_info(context_rewritten=False, new_messages=[])
        self._end_episode(None, terms, scores, info)
        _put_reward(info, terms, scores)
        return sum(terms.values()), info

    # The phases of a step, public so that `step_turns` can batch the tool calls of many envs into one.

    def begin_turn(self, action: Any) -> PendingTurn:
        """Record and parse the agent's turn; decide which tool calls will run."""
        if self._done:
            raise ResetNeeded("the episode is over (or was never started): call reset() before step()")
        problems: list[str] = []
        if not isinstance(action, str):
            problems.append(f"an action must be text (str), got {type(action).__name__}.")
            action = ""
        action = _clean_text(action)
        if len(action) > self.max_action_chars:
            problems.append(f"your turn has {len(action)} characters; the limit is {self.max_action_chars}. "
                            "Write shorter turns.")
            recorded = _clip(action, self.max_action_chars)
            parsed = ParsedAction()
        else:
            recorded = action
            parsed = self.tool_format.parse(action, self.tool_schemas, self.max_calls_per_turn)
        self._turn += 1
        self._messages.append(self.tool_format.assistant_message(recorded))
        pending = PendingTurn(action=recorded, parsed=parsed, problems=problems)
        # Missing or ill-typed arguments are format errors, like unknown tools. This is the only check: the
        # calls that pass run through `Tool.call_validated`.
        for call in parsed.tool_calls:
            schema = self.tools[call.name].parameters if call.error is None else None
            problem = validate_arguments(schema, call.arguments) if schema is not None else None
            if problem:
                call.error = f"invalid arguments for {call.name}: {problem}"
        if parsed.answer is None and not problems:
            pending.runnable = [call for call in parsed.tool_calls if call.error is None]
        return pending

    def finish_turn(self, pending: PendingTurn, results: Sequence[ToolResult]) -> tuple[
        str, float, bool, bool, dict[str, Any]
    ]:
        """Append results to the context, pay rewards, and decide whether the episode ends."""
        assert self.task is not None
        parsed = pending.parsed
        problems = pending.problems + parsed.errors
        well_formed = not pending.problems and parsed.well_formed
        self._well_formed_turns += int(well_formed)
        terms, scores = _paid_terms(), {"format": float(well_formed)}
        if not well_formed and self.reward_spec.format_penalty:
            terms["format_penalty"] = -self.reward_spec.format_penalty

        appended: list[dict[str, Any]] = []
        call_records: list[dict[str, Any]] = []
        terminated = parsed.answer is not None and not pending.problems
        if not terminated:
            shown_calls, shown_results = self._pair_results(parsed.tool_calls if not pending.problems else [],
                                                            pending.runnable, results)
            for call, result in zip(shown_calls, shown_results, strict=True):
                terms["process"] += self._pay_process(self.tools.get(call.name), result)
                call_records.append(_call_record(call, result))
            if shown_calls:
                appended.extend(self.tool_format.result_messages(shown_calls, shown_results))
            if problems:
                appended.append(self.tool_format.feedback_message(
                    "Your last turn could not be used: " + " ".join(problems)))
        self._messages.extend(appended)
        self._turn_sizes.append(1 + len(appended))

        context_rewritten = self._apply_context_policy()
        truncated = not terminated and (self._turn >= self.max_turns or self._context_chars() > self.max_context_chars)
        info = self._base_info(context_rewritten=context_rewritten, new_messages=appended)
        info[TOOL_CALLS] = call_records
        info[FORMAT_ERRORS] = problems
        if parsed.answer is not None and pending.problems == [] and parsed.tool_calls:
            info[IGNORED_TOOL_CALLS] = len(parsed.tool_calls)

        if terminated or truncated:
            self._end_episode(parsed.answer if terminated else None, terms, scores, info)
            observation = ""
        else:
            observation = _clip("\n".join(self.tool_format.message_text(m) for m in appended),
                                self.observation_space.max_length)
        reward = sum(terms.values())  # the paid terms, and only they (agent_gym.contract.REWARD_TERMS)
        _put_reward(info, terms, scores)
        self._last_observation = observation
        if self.render_mode == "human":
            self.render()
        return observation, float(reward), terminated, truncated, info

    # ------------------------------------------------------------------------------------------ helpers

    def _pair_results(
        self, parsed_calls: Sequence[ToolCall], runnable: Sequence[ToolCall], results: Sequence[ToolResult]
    ) -> tuple[list[ToolCall], list[ToolResult]]:
        """Results for every parsed call, in order: the runnable ones' real results, the rest's errors."""
        by_call = {id(call): result for call, result in zip(runnable, results, strict=True)}
        shown_results = []
        for call in parsed_calls:
            result = by_call.get(id(call)) or ToolResult.error(call.error or "the call did not run")
            # A tool's text may hold lone surrogates (e.g. undecodable program output): it enters the context.
            text = valid_utf8(result.text)
            shown_results.append(_with_text(result, _clip(text, self.max_tool_output_chars)))
        return list(parsed_calls), shown_results

    def _end_episode(self, answer: str | None, terms: dict[str, float], scores: dict[str, float],
                     info: dict[str, Any]) -> None:
        """Pay the outcome into ``terms``, report the answer's scores in ``scores``, and add the end-of-episode
        keys to ``info``.

        ``answer`` is None when the episode was cut short: the missing answer then counts as one more malformed
        turn in the format score.
        """
        assert self.task is not None
        self._done = True
        answer_scores = self._score(answer)
        answered_turns = self._turn + (0 if answer is not None else 1)
        format_score = self._well_formed_turns / answered_turns
        format_ok = answer is not None and self._well_formed_turns == self._turn
        terms["outcome"] = self.reward_spec.outcome(answer_scores, format_score, format_ok)
        scores["format_score"] = format_score
        scores.update(answer_scores.as_dict())
        info[ANSWER] = answer
        info[GOLD_ANSWERS] = list(self.task.answers)
        if self._check_details is not None:
            info[CHECK] = self._check_details

    def _pay_process(self, tool: Tool | None, result: ToolResult) -> float:
        """Process reward of one call: the tool's own reward, else newly shown gold evidence (`Tool.evidence`)
        plus the units by which the result's ``metadata["progress"]`` beats the episode's best so far; a call
        that ran and made none of that pays the spec's ``idle_call_cost`` instead (negative)."""
        assert self.task is not None
        titles = [str(title) for title in tool.evidence(result)] if tool is not None else []
        self._retrieved_titles.update(titles)
        gold = set(self.task.supporting_titles)
        new_gold = (set(titles) & gold) - self._found_titles
        self._found_titles |= new_gold
        progress = result.metadata.get("progress")
        new_progress = 0.0
        if isinstance(progress, int | float) and not isinstance(progress, bool) and progress > self._best_progress:
            new_progress, self._best_progress = progress - self._best_progress, float(progress)
        raw = result.reward if result.reward is not None else float(bool(new_gold)) + new_progress
        if raw <= 0.0 and result.ok:  # a call that failed to run is the format score's to charge, not this
            charged = self.reward_spec.idle_charge(self._idle_charged)
            self._idle_charged -= charged
            return charged
        paid = self.reward_spec.process(raw, self._process_paid)
        self._process_paid += paid
        return paid

    def _score(self, answer: str | None) -> AnswerScores:
        assert self.task is not None
        if answer is not None and self.task.checker is not None:
            verdict = self.task.checker(answer)
            value = float(verdict)
            if isinstance(verdict, CheckResult):
                self._check_details = valid_utf8_json(dict(verdict.details))
            return AnswerScores(em=value, f1=value, precision=value, recall=value, sub_em=value)
        # the spec's rule, else the task's own (a Search-R1 row's source), else the default
        rule = self.reward_spec.answer_rule or self.task.metadata.get("answer_rule")
        return score_answer(answer, self.task.answers, rule=rule)

    def _apply_context_policy(self) -> bool:
        """Keep the prompt and the last ``window_turns`` turns; fold (summarize) or drop (window) older turns."""
        if self.context_policy == "append" or len(self._turn_sizes) <= self.window_turns:
            return False
        start = self._prompt_length + (1 if self._folded else 0)  # after the prompt and any earlier summary
        dropped = sum(self._turn_sizes[: -self.window_turns])
        folded = self._messages[start : start + dropped]
        del self._messages[self._prompt_length : start + dropped]
        del self._turn_sizes[: -self.window_turns]
        if self.context_policy == "summarize":
            self._folded.extend(folded)
            summary = {"role": "user", "content": f"{SUMMARY_HEADER}\n{self._summary()}"}
            self._messages.insert(self._prompt_length, summary)
        return True

    def _summary(self) -> str:
        """The summary of every folded message, by the user's summarizer or the extractive default."""
        budget = self.summary_chars - len(SUMMARY_HEADER) - 1  # the message is the header, a newline, the summary
        if self.summarizer is None:
            return extractive_summary(self._folded, self.tool_format, self.tool_schemas,
                                      max_calls=self.max_calls_per_turn, max_chars=budget)
        summary = self.summarizer(copy.deepcopy(self._folded))
        if not isinstance(summary, str):
            raise InvalidType(f"summarizer must return a str, got {type(summary).__name__}")
        return _clip(_clean_text(summary), budget)

    def _context_chars(self) -> int:
        total = 0
        for message in self._messages:
            total += len(str(message.get("content") or ""))
            if "tool_calls" in message:  # openai-format turns carry their calls outside the content
                total += len(json.dumps(message["tool_calls"], ensure_ascii=False))
        return total

    def _base_info(self, *, context_rewritten: bool, new_messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The keys of every info (agent_gym.contract); ``new_messages``: what this step appended after the turn."""
        assert self.task is not None
        # New lists, so a caller that edits them cannot change the env's context. The message dicts are shared
        # (the env never edits one once it is in the context): a deep copy per step is quadratic per episode.
        info: dict[str, Any] = {
            MESSAGES: list(self._messages),
            NEW_MESSAGES: list(new_messages),
            TASK_ID: self.task.id,
            TURN: self._turn,
            CONTEXT_REWRITTEN: context_rewritten,
        }
        if self.task.supporting_titles:
            gold = set(self.task.supporting_titles)
            info[EVIDENCE_RECALL] = len(gold & self._retrieved_titles) / len(gold)
        return info

    # ------------------------------------------------------------------------------------------ gym API

    def render(self) -> str | None:
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'human'")
            return None
        lines = [f"[{message['role']}] {message.get('content')}" for message in self._messages[-3:]]
        text = "\n".join(lines)
        if self.render_mode == "human":
            # reset and step already print; a render() right after them (Gymnasium's checker calls one) does not
            # print the same screen again
            if text != self._human_shown:
                print(text)
                self._human_shown = text
            return None
        return text

    def corpus_texts(self) -> list[str]:
        """Texts a tokenizer for this env should cover: task questions plus any tool's corpus."""
        texts = [task.question for task in self.tasks]
        for item in self.tools.values():
            extra = getattr(item, "corpus_texts", None)
            if callable(extra):
                texts.extend(extra())
        return texts

    def close(self) -> None:
        """Release what this env holds. Tools are shared (vector envs, caches), so they are not closed here."""
        self._messages = []
        self._done = True


def _paid_terms() -> dict[str, float]:
    """The terms a step pays, all zero: what its reward is the sum of."""
    return {"format_penalty": 0.0, "process": 0.0, "outcome": 0.0}


def _put_reward(info: dict[str, Any], terms: dict[str, float], scores: dict[str, float]) -> None:
    """The step's reward in ``info``: the paid terms, the reported scores, and (deprecated, for one release) the
    two merged under their old key."""
    info[REWARD_TERMS] = terms
    info[REWARD_SCORES] = scores
    info[REWARD_COMPONENTS] = {**scores, **terms}


def _call_record(call: ToolCall, result: ToolResult) -> dict[str, Any]:
    """What ``info["tool_calls"]`` says of one call; a failed call's ``error`` is its result's message."""
    record = {**call.to_dict(), "ok": result.ok, "result_chars": len(result.text)}
    if "hits" in result.metadata:  # a search's structured hits, so no consumer parses the rendered text
        record["hits"] = result.metadata["hits"]
    if not result.ok and record["error"] is None:
        record["error"] = result.text.removeprefix("Error: ")
    return record


def step_turns(
    envs: Sequence[ToolEnv], actions: Sequence[Any]
) -> list[tuple[str, float, bool, bool, dict[str, Any]]]:
    """Play one turn in each env, with one ``call_validated`` batch per tool object across all of them.

    The one step path: ``ToolEnv.step`` is a batch of one, and ``ToolVectorEnv.step`` and the trainer's rollout
    collector send whole batches, so envs that share a tool (one retriever) send one search for all their calls.
    Returns each env's ``(observation, reward, terminated, truncated, info)``, in order.
    """
    if len(envs) != len(actions):
        raise InvalidValue(f"step_turns got {len(envs)} envs and {len(actions)} actions")
    turns = [env.begin_turn(action) for env, action in zip(envs, actions, strict=True)]
    batches: dict[int, tuple[Tool, list[tuple[int, int]]]] = {}  # id(tool) -> (tool, [(env, call) index])
    for env_index, (env, turn) in enumerate(zip(envs, turns, strict=True)):
        for call_index, call in enumerate(turn.runnable):
            tool = env.tools[call.name]
            batches.setdefault(id(tool), (tool, []))[1].append((env_index, call_index))
    results: list[list[ToolResult | None]] = [[None] * len(turn.runnable) for turn in turns]
    for tool, members in batches.values():
        arguments = [turns[env_index].runnable[call_index].arguments for env_index, call_index in members]
        for (env_index, call_index), result in zip(members, tool.call_validated(arguments), strict=True):
            results[env_index][call_index] = result
    return [
        env.finish_turn(turn, [result for result in env_results if result is not None])
        for env, turn, env_results in zip(envs, turns, results, strict=True)
    ]


def _with_text(result: ToolResult, text: str) -> ToolResult:
    if text == result.text:
        return result
    return ToolResult(text=text, ok=result.ok, reward=result.reward, metadata=result.metadata)


def _repair_passive_env_checker() -> None:
    """Let Gymnasium's ``PassiveEnvChecker`` (``gym.make`` puts it around every env) recover from a first reset
    that raised.

    It marks its first reset as checked before running it, and keeps that reset's result for the first step's
    data-reuse check. When that reset raises (a refused option, as documented), the first step after any later
    reset raised ``TypeError`` (unpacking None) from inside Gymnasium 1.4. Repaired: a first reset that raises
    leaves the checker as it was, so the next reset is checked as the first. Every env's checker is repaired,
    not only ours: the flaw is the checker's, and nothing changes unless a first reset raised.
    """
    checker = gym.wrappers.PassiveEnvChecker
    checked_reset = checker.reset
    if getattr(checked_reset, "_agent_gym_repaired", False):
        return

    @functools.wraps(checked_reset)
    def reset(self: Any, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        first = not self.checked_reset
        try:
            return checked_reset(self, seed=seed, options=options)
        except BaseException:
            if first:
                self.checked_reset = False
            raise

    reset._agent_gym_repaired = True  # type: ignore[attr-defined]
    checker.reset = reset


_repair_passive_env_checker()
