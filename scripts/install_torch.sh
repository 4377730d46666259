#!/usr/bin/env bash
# Install torch 2.13.0 before anything else can pull it in:
#   - a machine with an NVIDIA GPU (nvidia-smi lists one) gets PyPI's build, which is the CUDA one;
#   - any other machine gets the CPU build from PyTorch's CPU wheel index: PyPI alone resolves torch==2.13.0
#     to the CUDA build plus about 17 nvidia-* packages and triton, several GB a CPU cannot use;
#   - where that index cannot be reached, the configured index's torch==2.13.0 (a local CPU wheel on our
#     machines; from PyPI alone, the CUDA build), with a warning that says so.
#
#   AGENT_GYM_TORCH_CPU_INDEX   the CPU wheel index (default: https://download.pytorch.org/whl/cpu)
#   AGENT_GYM_TORCH_DRY_RUN=1   print the pip command instead of running it
set -euo pipefail
version="2.13.0"
index="${AGENT_GYM_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
run() {
  if [ -n "${AGENT_GYM_TORCH_DRY_RUN:-}" ]; then echo "$*"; else "$@"; fi
}
pip_install=(python -m pip --disable-pip-version-check -q install)

reachable() {  # the index answers within seconds (timeout also bounds a DNS lookup that hangs)
  local url="${1%/}/torch/"
  if command -v curl >/dev/null 2>&1; then
    timeout 20 curl -fsS -o /dev/null --max-time 10 "$url" >/dev/null 2>&1
  else
    timeout 20 python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10).close()' \
      "$url" >/dev/null 2>&1
  fi
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "install: an NVIDIA GPU is present: torch==$version from the configured index (PyPI: the CUDA build)" >&2
  run "${pip_install[@]}" "torch==$version"
elif reachable "$index"; then
  echo "install: no NVIDIA GPU: the CPU build of torch==$version from $index" >&2
  run "${pip_install[@]}" "torch==$version" --index-url "$index"
else
  echo "install: WARNING: no NVIDIA GPU, and PyTorch's CPU index ($index) cannot be reached: installing" \
       "torch==$version from the configured index instead. From PyPI alone that is the CUDA build (several GB);" \
       "to avoid it, give access to $index (or set AGENT_GYM_TORCH_CPU_INDEX to a mirror) and rerun." >&2
  run "${pip_install[@]}" "torch==$version"
fi
