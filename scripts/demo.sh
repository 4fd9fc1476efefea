#!/usr/bin/env bash
# The main job, from a fresh clone: set up, diagnose this machine and a pasted report,
# then autotune the example training script and show the speedup.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
tuneup=.venv/bin/tuneup

echo; echo "== tuneup doctor (this machine)"
$tuneup doctor

echo; echo "== tuneup doctor --from a collect_env report (RTX 5090 on a cu126 build; exit 1 = error found)"
$tuneup doctor --from tests/data/doctor-corpus/case01/collect_env.txt || echo "(exit status $?)"

echo; echo "== tuneup autotune docs/examples/train_mlp.py"
out=$(mktemp -d)/train_mlp.tuneup.json
$tuneup autotune docs/examples/train_mlp.py --budget "${TUNEUP_DEMO_BUDGET:-180}" --output "$out" -- --steps 100000

steps=${TUNEUP_DEMO_STEPS:-1000}
echo; echo "== the example, $steps steps with plain PyTorch defaults (TUNEUP_DISABLE=1)"
TUNEUP_DISABLE=1 .venv/bin/python docs/examples/train_mlp.py --steps "$steps"
echo; echo "== the same, with the tuned settings ($out; the time includes any compile)"
TUNEUP_SETTINGS="$out" TUNEUP_VERBOSE=1 .venv/bin/python docs/examples/train_mlp.py --steps "$steps"
