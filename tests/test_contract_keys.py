"""The info keys have one home, ``agent_gym/contract.py``: everywhere else in the package an info is written and
read through its constants, so a key is renamed in one place. Read with ``ast``: a literal key string used on an
info (a name or attribute that says ``info``) as a subscript, a ``.get``/``.pop``/``.setdefault`` argument, an
``in`` test, or a key of a dict literal assigned to it, fails."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from agent_gym.contract import INFO_KEYS

PACKAGE = Path(__file__).resolve().parents[1] / "agent_gym"


def _names_an_info(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and "info" in name.lower()


def _key(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and node.value in INFO_KEYS else None


def literal_info_keys(source: str) -> Iterator[tuple[int, str]]:
    """(line, key) of every literal info key used on an info in ``source``."""
    for node in ast.walk(ast.parse(source)):
        keys: list[str | None] = []
        if isinstance(node, ast.Subscript) and _names_an_info(node.value):
            keys.append(_key(node.slice))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
              and node.func.attr in ("get", "pop", "setdefault") and _names_an_info(node.func.value)):
            keys.append(_key(node.args[0]))
        elif (isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn)
              and _names_an_info(node.comparators[0])):
            keys.append(_key(node.left))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_names_an_info(target) for target in targets):
                keys.extend(_key(key) for key in node.value.keys)
        yield from ((node.lineno, key) for key in keys if key is not None)


def test_the_scan_finds_each_shape_of_a_literal_key_and_nothing_else() -> None:
    source = '''
info["messages"]
last_info.get("reward_components", {})
self.reset_info.pop("tool_calls")
if "answer" in info: pass
step_info: dict = {"task_id": 1, "em": 2}
info[MESSAGES]
message["tool_calls"]
row.get("answer")
info["em"]
"""info["messages"] in a docstring"""
f"{info['gold_answers']}"
'''
    assert sorted(literal_info_keys(source)) == [
        (2, "messages"), (3, "reward_components"), (4, "tool_calls"), (5, "answer"), (6, "task_id"),
        (12, "gold_answers")]


def test_no_literal_info_key_outside_the_contract() -> None:
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {key!r}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "contract.py"
             for line, key in literal_info_keys(path.read_text(encoding="utf-8"))]
    assert not found, "use agent_gym.contract's constant for these info keys:\n" + "\n".join(found)
