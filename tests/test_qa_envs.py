"""The paper's three QA envs run real episodes on the shared dev samples, with every retrieval backend."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest
from support.data import DATA_DIR, QA_SAMPLES

import agent_gym  # noqa: F401 - registers the ids
from agent_gym.evaluation import evaluate, summarize
from agent_gym.policies import make_policy

SAMPLES = QA_SAMPLES
BACKENDS = [
    "bm25",
    "bm25s",
    pytest.param("pyserini", marks=pytest.mark.slow),
    pytest.param("dense", marks=pytest.mark.slow),
    pytest.param("hybrid", marks=pytest.mark.slow),
]
# a few questions keep the distractor corpus small (about 10 paragraphs a question), so dense encoding is quick
LIMIT = 8

pytestmark = pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"shared data samples not found at {DATA_DIR}")


@pytest.mark.parametrize("retriever", BACKENDS)
@pytest.mark.parametrize("env_id", sorted(SAMPLES))
def test_gold_search_finds_the_evidence_and_answers_with_every_backend(env_id, retriever):
    env = gym.make(env_id, data_path=str(SAMPLES[env_id]), limit=LIMIT, retriever=retriever)
    records = evaluate(env, make_policy("gold-search"), LIMIT, progress=False)
    env.close()
    assert summarize(records)["evidence_recall"] >= 0.75
    # gold-search answers gold when every supporting page came back (as the oracle does), "unknown" otherwise
    assert [record.em for record in records] == [float(record.evidence_recall == 1.0) for record in records]
    assert summarize(records)["em"] >= 0.75


@pytest.mark.parametrize("env_id", sorted(SAMPLES))
def test_dense_reward_pays_a_capped_process_reward_for_finding_gold_evidence(env_id):
    env = gym.make(env_id, data_path=str(SAMPLES[env_id]), limit=LIMIT, reward="dense")
    records = evaluate(env, make_policy("gold-search"), LIMIT, progress=False)
    env.close()
    # every episode answers right (outcome 1.0) and earns some, but at most 0.3, process reward
    assert all(1.0 < record.reward <= 1.3 + 1e-9 for record in records)


def test_a_dead_search_server_becomes_a_failed_tool_result_not_a_crash():
    env = gym.make("AgentR1-HotpotQA-v0", data_path=str(SAMPLES["AgentR1-HotpotQA-v0"]), limit=2,
                   corpus="http://127.0.0.1:9")  # nothing listens on the discard port
    env.reset(seed=0)
    observation, _, terminated, truncated, info = env.step(
        '<tool_call>{"name": "search", "arguments": {"query": "Scott Derrickson"}}</tool_call>')
    env.close()
    assert "search is unavailable" in observation and info["tool_calls"][0]["ok"] is False
    assert not (terminated or truncated)


def test_a_hung_search_server_costs_one_step_at_most_the_envs_search_timeout(hanging_search_server):
    env = gym.make("AgentR1-HotpotQA-v0", data_path=str(SAMPLES["AgentR1-HotpotQA-v0"]), limit=2,
                   corpus=hanging_search_server, search_timeout=1.5)
    env.reset(seed=0)
    started = time.monotonic()
    observation, _, terminated, truncated, info = env.step(
        '<tool_call>{"name": "search", "arguments": {"query": "Scott Derrickson"}}</tool_call>')
    elapsed = time.monotonic() - started
    env.close()
    assert "did not answer within 1.5 s" in observation and info["tool_calls"][0]["ok"] is False
    assert elapsed < 10 and not (terminated or truncated)  # two minutes before the limit existed


def test_a_missing_corpus_path_is_refused_with_the_command_that_builds_an_index(tmp_path):
    with pytest.raises(FileNotFoundError, match="agent-gym index build"):
        gym.make("AgentR1-HotpotQA-v0", data_path=str(SAMPLES["AgentR1-HotpotQA-v0"]), limit=2,
                 corpus=str(tmp_path / "no-such-corpus.jsonl"))


def test_an_index_built_by_the_cli_serves_the_env_as_its_corpus(tmp_path):
    from agent_gym.cli import main
    from agent_gym.envs.datasets import load_dataset
    from agent_gym.retrieval_index.corpus import write_corpus

    _, corpus = load_dataset("hotpotqa", data_path=SAMPLES["AgentR1-HotpotQA-v0"], limit=LIMIT)
    write_corpus(corpus, tmp_path / "corpus.jsonl")
    assert main(["index", "build", "--corpus", str(tmp_path / "corpus.jsonl"), "--backend", "bm25",
                 "--out", str(tmp_path / "index")]) == 0
    env = gym.make("AgentR1-HotpotQA-v0", data_path=str(SAMPLES["AgentR1-HotpotQA-v0"]), limit=LIMIT,
                   corpus=str(tmp_path / "index"))
    summary = summarize(evaluate(env, make_policy("gold-search"), LIMIT, progress=False))
    env.close()
    assert summary["evidence_recall"] >= 0.75
