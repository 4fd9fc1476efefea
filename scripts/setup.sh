#!/usr/bin/env bash
# Create .venv and install tuneup with its test tools. The CPU wheel of torch goes in
# first, so the project's torch range is already satisfied and pip pulls no CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_install() {  # pip, minus the harmless notes about this machine's empty local indexes
  .venv/bin/python -m pip install --quiet "$@" 2>&1 \
    | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
}
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "tuneup setup: installing torch ${TUNEUP_TORCH:-2.13.0} (CPU wheel)"
  pip_install "torch==${TUNEUP_TORCH:-2.13.0}"
fi
pip_install -e '.[test]'
