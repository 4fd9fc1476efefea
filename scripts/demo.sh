#!/usr/bin/env bash
# The main job, from a fresh clone: set up, diagnose this machine and a pasted report,
# then autotune an example training script and show the speedup.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
tuneup=.venv/bin/tuneup

echo; echo "== tuneup doctor (this machine)"
$tuneup doctor

echo; echo "== tuneup doctor --from a collect_env report (RTX 5090 on a cu126 build; exit 1 = error found)"
$tuneup doctor --from tests/data/doctor-corpus/case01/collect_env.txt || echo "(exit status $?)"

# The input-bound example gains on any machine (DataLoader workers); the compute-bound one,
# docs/examples/train_mlp.py, only where bfloat16 runs fast (TUNEUP_DEMO_SCRIPT picks it).
script=${TUNEUP_DEMO_SCRIPT:-docs/examples/train_images.py}
folder=$(mktemp -d)
trap 'rm -rf "$folder"' EXIT
out="$folder/$(basename "$script" .py).tuneup.json"
steps=${TUNEUP_DEMO_STEPS:-300}
echo; echo "== tuneup autotune $script (for a run of $steps steps)"
$tuneup autotune "$script" --budget "${TUNEUP_DEMO_BUDGET:-180}" --expected-steps "$steps" \
  --output "$out" -- --steps 100000

echo; echo "== the example, $steps steps with plain PyTorch defaults (TUNEUP_DISABLE=1)"
TUNEUP_DISABLE=1 .venv/bin/python "$script" --steps "$steps"
echo; echo "== the same, with the tuned settings (the time includes any compile)"
TUNEUP_SETTINGS="$out" TUNEUP_VERBOSE=1 .venv/bin/python "$script" --steps "$steps"
