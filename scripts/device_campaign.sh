#!/usr/bin/env bash
# The RL campaign on the borrowed GPU machine, inside one `device` call (scripts/device_bundle.sh made .device/).
#
#   bash scripts/device_campaign.sh --recipes grpo ppo --seeds 0 1 2 --steps 200 --parallel 6
#
# Joins SmolLM2's parts, installs the carried wheels where the image lacks a package, puts the committed runs that
# earlier calls carried under .device/checkpoints back in experiments/checkpoints (for --from-repo), then runs
# experiments/rl_campaign.py (from the 3-epoch sweep's choice, on cuda: the train and eval processes take the GPU
# when there is one) for at most BUDGET_S seconds (default 480, inside the call's 600). At the budget every process
# gets SIGTERM and the train processes save their step. Then each run's adapter (bf16), metrics, curve and log go to
# $OUT/RUN.tar.gz (the tool brings back 8 files of 16 MB at most: six runs at most), and the campaign's log and
# timings to $OUT/campaign.tar.gz (experiments/run_archive.py). Back here:
#   python experiments/run_archive.py unpack FILES_AT ~/agent-gym-runs/rl-e3-gpu
# puts each adapter in experiments/checkpoints/rl-RUN (continued with --from-repo) and the rest aside. Every run
# names its device (RUN/devices.json).
#
# On a machine without a GPU it runs the same way on the CPU (how it was tested: BUDGET_S=300 OUT=/tmp/out).
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${BUDGET_S:-480}
out=${OUT:?OUT: the folder whose files come back}
runs=${DEVICE_RUNS:-/tmp/agent-gym-runs/rl-e3}
export AGENT_GYM_CACHE=${AGENT_GYM_CACHE:-/tmp/agent-gym-cache} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python=${DEVICE_PYTHON:-python3}
started=$(date +%s)

model=$AGENT_GYM_CACHE/models/smollm2-135m-instruct
if [ ! -f "$model/provenance.json" ]; then
  mkdir -p "$model"
  "$python" - "$model" <<'EOF' || exit 3
import hashlib, json, shutil, sys
from pathlib import Path

model, parts = Path(sys.argv[1]), json.loads(Path(".device/model/parts.json").read_text())
missing = [name for name in parts["parts"] if not (Path(".device") / name).is_file()]
if missing:
    sys.exit(f"parts not on this machine yet: {missing} (carry each in a call first: scripts/device_bundle.sh)")
data = b"".join((Path(".device") / name).read_bytes() for name in parts["parts"])
if hashlib.sha256(data).hexdigest() != parts["sha256"]:
    sys.exit("the joined weights do not match their sha256: carry the parts again")
(model / "model.safetensors").write_bytes(data)
for item in Path(".device/model").iterdir():
    if item.name != "parts.json":
        shutil.copy(item, model / item.name)  # provenance.json last but one: get_model takes the folder as converted
print(f"SmolLM2 joined: {len(data) / 2**20:.0f} MB in {model}")
EOF
fi
if ! "$python" -c "import gymnasium, Stemmer, msgspec" 2>/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/wheels/*.whl || exit 4
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# committed runs carried by earlier calls (scripts/device_bundle.sh --adapters), for --from-repo
for adapter in .device/checkpoints/*/; do
  [ -d "$adapter" ] && [ ! -d "experiments/checkpoints/$(basename "$adapter")" ] && cp -r "$adapter" experiments/checkpoints/
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU: the CPU runs it"
"$python" -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
'| transformers', transformers.__version__, '| peft', peft.__version__)"

left=$(( budget - ($(date +%s) - started) ))
echo "campaign: ${left} s of ${budget}"
# timeout signals the whole process group: every train process saves its step on SIGTERM
mkdir -p "$runs"
timeout -s TERM -k 30 "$left" "$python" experiments/rl_campaign.py --sweep-epochs 3 --out "$runs" --chunk 10 \
  --no-final-eval "$@" 2>&1 | tee -a "$runs/campaign.log"
echo "campaign ended (exit ${PIPESTATUS[0]}) after $(( $(date +%s) - started )) s"

"$python" experiments/run_archive.py pack "$runs" "$out"
ls -l "$out"
