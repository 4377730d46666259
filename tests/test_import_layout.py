"""The package layout of docs/ARCHITECTURE.md holds without a reviewer: every import points down, and no
modules import each other in a circle. Imports are read with ``ast``, those inside functions included (a lazy
import is still a dependency)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "agent_gym"

# Room -> the rooms it may import. A room is a subpackage of agent_gym; every module directly in agent_gym/
# (and tools/) is the core. "front" is the package itself (agent_gym/__init__.py: importing it registers every
# env id) and agent_gym.make: code above the envs reaches an env by id through it, never by importing one.
MAY_IMPORT: dict[str, set[str]] = {
    "core": {"core"},
    "retrieval_index": {"core"},
    "envs": {"core", "retrieval_index"},
    "front": {"core", "envs"},
    "models": {"core", "front"},
    "trainers": {"core", "models", "front"},
    "warmstart": {"core", "models", "trainers", "retrieval_index", "front"},
    "distributed": {"core", "front"},
    "adapters": {"core", "models", "trainers", "retrieval_index", "front"},
    "bench": {"core", "models", "trainers", "adapters", "front"},
    "agents": {"core", "models", "trainers", "front"},
    "cli": {"core", "retrieval_index", "envs", "front", "models", "trainers", "warmstart", "distributed", "adapters",
            "bench", "agents", "cli"},
}
for _room, _allowed in MAY_IMPORT.items():
    _allowed.add(_room)


SHIM_MARKER = "sys.modules[__name__] = _moved"


def is_moved_module_shim(path: Path) -> bool:
    """A deprecated import path kept for one release: the module replaces itself by the one that moved, so its
    import is an alias, not a dependency (test_moved_modules.py checks each)."""
    return SHIM_MARKER in path.read_text(encoding="utf-8")


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package but the deprecated paths' shims."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        if is_moved_module_shim(path):
            continue
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def room(module: str) -> str:
    parts = module.split(".")
    if module in ("agent_gym", "agent_gym.make"):
        return "front"
    if len(parts) == 2 or parts[1] == "tools":
        return "core" if (PACKAGE / f"{parts[1]}.py").exists() or parts[1] == "tools" else parts[1]
    return parts[1]


def imported_modules(module: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(agent_gym module imported, line) for every import statement in ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from agent_gym.trainers import metrics` imports a module; `from agent_gym import make_env` a name.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "agent_gym":
                target = known(name)
                if target and target != module:
                    yield target, node.lineno


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {module: {target for target, _ in imported_modules(module, path, modules)}
            for module, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_import_points_down_the_layout() -> None:
    modules = module_files()
    upward = []
    for module, path in sorted(modules.items()):
        for target, line in imported_modules(module, path, modules):
            if room(target) not in MAY_IMPORT[room(module)]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} {room(module)} -> {room(target)} ({target})")
    assert upward == [], "imports that point up (docs/ARCHITECTURE.md):\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert cycles(import_graph()) == []


def test_only_the_cli_parses_command_lines() -> None:
    modules = module_files()
    parsing = sorted(
        str(path.relative_to(PACKAGE.parent)) for module, path in modules.items()
        if room(module) != "cli" and any(
            isinstance(node, (ast.Import, ast.ImportFrom))
            and "argparse" in ([alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module])
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    )
    assert parsing == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}, [["a", "b", "c"]]),
    ],
)
def test_the_cycle_finder_finds_circles_and_only_circles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_the_layout_check_sees_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "collector.py"
    source.write_text("def collect():\n    from agent_gym.cli import main\n    return main\n", encoding="utf-8")
    modules = {"agent_gym.trainers.collector": source, "agent_gym.cli": source}
    found = list(imported_modules("agent_gym.trainers.collector", source, modules))
    assert found == [("agent_gym.cli", 2)]
    assert room("agent_gym.cli") not in MAY_IMPORT[room("agent_gym.trainers.collector")]


ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"


def core_layers() -> dict[str, int]:
    """Core module (dotted, under agent_gym) -> its layer's position in ARCHITECTURE.md's core table."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    table = text.split("<!-- core-layers -->")[1].split("<!-- /core-layers -->")[0]
    rows = [line for line in table.strip().splitlines()[2:] if line.startswith("|")]
    layers = {}
    for position, row in enumerate(rows):
        for name in row.split("|")[2].replace("`", "").split(","):
            layers[f"agent_gym.{name.strip()}"] = position
    return layers


def test_the_core_follows_the_layer_order_the_architecture_states() -> None:
    modules = module_files()
    layers = core_layers()
    core = sorted(module for module in modules if room(module) == "core")
    assert [module for module in core if module not in layers] == [], "core modules missing from ARCHITECTURE.md"
    assert [module for module in layers if module not in modules] == [], "ARCHITECTURE.md lists modules that are gone"
    upward = [
        f"{module} ({layers[module]}) -> {target} ({layers[target]})"
        for module in core
        for target, _ in imported_modules(module, modules[module], modules)
        if room(target) == "core" and layers[target] > layers[module]
    ]
    assert upward == [], "core imports that point up the stated layers:\n" + "\n".join(upward)
