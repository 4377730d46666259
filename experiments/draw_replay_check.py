"""Did a committed campaign run replay its first steps' task draws after a continuation? Read from its metrics alone.

Before `train --step-offset`, a run continued from its committed adapter (`rl_campaign.py --from-repo`) began its
task sampler at position 0 again. Each step's draw is a pure function of (seed, position) (`TaskSampler`), and
SynthHop's question ``i`` has ``hops[i % 2]`` hops on the 1/2-hop mix, so the hop counts a step played are known
for any restart step. The metrics show them: ``charts/em/<h>`` is logged only when the step played a question of
``h`` hops, and ``charts/informative_groups/<h>`` is a share of that step's groups of ``h`` hops (its denominator
divides their count). For each restart step (0: none) this counts the steps whose metrics agree with the draw.

    python experiments/draw_replay_check.py experiments/checkpoints/rl-grpo_lr5e-5_kl0.3-e3-s1 ...
"""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

from agent_gym.trainers.task_sampler import TaskSampler

TRAIN_QUESTIONS = 4000  # the campaign's training split (rl_campaign.MIX_TRAIN["num_questions"])
TASKS_PER_STEP = 4


def step_hops(seed: int, position: int, count: int) -> list[int]:
    """The hop counts of ``count`` draws from ``position`` on (1-hop questions at even indices, 2-hop at odd)."""
    draws = TaskSampler(seed, position).draw(count)
    return [1 + (spec["options"]["task_index"] % TRAIN_QUESTIONS) % 2 for spec in draws]


def agrees(row: dict[str, Any], hops: list[int]) -> bool:
    """Whether a step's metrics could come from a step that drew questions of these hop counts."""
    for h in (1, 2):
        groups = hops.count(h)
        if (f"charts/em/{h}" in row) != (groups > 0):
            return False
        share = row.get(f"charts/informative_groups/{h}")
        if share is not None and groups and (Fraction(share).limit_denominator(16) * groups).denominator != 1:
            return False
    return True


def agreeing_steps(rows: list[dict[str, Any]], seed: int, restart: int) -> int:
    """How many steps agree with a run whose sampler went back to position 0 after step ``restart`` (0: never).
    Dynamic sampling draws ``charts/sampling_rounds`` rounds of tasks a step."""
    position, agreeing = 0, 0
    for row in sorted(rows, key=lambda r: r["step"]):
        if restart and row["step"] == restart + 1:
            position = 0
        count = TASKS_PER_STEP * int(row.get("charts/sampling_rounds", 1))
        agreeing += agrees(row, step_hops(seed, position, count))
        position += count
    return agreeing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (metrics.jsonl; the seed is the name's -sN)")
    args = parser.parse_args(argv)
    for run in args.runs:
        if "_stratified" in run.name:  # every step plays both hop counts: nothing in its metrics tells draws apart
            print(f"{run.name}: a stratified draw (--stratify-by hops); its metrics cannot tell its draws apart")
            continue
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        seed = int(run.name.rsplit("-s", 1)[1])
        scores = {restart: agreeing_steps(rows, seed, restart) for restart in range(len(rows))}
        best = max(scores, key=lambda restart: (scores[restart], -restart))
        verdict = "no replay" if best == 0 else f"replayed from step {best + 1} on"
        print(f"{run.name}: {len(rows)} steps; agree with an uninterrupted draw: {scores[0]}, "
              f"best with a restart after step {best}: {scores[best]} ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
