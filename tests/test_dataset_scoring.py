"""Each dataset is scored as its official scorer scores it: 2Wiki's aliases, MuSiQue-Full's unanswerable
records, the Search-R1 parquet's data sources; and a file is not labelled with a setting it is not."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from support.data import DATA_DIR, HOTPOT_SAMPLE, MUSIQUE_SAMPLE, SEARCH_R1_PARQUET, TWOWIKI_SAMPLE

import agent_gym  # noqa: F401  (registers the ids)

needs_samples = pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"shared data samples not found at {DATA_DIR}")
STRANGE_VOYAGE = "298f23b8088a11ebbd6eac1f6bf848b6"  # answer "El Extraño Viaje", Wikidata Q5352428


@needs_samples
def test_2wiki_env_takes_aliases_path_and_scores_an_alias_as_the_official_scorer_does(tmp_path: Path) -> None:
    aliases = tmp_path / "my_aliases.json"
    aliases.write_text(json.dumps({"Q_id": "Q5352428", "aliases": ["The Strange Voyage"], "demonyms": []}) + "\n")
    env = gym.make("AgentR1-2WikiMultihopQA-v0", data_path=str(TWOWIKI_SAMPLE), limit=3, aliases_path=str(aliases))
    env.reset(options={"task_id": STRANGE_VOYAGE})
    _, _, terminated, _, info = env.step("<answer>The Strange Voyage</answer>")
    assert terminated and info["reward_components"]["em"] == 1.0


@needs_samples
def test_2wiki_without_aliases_warns_once(tmp_path: Path) -> None:
    from agent_gym.envs.datasets import load_dataset

    copy = tmp_path / "dev.json.xz"  # a path of its own: no other test has warned about it
    copy.write_bytes(TWOWIKI_SAMPLE.read_bytes())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_dataset("2wikimultihopqa", data_path=copy, limit=2)
        load_dataset("2wikimultihopqa", data_path=copy, limit=3)
    messages = [str(warning.message) for warning in caught if "id_aliases.json" in str(warning.message)]
    assert len(messages) == 1 and "aliases_path=" in messages[0]
    (tmp_path / "id_aliases.json").write_text(json.dumps({"Q_id": "Q1", "aliases": ["x"], "demonyms": []}) + "\n")
    other = tmp_path / "again"
    other.mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_dataset("2wikimultihopqa", data_path=copy, limit=2, aliases_path=tmp_path / "id_aliases.json")
    assert not [warning for warning in caught if "id_aliases.json" in str(warning.message)]


def _xz_lines(path: Path) -> list[dict]:
    import lzma

    return [json.loads(line) for line in lzma.open(path, "rt", encoding="utf-8") if line.strip()]


@needs_samples
def test_musique_full_loads_and_leaves_the_unanswerable_copies_out_of_the_tasks(tmp_path: Path) -> None:
    from agent_gym.envs.datasets import load_dataset

    full = []
    for record in _xz_lines(MUSIQUE_SAMPLE)[:4]:  # MuSiQue-Full: each question twice under one id
        unanswerable = dict(record, answerable=False,
                            paragraphs=[dict(p, is_supporting=False) for p in record["paragraphs"]])
        full += [record, unanswerable]
    path = tmp_path / "musique_full_v1.0_dev.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in full))
    tasks, corpus = load_dataset("musique", data_path=path)
    assert [task.id for task in tasks] == [record["id"] for record in full[::2]]
    assert all(task.metadata["answerable"] for task in tasks) and corpus
    assert len(load_dataset("musique", data_path=path, limit=2)[0]) == 2


@pytest.mark.parametrize(("source", "rule"), [("hotpotqa", "hotpotqa"), ("2wiki", "2wikimultihopqa"),
                                              ("musique", "musique"), ("nq", "squad"), ("Bamboogle", "squad")])
def test_a_search_r1_row_is_scored_by_its_sources_rule(source: str, rule: str) -> None:
    from agent_gym.envs.datasets.searchr1_parquet import task_from_row

    row = {"data_source": source, "question": "Is it?", "reward_model": {"ground_truth": {"target": ["yes"]}},
           "prompt": [{"role": "user", "content": "Question: Is it?"}]}
    assert task_from_row(row).metadata["answer_rule"] == rule


def test_a_tool_env_scores_each_task_by_its_own_rule(make_fact_env) -> None:
    from dataclasses import replace

    from conftest import FACT_TASKS

    # "yes" against the gold "yes sir": HotpotQA's yes/no rule pays F1 0; SQuAD's pays the shared token
    tasks = [replace(FACT_TASKS[0], answers=("yes sir",), metadata={"answer_rule": rule})
             for rule in ("hotpotqa", "squad")]
    f1 = []
    for task in tasks:
        env = make_fact_env([task])
        env.reset(options={"task_index": 0})
        f1.append(env.step("<answer>yes</answer>")[4]["reward_components"]["f1"])
    assert f1 == [0.0, pytest.approx(2 / 3)]


@needs_samples
def test_search_r1_parquet_rows_carry_their_sources_rule() -> None:
    from agent_gym.envs.datasets import load_searchr1_parquet

    tasks = load_searchr1_parquet(SEARCH_R1_PARQUET, data_source=["2wiki", "nq"])
    assert {task.kind: task.metadata["answer_rule"] for task in tasks} == {"2wiki": "2wikimultihopqa",
                                                                            "nq": "squad"}


@needs_samples
def test_a_distractor_file_given_with_the_fullwiki_setting_is_refused() -> None:
    from agent_gym.envs.datasets import DatasetFormatError, load_dataset

    with pytest.raises(DatasetFormatError, match="distractor setting's file, not the fullwiki one"):
        load_dataset("hotpotqa", data_path=HOTPOT_SAMPLE, setting="fullwiki")
    with pytest.raises(ValueError, match="hotpot_dev_fullwiki_v1.json"):
        gym.make("AgentR1-HotpotQA-v0", data_path=str(HOTPOT_SAMPLE), setting="fullwiki", limit=2)
