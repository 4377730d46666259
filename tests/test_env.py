"""ToolEnv implements the docs/DESIGN.md §2 contract: info keys, episode ends, context policies, rewards, seeding."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from conftest import FACT_TASKS, FactLookup

from agent_gym.env import ToolEnv
from agent_gym.formats import ToolCall
from agent_gym.rewards import get_reward_spec
from agent_gym.tasks import Task
from agent_gym.tools import ToolResult, tool


def lookup(title: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {'title': title}})}</tool_call>"


def answer(text: str) -> str:
    return f"<answer>{text}</answer>"


def started(env: ToolEnv, task_id: str = "capital-france") -> ToolEnv:
    env.reset(seed=0, options={"task_id": task_id})
    return env


def context_chars(messages: list[dict]) -> int:
    return sum(len(str(message.get("content") or "")) for message in messages)


# ---------------------------------------------------------------------------------------------- reset


def test_reset_info_has_the_contract_keys(make_fact_env) -> None:
    _, info = make_fact_env().reset(seed=0)
    assert {"messages", "tools", "task_id", "turn", "tool_format", "stop_strings"} <= set(info)


def test_reset_info_has_zero_reward_components_and_no_tool_calls(make_fact_env) -> None:
    _, info = make_fact_env().reset(seed=0)
    assert (info["reward_components"], info["tool_calls"]) == (
        {"format": 0.0, "format_penalty": 0.0, "process": 0.0, "outcome": 0.0}, [])


def test_reset_info_has_every_key_that_step_info_always_has(make_fact_env) -> None:
    env = make_fact_env()
    _, reset_info = env.reset(seed=0)
    *_, step_info = env.step(lookup("France"))
    assert set(step_info) - {"format_errors"} <= set(reset_info)


def test_reset_observation_is_the_question(make_fact_env) -> None:
    observation, _ = make_fact_env().reset(seed=0, options={"task_id": "capital-japan"})
    assert observation == "What is the capital of Japan?"


def test_reset_messages_are_system_prompt_then_question(make_fact_env) -> None:
    _, info = make_fact_env().reset(seed=0, options={"task_id": "capital-japan"})
    assert [(m["role"], m["content"]) for m in info["messages"]][1:] == [("user", "What is the capital of Japan?")]


def test_reset_system_prompt_describes_the_tools(make_fact_env) -> None:
    _, info = make_fact_env().reset(seed=0)
    assert info["messages"][0]["role"] == "system" and '"name": "lookup"' in info["messages"][0]["content"]


def test_reset_info_tools_are_openai_schemas(make_fact_env) -> None:
    _, info = make_fact_env().reset(seed=0)
    assert [schema["function"]["name"] for schema in info["tools"]] == ["lookup"]


def test_reset_info_reports_format_and_stop_strings(make_fact_env) -> None:
    _, info = make_fact_env(tool_format="xml").reset(seed=0)
    assert (info["tool_format"], info["stop_strings"], info["turn"]) == ("xml", ["</lookup>", "</answer>"], 0)


def test_reset_option_task_id_picks_the_task(make_fact_env) -> None:
    _, info = make_fact_env().reset(options={"task_id": "melville-birthplace"})
    assert info["task_id"] == "melville-birthplace"


def test_reset_option_task_index_picks_the_task(make_fact_env) -> None:
    _, info = make_fact_env().reset(options={"task_index": 1})
    assert info["task_id"] == "capital-japan"


def test_reset_unknown_task_id_raises_key_error_naming_it(make_fact_env) -> None:
    with pytest.raises(KeyError, match="no task with id 'capital-mars'"):
        make_fact_env().reset(options={"task_id": "capital-mars"})


@pytest.mark.parametrize("options", ["capital-france", ["task_id"], 3])
def test_reset_options_that_are_not_a_dict_raise_type_error(make_fact_env, options) -> None:
    with pytest.raises(TypeError, match=r"reset options must be a dict such as \{'task_id': \.\.\.\}, got "):
        make_fact_env().reset(options=options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"taskid": "capital-france"}, r"unknown reset option\(s\) 'taskid'; ToolEnv takes 'task_id' or 'task_index'"),
        ({"task_id": "capital-france", "task_index": 0}, "give one of 'task_id' and 'task_index', not both"),
        ({"task_index": "first"}, r"task_index must be an int \(taken modulo the 3 tasks\), got 'first'"),
        ({"task_index": 1.5}, r"task_index must be an int \(taken modulo the 3 tasks\), got 1.5"),
    ],
)
def test_reset_bad_options_raise_value_error_naming_the_fix(make_fact_env, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_fact_env().reset(options=options)


def test_reset_with_empty_options_draws_a_task(make_fact_env) -> None:
    assert make_fact_env().reset(seed=0, options={})[1]["task_id"] in {task.id for task in FACT_TASKS}


def test_reset_starts_a_fresh_context(make_fact_env) -> None:
    env = started(make_fact_env())
    env.step(lookup("France"))
    _, info = env.reset(seed=0)
    assert len(info["messages"]) == 2


# ---------------------------------------------------------------------------------------------- step


def test_step_info_has_the_contract_keys(make_fact_env) -> None:
    *_, info = started(make_fact_env()).step(lookup("France"))
    assert {"messages", "reward_components", "tool_calls", "task_id", "turn"} <= set(info)


def test_step_observation_is_the_tool_response(make_fact_env) -> None:
    observation, *_ = started(make_fact_env()).step(lookup("France"))
    assert observation == "<tool_response>\nFrance is a country whose capital is Paris.\n</tool_response>"


def test_step_appends_turn_and_result_to_messages(make_fact_env) -> None:
    *_, info = started(make_fact_env()).step(lookup("France"))
    assert [m["role"] for m in info["messages"]] == ["system", "user", "assistant", "tool"]


def test_step_reports_tool_calls_with_ok_and_error(make_fact_env) -> None:
    *_, info = started(make_fact_env()).step(lookup("France"))
    assert [(c["name"], c["arguments"], c["ok"], c["error"]) for c in info["tool_calls"]] == [
        ("lookup", {"title": "France"}, True, None)
    ]


@tool
def unreliable(title: str) -> str:
    """Fail to look anything up.

    Args:
        title: the entry's title.
    """
    raise ConnectionError("the encyclopedia is offline")


def test_step_reports_the_error_text_of_a_failed_call(make_fact_env) -> None:
    env = started(ToolEnv(list(FACT_TASKS), [unreliable]))
    call = f"<tool_call>{json.dumps({'name': 'unreliable', 'arguments': {'title': 'France'}})}</tool_call>"
    *_, info = env.step(call)
    assert [(c["ok"], c["error"]) for c in info["tool_calls"]] == [
        (False, "unreliable failed: ConnectionError: the encyclopedia is offline")
    ]


def test_step_counts_turns(make_fact_env) -> None:
    env = started(make_fact_env())
    env.step(lookup("France"))
    *_, info = env.step(lookup("Japan"))
    assert info["turn"] == 2


def test_step_runs_several_calls_of_one_turn_as_one_batch(make_fact_env) -> None:
    env = started(make_fact_env())
    env.step(lookup("France") + lookup("Japan"))
    assert env.tools["lookup"].batches == [2]


def test_step_runs_only_calls_within_the_cap(make_fact_env) -> None:
    env = started(make_fact_env(max_calls_per_turn=2))
    env.step(lookup("France") + lookup("Japan") + lookup("Moby Dick"))
    assert env.tools["lookup"].batches == [2]


def test_step_clips_long_tool_output(make_fact_env) -> None:
    env = started(make_fact_env(max_tool_output_chars=40))
    *_, info = env.step(lookup("France"))
    assert len(info["messages"][-1]["content"]) <= 40


def test_step_with_non_str_action_is_a_format_error(make_fact_env) -> None:
    observation, *_ = started(make_fact_env()).step(123)
    assert "an action must be text (str), got int." in observation


def test_step_before_reset_raises_reset_needed(make_fact_env) -> None:
    with pytest.raises(gym.error.ResetNeeded):
        make_fact_env().step(answer("Paris"))


def test_step_after_episode_end_raises_reset_needed(make_fact_env) -> None:
    env = started(make_fact_env())
    env.step(answer("Paris"))
    with pytest.raises(gym.error.ResetNeeded):
        env.step(answer("Paris"))


def test_info_messages_are_a_copy(make_fact_env) -> None:
    env = started(make_fact_env())
    _, info = env.reset(seed=0)
    info["messages"].clear()
    *_, info = env.step(lookup("France"))
    assert len(info["messages"]) == 4


# ---------------------------------------------------------------------------------------------- episode end


def test_answer_terminates(make_fact_env) -> None:
    _, _, terminated, truncated, _ = started(make_fact_env()).step(answer("Paris"))
    assert (terminated, truncated) == (True, False)


def test_final_info_reports_answer_and_gold(make_fact_env) -> None:
    *_, info = started(make_fact_env(), "capital-japan").step(answer("Tokio"))
    assert (info["answer"], info["gold_answers"]) == ("Tokio", ["Tokyo", "Tokio"])


def test_observation_is_empty_when_the_episode_ends(make_fact_env) -> None:
    observation, *_ = started(make_fact_env()).step(answer("Paris"))
    assert observation == ""


def test_answer_wins_over_calls_in_the_same_turn(make_fact_env) -> None:
    env = started(make_fact_env())
    *_, info = env.step(lookup("France") + answer("Paris"))
    assert (info["ignored_tool_calls"], env.tools["lookup"].batches) == (1, [])


def test_answer_next_to_a_call_is_a_well_formed_final_turn(make_fact_env) -> None:
    _, reward, terminated, _, info = started(make_fact_env()).step(lookup("France") + answer("Paris"))
    assert (terminated, reward, info["reward_components"]["format"], info["tool_calls"]) == (True, 1.0, 1.0, [])


@pytest.mark.parametrize(
    ("tool_format", "action"),
    [
        ("hermes", lookup("<answer>Paris</answer>")),
        ("xml", "<lookup>France</information><answer>Paris</answer></lookup>"),
    ],
)
def test_answer_inside_a_tool_call_does_not_end_the_episode(make_fact_env, tool_format: str, action: str) -> None:
    _, _, terminated, _, info = started(make_fact_env(tool_format=tool_format)).step(action)
    assert (terminated, len(info["tool_calls"])) == (False, 1)


def test_truncated_at_max_turns(make_fact_env) -> None:
    env = started(make_fact_env(max_turns=2))
    env.step(lookup("France"))
    _, _, terminated, truncated, _ = env.step(lookup("France"))
    assert (terminated, truncated) == (False, True)


def test_not_truncated_before_max_turns(make_fact_env) -> None:
    _, _, _, truncated, _ = started(make_fact_env(max_turns=2)).step(lookup("France"))
    assert not truncated


def test_observation_is_empty_when_truncated(make_fact_env) -> None:
    observation, *_ = started(make_fact_env(max_turns=1)).step(lookup("France"))
    assert observation == ""


def test_truncated_when_the_context_budget_is_spent(make_fact_env) -> None:
    _, info = make_fact_env().reset(seed=0, options={"task_id": "capital-france"})
    budget = context_chars(info["messages"]) + 50  # the turn plus its tool response take more than 50
    _, _, terminated, truncated, _ = started(make_fact_env(max_context_chars=budget, max_turns=50)).step(
        lookup("France")
    )
    assert (terminated, truncated) == (False, True)


def test_truncated_episode_has_no_answer(make_fact_env) -> None:
    *_, info = started(make_fact_env(max_turns=1)).step(lookup("France"))
    assert (info["answer"], info["reward_components"]["em"]) == (None, 0.0)


# ---------------------------------------------------------------------------------------------- context policy


def test_append_policy_keeps_every_turn(make_fact_env) -> None:
    env = started(make_fact_env(context="append", max_turns=10))
    for _ in range(3):
        *_, info = env.step(lookup("France"))
    assert len(info["messages"]) == 2 + 3 * 2


def test_window_policy_keeps_prompt_and_last_turns(make_fact_env) -> None:
    env = started(make_fact_env(context="window", window_turns=1, max_turns=10))
    env.step(lookup("France"))
    *_, info = env.step(lookup("Japan"))
    assert [m["content"] for m in info["messages"][1:]] == [
        "What is the capital of France?",
        lookup("Japan"),
        "Japan is a country whose capital is Tokyo.",
    ]


def test_window_policy_flags_context_rewritten_when_it_drops_turns(make_fact_env) -> None:
    env = started(make_fact_env(context="window", window_turns=1, max_turns=10))
    env.step(lookup("France"))
    *_, info = env.step(lookup("Japan"))
    assert info["context_rewritten"] is True


def test_window_policy_does_not_flag_while_all_turns_fit(make_fact_env) -> None:
    *_, info = started(make_fact_env(context="window", window_turns=1)).step(lookup("France"))
    assert info["context_rewritten"] is False


def test_window_policy_keeps_the_system_prompt(make_fact_env) -> None:
    env = started(make_fact_env(context="window", window_turns=1, max_turns=10))
    for _ in range(3):
        *_, info = env.step(lookup("France"))
    assert info["messages"][0]["role"] == "system"


def summarized(env: ToolEnv, *titles: str) -> dict:
    """Look up each title in turn; return the last step's info."""
    for title in titles:
        *_, info = env.step(lookup(title))
    return info


def test_summarize_policy_folds_older_turns_into_one_summary_message(make_fact_env) -> None:
    env = started(make_fact_env(context="summarize", window_turns=1, max_turns=10))
    info = summarized(env, "France", "Japan")
    assert [(m["role"], m["content"]) for m in info["messages"][1:]] == [
        ("user", "What is the capital of France?"),
        ("user", "Summary of your earlier turns:\n"
                 '- lookup {"title": "France"} -> France is a country whose capital is Paris.'),
        ("assistant", lookup("Japan")),
        ("tool", "Japan is a country whose capital is Tokyo."),
    ]


def test_summarize_policy_flags_context_rewritten_only_when_it_folds(make_fact_env) -> None:
    env = started(make_fact_env(context="summarize", window_turns=1, max_turns=10))
    *_, first = env.step(lookup("France"))
    *_, second = env.step(lookup("Japan"))
    assert (first["context_rewritten"], second["context_rewritten"]) == (False, True)


def test_summarize_policy_keeps_one_summary_of_every_folded_turn(make_fact_env) -> None:
    env = started(make_fact_env(context="summarize", window_turns=1, max_turns=10))
    info = summarized(env, "France", "Japan", "Moby Dick", "Herman Melville")
    summaries = [m["content"] for m in info["messages"] if m["content"].startswith("Summary of your earlier turns")]
    assert len(summaries) == 1 and all(f'"title": "{title}"' in summaries[0]
                                       for title in ("France", "Japan", "Moby Dick"))


def test_summarize_policy_keeps_the_summary_within_its_budget(make_fact_env) -> None:
    env = started(make_fact_env(context="summarize", window_turns=1, max_turns=20, summary_chars=200))
    info = summarized(env, *["France", "Japan", "Moby Dick", "Herman Melville"] * 3)
    (summary,) = [m["content"] for m in info["messages"] if m["content"].startswith("Summary of your earlier turns")]
    assert len(summary) <= 200 and '"title": "Moby Dick"' in summary  # the newest folded calls are kept


def test_summarize_policy_calls_a_user_summarizer_with_the_folded_messages(make_fact_env) -> None:
    seen: list[list[dict]] = []

    def count_turns(messages: list[dict]) -> str:
        seen.append(messages)
        return f"{sum(m['role'] == 'assistant' for m in messages)} earlier turns."

    env = started(make_fact_env(context="summarize", window_turns=1, max_turns=10, summarizer=count_turns))
    info = summarized(env, "France", "Japan", "Moby Dick")
    assert info["messages"][2]["content"] == "Summary of your earlier turns:\n2 earlier turns."
    assert [m["role"] for m in seen[-1]] == ["assistant", "tool", "assistant", "tool"]


def test_summarizer_that_returns_no_str_raises_type_error(make_fact_env) -> None:
    env = started(make_fact_env(context="summarize", window_turns=1, max_turns=10, summarizer=lambda m: None))
    env.step(lookup("France"))
    with pytest.raises(TypeError, match="summarizer must return a str, got NoneType"):
        env.step(lookup("Japan"))


def test_summary_budget_below_its_minimum_is_refused(make_fact_env) -> None:
    with pytest.raises(ValueError, match=r"summary_chars must be at least 100 \(an integer\), got 20"):
        make_fact_env(context="summarize", summary_chars=20)


def test_summarizer_without_the_summarize_policy_is_refused(make_fact_env) -> None:
    with pytest.raises(ValueError, match="summarizer is used only with context='summarize'"):
        make_fact_env(summarizer=lambda messages: "")


def test_summarize_policy_restarts_with_each_episode(make_fact_env) -> None:
    env = started(make_fact_env(context="summarize", window_turns=1, max_turns=10))
    summarized(env, "France", "Japan")
    env.reset(seed=0, options={"task_id": "capital-japan"})
    info = summarized(env, "Moby Dick", "Herman Melville")
    assert "France" not in info["messages"][2]["content"] and "Moby Dick" in info["messages"][2]["content"]


@pytest.mark.parametrize("tool_format", ["hermes", "xml", "openai"])
def test_summarize_policy_names_each_folded_call_in_every_format(make_fact_env, tool_format: str) -> None:
    env = started(make_fact_env(context="summarize", window_turns=1, max_turns=10, tool_format=tool_format))
    for title in ("France", "Japan"):
        *_, info = env.step(env.tool_format.render_call(ToolCall("lookup", {"title": title}, "call_0")))
    assert info["messages"][2]["content"] == (
        "Summary of your earlier turns:\n"
        '- lookup {"title": "France"} -> France is a country whose capital is Paris.'
    )


# ---------------------------------------------------------------------------------------------- rewards


def test_correct_answer_in_right_format_pays_one(make_fact_env) -> None:
    env = started(make_fact_env())
    env.step(lookup("France"))
    _, reward, *_ = env.step(answer("Paris"))
    assert reward == 1.0


def test_wrong_answer_in_right_format_pays_zero(make_fact_env) -> None:
    _, reward, *_ = started(make_fact_env()).step(answer("Lyon"))
    assert reward == 0.0


def test_paper_outcome_after_a_malformed_turn_is_format_score_minus_one(make_fact_env) -> None:
    env = started(make_fact_env())
    env.step("no call, no answer")
    _, reward, *_ = env.step(answer("Paris"))
    assert reward == -0.5  # Agent-R1 Eq. 6: 1 of 2 turns well formed -> 0.5 - 1


def test_truncated_episode_outcome_is_format_score_minus_one(make_fact_env) -> None:
    *_, info = started(make_fact_env(max_turns=1)).step(lookup("France"))
    components = info["reward_components"]
    assert components["outcome"] == components["format_score"] - 1.0


def test_paper_reward_components_are_all_reported(make_fact_env) -> None:
    *_, info = started(make_fact_env(reward="paper")).step(answer("Paris"))
    assert set(info["reward_components"]) == {
        "format",
        "format_penalty",
        "process",
        "outcome",
        "format_score",
        "em",
        "f1",
        "precision",
        "recall",
        "sub_em",
    }


def test_dense_reward_components_are_all_reported(make_fact_env) -> None:
    *_, info = started(make_fact_env(reward="dense")).step(answer("Paris"))
    assert set(info["reward_components"]) == {
        "format",
        "format_penalty",
        "process",
        "outcome",
        "format_score",
        "em",
        "f1",
        "precision",
        "recall",
        "sub_em",
    }


def test_mid_episode_components_report_format_and_process(make_fact_env) -> None:
    *_, info = started(make_fact_env(reward="paper")).step(lookup("France"))
    assert info["reward_components"] == {"format": 1.0, "format_penalty": 0.0, "process": 0.0, "outcome": 0.0}


def test_reward_is_the_sum_of_its_components(make_fact_env) -> None:
    _, reward, *_, info = started(make_fact_env(reward="dense")).step(lookup("France") + "<tool_call>")
    components = info["reward_components"]
    assert reward == components["format_penalty"] + components["process"] + components["outcome"] != 0.0


def test_reward_terms_are_what_is_paid_and_reward_scores_what_is_only_reported(make_fact_env) -> None:
    env = started(make_fact_env(reward="dense"))
    _, penalized, *_, malformed = env.step("no call, no answer")
    _, paid, *_, final = env.step(answer("Paris"))
    assert (set(final["reward_terms"]), set(final["reward_scores"])) == ({"format_penalty", "process", "outcome"},
                                                                         {"format", "format_score", "em", "f1",
                                                                          "precision", "recall", "sub_em"})
    assert (sum(malformed["reward_terms"].values()), sum(final["reward_terms"].values())) == (penalized, paid)
    assert sum(final["reward_components"].values()) != paid  # why the merged dict is deprecated


def test_dense_pays_process_reward_for_gold_evidence(make_fact_env) -> None:
    _, reward, *_ = started(make_fact_env(reward="dense")).step(lookup("France"))
    assert reward == pytest.approx(0.1)


def test_dense_pays_nothing_for_non_gold_evidence(make_fact_env) -> None:
    _, reward, *_ = started(make_fact_env(reward="dense")).step(lookup("Japan"))
    assert reward == 0.0


def test_dense_pays_gold_evidence_only_once(make_fact_env) -> None:
    env = started(make_fact_env(reward="dense"))
    env.step(lookup("France"))
    _, reward, *_ = env.step(lookup("France"))
    assert reward == 0.0


def test_dense_process_reward_is_capped_per_episode(make_fact_env) -> None:
    env = started(make_fact_env(reward=get_reward_spec("dense", process_cap=0.15)), "melville-birthplace")
    rewards = [env.step(lookup(title))[1] for title in ("Moby Dick", "Herman Melville")]
    assert rewards == pytest.approx([0.1, 0.05])


def test_dense_episode_total_is_outcome_plus_process(make_fact_env) -> None:
    env = started(make_fact_env(reward="dense"))
    total = env.step(lookup("France"))[1] + env.step(answer("Paris"))[1]
    assert total == pytest.approx(1.1)


def test_dense_pays_a_tools_own_process_reward() -> None:
    class Rewarding(FactLookup):
        def run(self, title: str) -> ToolResult:
            return ToolResult(text="noted", reward=1.0)

    env = ToolEnv(list(FACT_TASKS), [Rewarding()], reward="dense")
    env.reset(seed=0, options={"task_id": "capital-japan"})
    _, reward, *_ = env.step(lookup("anything"))
    assert reward == pytest.approx(0.1)


def test_dense_charged_charges_a_call_that_finds_no_new_gold_evidence(make_fact_env) -> None:
    env = started(make_fact_env(reward="dense_charged"))
    rewards = [env.step(action)[1] for action in (lookup("France"), lookup("France"), lookup("Japan"))]
    assert rewards == pytest.approx([0.1, -0.1, -0.1])  # found, repeated, off the question


def test_dense_charged_keeps_paying_each_new_gold_page(make_fact_env) -> None:
    env = started(make_fact_env(reward="dense_charged"), "melville-birthplace")
    rewards = [env.step(lookup(title))[1] for title in ("Moby Dick", "Herman Melville")]
    assert rewards == pytest.approx([0.1, 0.1])  # the second search of a 2-hop question is not idle


def test_dense_charged_total_separates_one_search_from_two_on_a_one_hop_question(make_fact_env) -> None:
    def episode(*actions: str) -> float:
        env = started(make_fact_env(reward="dense_charged"))
        return sum(env.step(action)[1] for action in actions)

    once = episode(lookup("France"), answer("Paris"))
    twice = episode(lookup("France"), lookup("Moby Dick"), answer("Paris"))
    assert (once, twice) == pytest.approx((1.1, 1.0))


def test_dense_charged_charges_are_capped_per_episode(make_fact_env) -> None:
    env = started(make_fact_env(reward=get_reward_spec("dense_charged", process_cap=0.15), max_turns=6))
    rewards = [env.step(lookup("Japan"))[1] for _ in range(3)]
    assert rewards == pytest.approx([-0.1, -0.05, 0.0])


def test_dense_charged_leaves_a_failed_call_to_the_format_score() -> None:
    class Failing(FactLookup):
        def run(self, title: str) -> ToolResult:
            return ToolResult.error("the index is down")

    env = ToolEnv(list(FACT_TASKS), [Failing()], reward="dense_charged")
    env.reset(seed=0, options={"task_id": "capital-japan"})
    *_, info = env.step(lookup("Japan"))
    assert info["reward_terms"]["process"] == 0.0


def test_plain_dense_does_not_charge_an_idle_call(make_fact_env) -> None:
    env = started(make_fact_env(reward="dense"))
    assert [env.step(lookup("Japan"))[1] for _ in range(2)] == [0.0, 0.0]


def test_evidence_recall_counts_retrieved_gold_titles(make_fact_env) -> None:
    *_, info = started(make_fact_env(), "melville-birthplace").step(lookup("Moby Dick"))
    assert info["evidence_recall"] == 0.5


def test_evidence_recall_starts_at_zero(make_fact_env) -> None:
    _, info = make_fact_env().reset(options={"task_id": "melville-birthplace"})
    assert info["evidence_recall"] == 0.0


def test_checker_replaces_exact_match() -> None:
    task = Task("six-times-seven", "What is 6 * 7?", ("42",), checker=lambda text: float(float(text) == 42))
    env = ToolEnv([task], [FactLookup()])
    env.reset(seed=0)
    *_, info = env.step(answer("42.0"))  # EM against "42" would be 0
    assert info["reward_components"]["em"] == 1.0


# ---------------------------------------------------------------------------------------------- seeding


def _trajectory(env: ToolEnv, seed: int) -> list:
    observation, info = env.reset(seed=seed)
    steps = [(observation, info["task_id"])]
    for action in (lookup("France"), "junk", lookup("Moby Dick"), answer("Paris")):
        observation, reward, terminated, truncated, info = env.step(action)
        steps.append((observation, reward, terminated, truncated))
        if terminated or truncated:
            break
    return steps


def test_same_seed_gives_same_task(make_fact_env) -> None:
    assert make_fact_env().reset(seed=5)[1]["task_id"] == make_fact_env().reset(seed=5)[1]["task_id"]


def test_seeds_spread_over_tasks(make_fact_env) -> None:
    env = make_fact_env()
    assert len({env.reset(seed=seed)[1]["task_id"] for seed in range(30)}) == len(FACT_TASKS)


def test_same_seed_gives_same_trajectory(make_fact_env) -> None:
    assert _trajectory(make_fact_env(), seed=11) == _trajectory(make_fact_env(), seed=11)


def test_unseeded_resets_continue_the_seeded_stream(make_fact_env) -> None:
    first, second = make_fact_env(), make_fact_env()
    first.reset(seed=3)
    second.reset(seed=3)
    assert [first.reset()[1]["task_id"] for _ in range(5)] == [second.reset()[1]["task_id"] for _ in range(5)]


# ---------------------------------------------------------------------------------------------- lifecycle


def test_close_is_idempotent(make_fact_env) -> None:
    env = started(make_fact_env())
    env.close()
    env.close()
    with pytest.raises(gym.error.ResetNeeded):
        env.step(answer("Paris"))


def test_close_before_reset_is_fine(make_fact_env) -> None:
    env = make_fact_env()
    env.close()
    assert env.reset(seed=0)[0]


def test_render_ansi_returns_recent_messages(make_fact_env) -> None:
    env = started(make_fact_env(render_mode="ansi"))
    env.step(lookup("France"))
    assert "[tool] France is a country whose capital is Paris." in env.render()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"context": "forget"}, "context must be one of"),
        ({"max_turns": 0}, "max_turns must be at least 1"),
        ({"max_turns": 2.5}, r"max_turns must be at least 1 \(an integer\), got 2.5"),
        ({"max_action_chars": 0}, "max_action_chars must be at least 1"),
        ({"max_tool_output_chars": -1}, "max_tool_output_chars must be at least 1"),
        ({"max_context_chars": 0}, "max_context_chars must be at least 1"),
        ({"max_context_chars": 300}, r"max_context_chars=300 cannot hold the system prompt \(\d+ characters\)"),
        ({"render_mode": "rgb_array"}, "render_mode must be one of"),
        ({"tasks": []}, "at least one task"),
    ],
)
def test_invalid_settings_raise_value_error(make_fact_env, settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_fact_env(**settings)


def test_xml_env_refuses_a_tool_named_answer() -> None:
    @tool
    def answer(text: str) -> str:
        """Answer.

        Args:
            text: the answer.
        """
        return text

    with pytest.raises(ValueError, match="the xml format cannot call a tool named 'answer'"):
        ToolEnv(list(FACT_TASKS), [answer], tool_format="xml")


def test_reset_observation_fits_the_observation_space_of_the_smallest_budget(make_fact_env) -> None:
    system = len(make_fact_env().reset(seed=0)[1]["messages"][0]["content"])
    long_question = Task("long", "Why? " * 1_000, ("because",))
    env = make_fact_env(tasks=[long_question], max_context_chars=system + 1)
    observation, _ = env.reset(seed=0)
    assert env.observation_space.contains(observation)


def test_tool_output_limit_smaller_than_the_truncation_note_still_holds(make_fact_env) -> None:
    env = started(make_fact_env(max_tool_output_chars=5))
    *_, info = env.step(lookup("France"))
    assert len(info["messages"][-1]["content"]) <= 5


def test_duplicate_tool_names_raise_value_error() -> None:
    with pytest.raises(ValueError, match="two tools are named 'lookup'"):
        ToolEnv(list(FACT_TASKS), [FactLookup(), FactLookup()])


def test_tasks_and_tools_may_be_factories() -> None:
    env = ToolEnv(lambda: list(FACT_TASKS), lambda: [FactLookup()])
    assert env.reset(seed=0, options={"task_index": 0})[0] == "What is the capital of France?"
