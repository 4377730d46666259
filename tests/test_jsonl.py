"""The one JSON Lines reader: blank lines skipped, line numbers kept, a broken line named."""

from __future__ import annotations

import pytest

from agent_gym.jsonl import iter_jsonl


def test_blank_lines_are_skipped_and_numbers_count_every_line():
    assert list(iter_jsonl(['{"a": 1}', "", "  ", "[2]"], "f.jsonl")) == [(1, {"a": 1}), (4, [2])]


def test_a_broken_line_raises_the_given_error_naming_file_and_line():
    class BadFile(ValueError):
        pass

    with pytest.raises(BadFile, match=r"f\.jsonl:2: not valid JSON \(line 2: "):
        list(iter_jsonl(["{}", "{not json"], "f.jsonl", BadFile))
