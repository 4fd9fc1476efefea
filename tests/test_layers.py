"""The package's layers, read from its import graph: the runtime users import on every run
imports no observer and no diagnosis, and stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tuneup"


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (lazy imports count)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("forbidden", ["tuneup.autotune", "tuneup.doctor", "tuneup.watch"])
def test_the_runtime_imports_no_observer_and_no_diagnosis(forbidden):
    offenders = {
        str(path.relative_to(PACKAGE.parent)): sorted(
            name for name in imports_of(path) if name == forbidden or name.startswith(forbidden + "."))
        for path in (PACKAGE / "runtime").rglob("*.py")}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_importing_the_runtime_loads_no_psutil_and_no_cli():
    code = ("import sys, tuneup.runtime as r; r.tuned_loop; r.tuned_loader; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('psutil', 'rich', 'click') or m.startswith(('tuneup.autotune', "
            "'tuneup.doctor', 'tuneup.watch'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


def test_observer_hooks_import_without_torch():
    """Parents (autotune, watch) name the hooks module without paying for torch."""
    code = "import sys, tuneup.runtime.hooks; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
