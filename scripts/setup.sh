#!/usr/bin/env bash
# Create .venv and install tuneup with its test tools. torch goes in first, the wheel that fits
# this machine, so the project's torch range is already satisfied and pip pulls no other build:
# the CPU wheel where there is no NVIDIA GPU; where there is one, the CUDA wheel `tuneup doctor`
# would name for its driver and GPUs (tuneup/doctor/wheel_choice.py, torch-free).
# TUNEUP_TORCH=2.12.1 picks the release, TUNEUP_TORCH_INDEX=<url> the index.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# a .venv whose pip does not run (a set-up cut short while it was being made) is made anew
.venv/bin/python -m pip --version >/dev/null 2>&1 || "$PYTHON" -m venv --clear .venv
pip_install() {  # pip, minus the harmless notes about this machine's empty local indexes
  .venv/bin/python -m pip install --quiet "$@" 2>&1 \
    | { grep -v -e 'is ignored: it is neither a file nor a directory' -e 'Retrying (Retry(' \
        || true; }
}
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  pip_install 'packaging>=23'  # all the wheel choice needs besides the standard library
  if ! wheel=$(PYTHONPATH=. .venv/bin/python -m tuneup.doctor.wheel_choice); then
    wheel="torch==${TUNEUP_TORCH:-2.13.0} --index-url https://download.pytorch.org/whl/cpu"
    echo "tuneup setup: the wheel choice failed (above); installing the CPU wheel: $wheel"
  fi
  # torch alone from its index (pip's retries there are not repeated for each dependency,
  # and not shown: where the index cannot be reached, pip's local wheels answer or it fails);
  # its dependencies come with tuneup's below, from the usual index
  # shellcheck disable=SC2086  # pip's arguments, one word each
  pip_install --no-deps $wheel
fi
pip_install -e '.[test]'
.venv/bin/python -c "import torch" 2>/dev/null || {
  echo "tuneup setup: torch did not install (see pip's messages above)"; exit 1; }
