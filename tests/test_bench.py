"""`agent-gym bench`: one JSONL schema for every library, a table with mean ± spread, curves, clear refusals."""

from __future__ import annotations

import json

import pytest

from agent_gym.bench.report import BenchRecord, format_table, plot_curves, read_records
from agent_gym.cli import main

SMALL = ["--env-kwarg", "hops=1", "--env-kwarg", "num_pages=200", "--env-kwarg", "num_questions=20"]


def _records() -> list[BenchRecord]:
    return [
        BenchRecord("ours-grpo", "0.1.0", 0, 0, 0.0, eval_em=0.0, eval_f1=0.1),
        BenchRecord("ours-grpo", "0.1.0", 0, 32, 10.0, train_reward=-0.5, eval_em=0.2, eval_f1=0.3, tokens=900,
                    final=True, peak_rss_mb=500.0),
        BenchRecord("ours-grpo", "0.1.0", 1, 32, 20.0, train_reward=-0.4, eval_em=0.4, eval_f1=0.5, tokens=1100,
                    final=True, peak_rss_mb=600.0),
        BenchRecord("trl-grpo", "", 0, 0, 0.0, status="not installed: bash scripts/make_peer_venv.sh"),
    ]


def test_the_table_gives_the_final_em_mean_and_spread_over_seeds_and_the_rates():
    table = format_table(_records(), ["ours-grpo", "trl-grpo"])
    row = next(line for line in table.splitlines() if line.startswith("| ours-grpo"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[2:] == ["2", "0.300 ± 0.141", "0.400 ± 0.141", "32", "2.40", "15.0", "600", "1000"]


def test_a_library_that_is_not_installed_is_reported_not_dropped():
    table = format_table(_records(), ["ours-grpo", "trl-grpo"])
    assert "| trl-grpo | | | not installed: bash scripts/make_peer_venv.sh |" in table


def test_records_round_trip_through_jsonl_and_plot(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(record.to_json() + "\n" for record in _records()) + '{"torn')
    records = read_records([path])
    assert records == _records()
    assert plot_curves(records, ["ours-grpo", "trl-grpo"], tmp_path / "curves.png").stat().st_size > 10_000


@pytest.mark.parametrize(("flags", "message"), [
    (["--libraries", "ours-grpo,nope"], "unknown library nope"),
    (["--episodes", "0"], "at least 1"),
    (["--eval-env-kwargs", "[1]"], "JSON object"),
])
def test_bad_arguments_are_one_line_usage_errors(flags, message, capsys, tmp_path):
    assert main(["bench", "--env", "AgentR1-SynthHop-v0", "--out", str(tmp_path), *SMALL, *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_bench_of_scripted_policies_and_sb3_writes_one_schema_a_table_and_curves(tmp_path, capsys):
    pytest.importorskip("stable_baselines3")
    code = main(["bench", "--env", "AgentR1-SynthHop-v0", *SMALL, "--libraries", "random,oracle,sb3-ppo",
                 "--episodes", "8", "--seeds", "1", "--eval-every", "4", "--eval-tasks", "4", "--out", str(tmp_path)])
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {record["library"] for record in records} == {"random", "oracle", "sb3-ppo"}
    assert all(set(record) == set(BenchRecord.__dataclass_fields__) for record in records)
    sb3 = [record for record in records if record["library"] == "sb3-ppo"]
    assert [record["episodes"] for record in sb3] == [0, 4, 8] and sb3[-1]["final"] and sb3[-1]["peak_rss_mb"] > 0
    assert "| oracle | 0.1.0 | 1 | 1.000 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "curves.png").stat().st_size > 10_000
