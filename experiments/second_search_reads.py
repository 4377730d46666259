"""How each 2-hop episode of an RL run went, read from the episodes it trained on (issue 25).

The curves say how often a policy searches again on 2-hop questions and how often it is right; this says why the
rest fail. Each 2-hop episode a run logged (``RUN/rollouts.jsonl``, every episode of every step, decoded) falls in
one class, by its second search:

- ``one search``: it answered after its first search (a 2-hop question cannot be answered right so);
- ``bridge query``: its second query is the bridge entity's title, the page that holds the answer;
- ``bridge page found``: another query whose results still hold the bridge page;
- ``nothing found``: a query the index finds no page for (a name copied wrong, letters dropped or merged);
- ``first entity again``: the question's own entity searched a second time;
- ``another entity``: any other page's title or words.

The run's tasks are rebuilt from its ``run_config.json`` (their gold pages), so the reading needs no model. A run
continued from the repository numbers its local steps from 1; ``offset.json`` gives them back their global numbers.

    python experiments/second_search_reads.py ~/agent-gym-runs/rl-e3/rl/grpo_lr5e-5_kl0.3-e3-warm50-s0 --window 5
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_gym.jsonl import iter_jsonl
from agent_gym.tasks import Task

CLASSES = ("one search", "bridge query", "bridge page found", "nothing found", "first entity again",
           "another entity")
_QUERY = re.compile(r'"query"\s*:\s*"((?:[^"\\]|\\.)*)"')
_TOOL_TURN = "<|im_start|>tool\n"
_NO_RESULTS = "No results"


def tool_results(response: str) -> list[str]:
    """The text of each tool turn of a decoded episode, in order."""
    return [chunk.split("<|im_end|>")[0] for chunk in response.split(_TOOL_TURN)[1:]]


def _unescape(query: str) -> str:
    try:
        return json.loads(f'"{query}"')
    except json.JSONDecodeError:  # a sampled escape JSON does not know, e.g. "\\q": the text as written
        return query


def second_search_class(response: str, task: Task) -> str:
    """The class (one of ``CLASSES``) of a 2-hop episode's second search."""
    queries = [_unescape(query) for query in _QUERY.findall(response)]
    if len(queries) < 2:
        return "one search"
    first_entity, bridge = task.supporting_titles[0], task.supporting_titles[-1]
    query = queries[1].strip().casefold()
    results = tool_results(response)
    if query == bridge.casefold():
        return "bridge query"
    if any(f"(Title: {bridge})" in result for result in results[1:]):
        return "bridge page found"
    if len(results) > 1 and results[1].startswith(_NO_RESULTS):
        return "nothing found"
    if query == first_entity.casefold():
        return "first entity again"
    return "another entity"


def read_run(records: Sequence[Mapping[str, Any]], tasks: Mapping[str, Task], offset: int = 0,
             window: int = 5) -> dict[str, Any]:
    """Each class's count and EM over a run's 2-hop episodes, in all and per ``window`` steps (global numbers)."""
    total: dict[str, Counter] = {name: Counter() for name in CLASSES}
    windows: dict[int, Counter] = defaultdict(Counter)
    for record in records:
        if record.get("task_fields", {}).get("hops") != 2:
            continue
        name = second_search_class(record["response"], tasks[record["task_id"]])
        step = int(record["step"]) + offset
        total[name]["episodes"] += 1
        total[name]["right"] += int(record["em"] >= 1.0)
        start = (step - 1) // window * window + 1
        windows[start][name] += 1
        windows[start]["right"] += int(record["em"] >= 1.0)
    episodes = sum(counter["episodes"] for counter in total.values())
    steps = [int(record["step"]) + offset for record in records if record.get("task_fields", {}).get("hops") == 2]
    return {
        "episodes": episodes, "steps": [min(steps), max(steps)] if steps else [],
        "classes": {name: {"episodes": c["episodes"], "share": c["episodes"] / episodes if episodes else 0.0,
                           "em": c["right"] / c["episodes"] if c["episodes"] else None}
                    for name, c in total.items()},
        "windows": {f"{start}-{start + window - 1}": {
            "episodes": (n := sum(c[name] for name in CLASSES)), "em": c["right"] / n,
            **{name: c[name] / n for name in CLASSES}} for start, c in sorted(windows.items())},
    }


def run_tasks(run_dir: Path) -> dict[str, Task]:
    """The tasks a run trained on, rebuilt from its run_config.json."""
    import gymnasium as gym

    import agent_gym  # noqa: F401  (registers the environments)

    settings = json.loads((run_dir / "run_config.json").read_text())["settings"]
    env = gym.make(settings["env_id"], **settings["env_kwargs"])
    try:
        return {task.id: task for task in env.unwrapped.tasks}
    finally:
        env.close()


def run_offset(run_dir: Path) -> int:
    """The global step before a run's first local step (0 unless it continued from the repository)."""
    path = run_dir / "offset.json"
    return int(json.loads(path.read_text())["offset"]) if path.is_file() else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories holding rollouts.jsonl")
    parser.add_argument("--window", type=int, default=5, help="steps per row of the per-window table")
    parser.add_argument("--json-out", type=Path, default=None, help="write the readings here, one key per run")
    args = parser.parse_args(argv)
    readings = {}
    for run_dir in args.runs:
        if not (run_dir / "rollouts.jsonl").is_file():
            parser.error(f"{run_dir} has no rollouts.jsonl (runs log them with --log-rollouts)")
        with open(run_dir / "rollouts.jsonl", encoding="utf-8") as lines:
            records = [record for _, record in iter_jsonl(lines, run_dir / "rollouts.jsonl")]
        reading = read_run(records, run_tasks(run_dir), run_offset(run_dir), args.window)
        readings[run_dir.name] = reading
        print(f"{run_dir.name}: {reading['episodes']} 2-hop episodes, steps {reading['steps']}")
        for name, row in reading["classes"].items():
            em = "-" if row["em"] is None else f"{row['em']:.2f}"
            print(f"  {name:20s} {row['episodes']:5d}  share {row['share']:.2f}  EM {em}")
        for steps, row in reading["windows"].items():
            print(f"  steps {steps:>7s}: {row['episodes']:3d} episodes, EM {row['em']:.2f}, "
                  + ", ".join(f"{name} {row[name]:.2f}" for name in CLASSES))
    if args.json_out:
        args.json_out.write_text(json.dumps(readings, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
