#!/usr/bin/env bash
# The test suite on a lent GPU machine whose python3 already holds a CUDA torch and no
# package index can be reached: tuneup installed without its dependencies, the tests spread
# over the cores where pytest-xdist is there, and each failure named in DIR/failures.txt even
# when the time limit cuts the run (pytest's own summary comes only at the end).
#
#   bash scripts/gpu_suite.sh DIR [LIMIT_S] [PYTEST_ARGS...]     (LIMIT_S: default 400)
#
# Exit status: pytest's, or 124 (137 after the kill 10 s later) where the limit cut it.
set -uo pipefail
out=${1:?usage: scripts/gpu_suite.sh DIR [LIMIT_S] [PYTEST_ARGS...]}
mkdir -p "$out" && out=$(cd "$out" && pwd)  # DIR as the caller named it
limit=${2:-400}
shift $(($# < 2 ? $# : 2))
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# where the interpreter finds tuneup from elsewhere (-c puts the current folder first)
here=$(cd / && "$PYTHON" -c \
  "import os, tuneup; print(os.path.dirname(os.path.dirname(tuneup.__file__)))" 2>/dev/null)
if [ "$here" != "$PWD" ]; then  # the `tuneup` command too, for tests that run it
  "$PYTHON" -m pip install --quiet --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 \
    || echo "gpu_suite: tuneup did not install (see $out/install.log); testing the checkout"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
spread=()
"$PYTHON" -c "import xdist" 2>/dev/null && spread=(-n "$(nproc)")
"$PYTHON" -c "import pytest_timeout" 2>/dev/null && spread+=(--timeout 150)
timeout -k 10 "$limit" "$PYTHON" -m pytest -v -p no:cacheprovider -o addopts="" \
  "${spread[@]}" "$@" >"$out/pytest.log" 2>&1
rc=$?
# "[gw3] [ 67%] FAILED tests/x.py::name" under xdist, "tests/x.py::name FAILED" without
# (and "FAILED tests/x.py::name - why" in the summary): one "FAILED tests/x.py::name" each
grep -oE '(FAILED|ERROR) [^ ]+\.py::[^ ]+|[^ ]+\.py::[^ ]+ (FAILED|ERROR)' "$out/pytest.log" \
  | sed -E 's/^([^ ]+) (FAILED|ERROR)$/\2 \1/' | sort -u >"$out/failures.txt"
passed=$(grep -cE '(PASSED|XPASS)' "$out/pytest.log")
echo "gpu_suite: exit $rc; $passed passed, $(wc -l <"$out/failures.txt") failed or errored" \
  "(names in $out/failures.txt, the log in $out/pytest.log)"
exit $rc
