"""Scripted baseline policies: ``oracle``, ``gold-search``, ``naive-rag``, ``random`` and ``stub``.

They speak through the env's own wire format, so each one doubles as a check that parsing, tools and rewards
agree: the oracle reads every hop's answer off the search results before it answers, so EM 1.0 means the
corpus holds the evidence, search finds it and the reward pays for it. ``naive-rag`` is the weak baseline of
the paper (one search with the question, answer from the top hit) and the warm-start teacher for SFT.
``stub`` is the floor of a coding env: it submits the task's function with an empty body.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import numpy as np

from agent_gym.contract import TOOL_CALLS
from agent_gym.env import ToolEnv
from agent_gym.error import AgentGymError, InvalidValue
from agent_gym.formats import ToolCall
from agent_gym.rewards import normalize_answer

__all__ = ["Policy", "PolicyError", "OraclePolicy", "GoldSearchPolicy", "NaiveRAGPolicy", "RandomPolicy",
           "StubPolicy", "WeakMultiHopPolicy", "make_policy", "playable_policies", "POLICIES", "extract_answer",
           "candidate_spans"]

UNKNOWN_ANSWER = "unknown"


class PolicyError(AgentGymError, ValueError):
    """A scripted policy cannot play this env's tasks (the oracle needs gold decompositions)."""


class Policy(Protocol):
    """What the evaluation loop drives: ``begin`` once per episode, then ``act`` once per turn.

    A policy may also define ``check_tasks(tasks)``, which raises :class:`PolicyError` before any episode
    when it cannot play those tasks.
    """

    def begin(self, env: ToolEnv, observation: str, info: dict[str, Any]) -> None: ...

    def act(self, observation: str, info: dict[str, Any]) -> str: ...


def require_gold_hook(policy: object, env: Any) -> None:
    """Raise :class:`PolicyError` unless ``env`` offers what a gold-reading scripted policy reads: ``task`` (the
    episode's :class:`~agent_gym.tasks.Task`), ``tools`` (name -> :class:`~agent_gym.tools.Tool`) and
    ``tool_format``, as :class:`ToolEnv` does. This is the hook an env implements to be played by them."""
    missing = [name for name in ("task", "tools", "tool_format") if getattr(env, name, None) is None]
    if missing:
        raise PolicyError(
            f"the {type(policy).__name__} scripted policy reads the env's gold task and tools (env.unwrapped."
            f"{', env.unwrapped.'.join(missing)}), which {type(env).__name__} does not expose; evaluate a model "
            "(--model), which needs only info['messages'], or give the env those attributes as ToolEnv has"
        )


def _env_name(env: Any) -> str:
    spec = getattr(env, "spec", None)
    return getattr(spec, "id", None) or type(env).__name__


class _Playable:
    """What an env must offer a scripted policy; :meth:`check_env` refuses one that cannot be played."""

    name = ""

    def cannot_play(self, env: Any, tasks: Any) -> str | None:
        """Why this policy cannot play ``tasks`` of ``env`` (a ToolEnv), or None when it can."""
        return None

    def check_env(self, env: Any, tasks: Any = None) -> None:
        """Raise :class:`PolicyError` when this policy cannot play ``env`` (its ``tasks``: default all of them),
        naming the scripted policies that can. An env without the gold hook is left to :meth:`begin`."""
        if getattr(env, "tools", None) is None or getattr(env, "tasks", None) is None:
            return
        tasks = env.tasks if tasks is None else tasks
        problem = self.cannot_play(env, tasks)
        if problem:
            able = playable_policies(env, tasks)
            raise PolicyError(f"{problem}; the scripted policies that can play {_env_name(env)}: "
                              f"{', '.join(able) if able else 'none'}")


def _needs_search(policy: _Playable, env: Any) -> str | None:
    if "search" in env.tools:
        return None
    return (f"the {policy.name} policy searches with the env's `search` tool, and {_env_name(env)} has none (its "
            f"tools: {', '.join(env.tools) or 'none'})")


class _ScriptedPolicy(_Playable):
    """Shared plumbing: the env's format and search tool name."""

    def begin(self, env: ToolEnv, observation: str, info: dict[str, Any]) -> None:
        require_gold_hook(self, env)
        self.env = env
        self.format = env.tool_format
        self.task = env.task
        self.search_tool = "search" if "search" in env.tools else next(iter(env.tools))
        self.turn = 0

    def _call(self, query: str) -> str:
        return self.format.render_call(ToolCall(self.search_tool, {self._argument(): query}, f"call_{self.turn}"))

    def _argument(self) -> str:
        schema = self.env.tools[self.search_tool].parameters
        required = schema.get("required") or list(schema.get("properties", {}))
        return required[0]

    def _answer(self, text: str) -> str:
        return self.format.render_answer(text)


class _TaskBoundPolicy(_ScriptedPolicy):
    """A scripted policy that plays only tasks carrying what it follows (``_missing`` says which lack it)."""

    def _missing(self, tasks: Any) -> str | None:
        raise NotImplementedError

    def cannot_play(self, env: Any, tasks: Any) -> str | None:
        return self._missing(tasks)

    def check_tasks(self, tasks: Any) -> None:
        """Raise :class:`PolicyError` if any of ``tasks`` lacks what this policy follows."""
        problem = self._missing(tasks)
        if problem:
            raise PolicyError(problem)

    def begin(self, env: ToolEnv, observation: str, info: dict[str, Any]) -> None:
        super().begin(env, observation, info)
        assert self.task is not None
        self.check_tasks([self.task])


def _searchable_hops(task: Any) -> list[Any]:
    return [hop for hop in task.decomposition if hop.query]


class OraclePolicy(_TaskBoundPolicy):
    """Follows the gold decomposition: one call per hop (its ``query``), checks that the hop's answer came
    back, and answers gold only if every hop's evidence was seen; otherwise answers ``unknown``.

    Tasks without a gold decomposition (HotpotQA's, a user's) are refused with :class:`PolicyError`.
    ``unfollowed`` lists the tasks whose decomposition could not be followed (a hop's answer was not in what
    its search returned, e.g. MuSiQue's "A.P.J. Abdul Kalam" against a page that spells it "A. P. J."): the
    oracle's EM is below 1 by exactly those.
    """

    name = "oracle"

    def __init__(self) -> None:
        self.unfollowed: list[str] = []

    def _missing(self, tasks: Any) -> str | None:
        missing = [task for task in tasks if not _searchable_hops(task)]
        if not missing:
            return None
        return (f"the oracle policy follows each task's gold decomposition, and {len(missing)} of the "
                f"{len(tasks)} tasks have none (task {missing[0].id!r} first); HotpotQA and most tool tasks "
                "have none (gold-search or naive-rag play HotpotQA)")

    def begin(self, env: ToolEnv, observation: str, info: dict[str, Any]) -> None:
        super().begin(env, observation, info)
        self.hops = _searchable_hops(self.task)
        self.evidence_ok = True

    def act(self, observation: str, info: dict[str, Any]) -> str:
        if self.turn > 0:
            hop = self.hops[self.turn - 1]
            seen = normalize_answer(observation)
            if hop.answer and normalize_answer(hop.answer) not in seen:
                self.evidence_ok = False
        self.turn += 1
        if self.turn <= len(self.hops):
            return self._call(self.hops[self.turn - 1].query)
        assert self.task is not None
        if not self.evidence_ok:
            self.unfollowed.append(self.task.id)
        return self._answer(self.task.answers[0] if self.evidence_ok else UNKNOWN_ANSWER)


class GoldSearchPolicy(_ScriptedPolicy):
    """Searches each gold supporting title, then answers gold if every title came back, else ``unknown``, as
    the oracle does: measures whether the retriever finds the evidence (``info["evidence_recall"]``),
    independent of any reading. Plays envs with a ``search`` tool whose tasks name supporting titles."""

    name = "gold-search"

    def cannot_play(self, env: Any, tasks: Any) -> str | None:
        missing = [task for task in tasks if not task.supporting_titles]
        if missing:
            return (f"the gold-search policy searches each task's supporting titles, and {len(missing)} of the "
                    f"{len(tasks)} tasks have none (task {missing[0].id!r} first)")
        return _needs_search(self, env)

    def begin(self, env: ToolEnv, observation: str, info: dict[str, Any]) -> None:
        super().begin(env, observation, info)
        self.check_env(env, [self.task])
        self.results: list[str] = []

    def act(self, observation: str, info: dict[str, Any]) -> str:
        assert self.task is not None
        titles = list(self.task.supporting_titles)
        if self.turn > 0:
            self.results.append(normalize_answer(observation))
        self.turn += 1
        if self.turn <= len(titles):
            return self._call(titles[self.turn - 1])
        # a page may come back for another title's search: any result counts
        seen = all(any(normalize_answer(title) in result for result in self.results) for title in titles)
        return self._answer(self.task.answers[0] if seen else UNKNOWN_ANSWER)


class NaiveRAGPolicy(_ScriptedPolicy):
    """One search with the whole question, then an extractive answer from the top hit."""

    name = "naive-rag"

    def cannot_play(self, env: Any, tasks: Any) -> str | None:
        return _needs_search(self, env)

    def begin(self, env: ToolEnv, observation: str, info: dict[str, Any]) -> None:
        super().begin(env, observation, info)
        self.check_env(env, [self.task])

    def act(self, observation: str, info: dict[str, Any]) -> str:
        assert self.task is not None
        self.turn += 1
        if self.turn == 1:
            return self._call(self.task.question)
        return self._answer(extract_answer(self.task.question, _top_hit(observation, info)) or UNKNOWN_ANSWER)


class RandomPolicy(_ScriptedPolicy):
    """Uniformly random among: a search for random words of the context, a random answer, or junk text."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        self.turn += 1
        words = re.findall(r"\w+", observation) or ["nothing"]
        picked = " ".join(self.rng.choice(words, size=min(3, len(words))).tolist())
        choice = int(self.rng.integers(3))
        if choice == 0:
            return self._call(picked)
        if choice == 1:
            return self._answer(picked)
        return picked


class StubPolicy(_TaskBoundPolicy):
    """Submits the task's stub at once (``metadata["stub"]``, e.g. the prompt's function with a ``pass`` body):
    what a coding env pays for doing nothing."""

    name = "stub"

    def _missing(self, tasks: Any) -> str | None:
        missing = [task for task in tasks if not isinstance(task.metadata.get("stub"), str)]
        if not missing:
            return None
        return (f"the stub policy submits each task's metadata['stub'], and {len(missing)} of the {len(tasks)} "
                f"tasks have none (task {missing[0].id!r} first): it plays coding envs")

    def act(self, observation: str, info: dict[str, Any]) -> str:
        assert self.task is not None
        self.turn += 1
        return self._answer(self.task.metadata["stub"])


class WeakMultiHopPolicy(_Playable):
    """A weak teacher for warm starts: each episode it follows the gold decomposition with probability
    ``p_multihop`` (as :class:`OraclePolicy`), otherwise it acts as :class:`NaiveRAGPolicy`. A model cloned from
    it does multi-hop search only now and then, which leaves RL room to make that the rule."""

    name = "weak-multihop"

    def cannot_play(self, env: Any, tasks: Any) -> str | None:
        return _needs_search(self, env)

    def __init__(self, p_multihop: float = 0.3, seed: int = 0) -> None:
        if not 0.0 <= p_multihop <= 1.0:
            raise InvalidValue(f"p_multihop must lie in [0, 1], got {p_multihop}")
        self.p_multihop = p_multihop
        self.rng = np.random.default_rng(seed)
        self.current: Policy = NaiveRAGPolicy()

    def begin(self, env: ToolEnv, observation: str, info: dict[str, Any]) -> None:
        require_gold_hook(self, env)
        self.check_env(env, [env.task])
        multihop = self.rng.random() < self.p_multihop
        assert env.task is not None
        # Tasks without a gold decomposition have no hops to follow: naive-rag plays them.
        self.current = OraclePolicy() if multihop and _searchable_hops(env.task) else NaiveRAGPolicy()
        self.current.begin(env, observation, info)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return self.current.act(observation, info)


# ---------------------------------------------------------------------------------------------- reader

_CANDIDATE = re.compile(r"(?:\d[\d,]*(?:\.\d+)?|[A-Z][\w'\-]*(?:\s+(?:of\s+|de\s+)?[A-Z][\w'\-]*)*)")
_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset("a an the of in on at to by for and or is was were are be been what which who whom whose "
                       "where when how many much did does do from with as that this it its".split())


def candidate_spans(text: str) -> list[str]:
    """Capitalised phrases and numbers in ``text``, in order of first appearance, without repeats."""
    seen: dict[str, None] = {}
    for match in _CANDIDATE.finditer(text):
        span = match.group().strip(" ,")
        if span and span.lower() not in _STOPWORDS:
            seen.setdefault(span, None)
    return list(seen)


def _top_hit(observation: str, info: dict[str, Any]) -> str:
    """The first hit of this step's search, from its structured hits; the whole observation when there is none."""
    for call in info.get(TOOL_CALLS) or ():
        hits = call.get("hits") or ()
        if hits:
            return f"{hits[0]['title']}. {hits[0]['text']}"
    return observation


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s", "er"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def extract_answer(question: str, passage: str) -> str | None:
    """A small extractive reader: the candidate span (a capitalised phrase or a number, absent from the
    question) nearest to the question's content words in the passage sentence that shares most of them.
    Numbers are preferred for when/year/how-many questions, names otherwise."""
    question_lower = question.lower()
    keywords = {_stem(w) for w in _WORD.findall(question_lower) if w not in _STOPWORDS}
    wants_number = bool(re.search(r"\b(when|year|how many|how much|how old|population)\b", question_lower))
    best: tuple[float, str] | None = None
    for sentence in re.split(r"(?<=[.!?])\s+", passage):
        words = _WORD.findall(sentence.lower())
        overlap = sum(1 for word in words if _stem(word) in keywords)
        keyword_positions = [m.start() for m in re.finditer(r"[A-Za-z0-9]+", sentence)
                             if _stem(m.group().lower()) in keywords]
        for match in _CANDIDATE.finditer(sentence):
            span = match.group().strip(" ,")
            if not span or normalize_answer(span) in normalize_answer(question) or span.lower() in _STOPWORDS:
                continue
            is_number = span[0].isdigit()
            type_bonus = 2.0 if is_number == wants_number else 0.0
            distance = min((abs(match.start() - position) for position in keyword_positions), default=999)
            score = overlap * 3 + type_bonus - distance / 40
            if best is None or score > best[0]:
                best = (score, span)
    return best[1] if best else None


POLICIES: dict[str, type] = {
    "oracle": OraclePolicy,
    "gold-search": GoldSearchPolicy,
    "naive-rag": NaiveRAGPolicy,
    "random": RandomPolicy,
    "weak-multihop": WeakMultiHopPolicy,
    "stub": StubPolicy,
}


def playable_policies(env: Any, tasks: Any = None) -> list[str]:
    """The scripted policies that can play ``tasks`` (default: all) of ``env``, a ToolEnv."""
    tasks = env.tasks if tasks is None else tasks
    return [name for name in sorted(POLICIES) if make_policy(name).cannot_play(env, tasks) is None]


def make_policy(name: str, seed: int = 0, **options: Any) -> Policy:
    """Build a scripted policy by name; ``options`` go to its constructor (e.g. ``p_multihop=0.4``)."""
    if name not in POLICIES:
        raise InvalidValue(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}")
    accepted = {"random": ("seed",), "weak-multihop": ("seed", "p_multihop")}.get(name, ())
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise InvalidValue(
            f"policy {name!r} takes no option {', '.join(unknown)}; its options: {list(accepted) or 'none'}"
        )
    if "seed" in accepted:
        return POLICIES[name](**{"seed": seed, **options})
    return POLICIES[name]()
