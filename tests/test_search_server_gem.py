"""GEM's own search tool (gem-llm 0.1.0, msgpack over HTTP) reads our /retrieve (peer venv: make_peer_venv.sh)."""

from __future__ import annotations

import pytest

search_tool = pytest.importorskip("gem.tools.search_tool", reason="gem-llm not installed (peer venv)")

from test_search_server import CORPUS, retriever, server_url  # noqa: E402, F401 - fixtures


def test_gems_search_tool_reads_our_retrieve_endpoint(server_url: str) -> None:  # noqa: F811 - the fixture
    tool = search_tool.SearchTool(search_url=f"{server_url}/retrieve", topk=2)
    valid, has_error, observation, _ = tool.execute_action("<search>Seine</search>")
    assert valid and not has_error
    assert 'Doc 1(Title: "Seine")' in observation and CORPUS[6]["text"] in observation
