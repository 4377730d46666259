"""The one learning-rate schedule of the RL, pretraining and SFT loops."""

from __future__ import annotations

import pytest

from agent_gym.trainers.lr_schedule import lr_factor, lr_lambda


def test_warm_up_rises_linearly_to_the_peak() -> None:
    factors = [lr_factor(step, warmup_steps=4, total_steps=100) for step in range(4)]
    assert factors == [0.25, 0.5, 0.75, 1.0]


def test_cosine_decays_from_the_peak_to_the_floor_at_the_last_step_and_stays() -> None:
    schedule = lr_lambda(warmup_steps=10, total_steps=110, floor=0.1)
    assert schedule(10) == pytest.approx(1.0)
    assert schedule(60) == pytest.approx(0.55)  # halfway: floor + (1 - floor) / 2
    assert schedule(110) == pytest.approx(0.1)
    assert schedule(500) == pytest.approx(0.1)


def test_constant_holds_the_peak_after_the_warm_up() -> None:
    assert [lr_factor(step, warmup_steps=2, total_steps=10, decay="constant") for step in (0, 2, 9, 50)] == [
        0.5, 1.0, 1.0, 1.0]


def test_no_warm_up_starts_at_the_peak() -> None:
    assert lr_factor(0, warmup_steps=0, total_steps=10) == pytest.approx(1.0)


def test_sfts_overlapping_warm_up_is_its_original_schedule() -> None:
    import math

    def original(step: int, warmup: int, steps: int) -> float:  # agent_gym/trainers/sft.py before issue 20
        return min(1.0, (step + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))

    for warmup, steps in ((10, 30), (3, 5), (0, 7)):
        expected = [original(step, warmup, steps) for step in range(steps + 3)]
        got = [lr_factor(step, warmup_steps=warmup, total_steps=steps, warmup_overlaps=True)
               for step in range(steps + 3)]
        assert got == pytest.approx(expected)
