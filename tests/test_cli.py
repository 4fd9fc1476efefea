"""The one place errors become exit codes: one line on stderr, no traceback, the code of
the error's kind (tuneup.errors)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tuneup.cli import main
from tuneup.errors import EXIT_USAGE, Interrupted, ScriptError, TuneupError, UsageError


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(("args", "says"), [
    (["autotune", "no_such_script.py"], "no such script"),
    (["autotune", "{script}", "--budget", "1"], "--budget must be at least 10 seconds"),
    (["autotune", "{script}", "--max-memory", "12"], "--max-memory takes a size with its unit"),
    (["autotune", "{script}", "--max-memory", "12MB"], "below 64 MiB"),
    (["autotune", "{script}", "--only", "turbo"], "--only takes a comma list"),
    (["autotune", "{script}", "--only", "amp", "--skip", "loader"], "either --only or --skip"),
    (["autotune", "{script}", "--format", "xml"], "Invalid value for '--format'"),
    (["autotune", "{script}", "--lr", "3"], "(pass the script's own arguments after --)"),
    (["autotune", "{script}", "--expected-steps", "0"], "--expected-steps must be a positive"),
    (["nonsense"], "No such command"),
])
def test_usage_errors_are_one_line_and_exit_2(args, says, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    result = run(*[a.replace("{script}", str(script)) for a in args])
    assert result.exit_code == EXIT_USAGE
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuneup") and says in lines[0], result.output


def test_error_kinds_carry_their_exit_codes():
    assert UsageError("x").exit_code == 2 and ScriptError("x").exit_code == 1
    assert TuneupError("x").exit_code == 1
    assert Interrupted("x", 15).exit_code == 143 and Interrupted("x", 2).exit_code == 130


def test_a_script_that_never_uses_the_wrappers_is_one_line_exit_1(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("print('training without tuneup')\n")
    result = run("autotune", str(script), "--budget", "20")
    assert result.exit_code == 1
    assert "never called" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("output_format", ["text", "json"])
def test_a_closed_standard_output_is_one_line_and_not_the_error_findings_code(output_format):
    """``tuneup doctor | head`` whose reader left: exit 141 (as SIGPIPE) and a line on stderr,
    never a silent exit 1, which means "an error finding"."""
    import signal
    import subprocess
    import sys

    report = "PyTorch version: 2.6.0+cpu\nPython version: 3.11.9 (64-bit runtime)\n" * 2000
    process = subprocess.Popen([sys.executable, "-m", "tuneup.cli", "doctor", "--from", "-",
                                "--format", output_format], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    _, err = process.communicate(report.encode(), timeout=120)
    assert process.returncode == 128 + signal.SIGPIPE
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "standard output was closed" in lines[0], err


def test_help_names_every_command_with_an_example_in_the_order_users_meet_them():
    from tuneup.cli import LazyGroup

    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    examples = [line.split()[1] for line in result.output.splitlines()
                if line.strip().startswith("tuneup ") and len(line.split()) > 1]
    assert set(LazyGroup.COMMANDS) <= set(examples)
    first = [examples.index(name) for name in ("doctor", "autotune", "watch")]
    assert first == sorted(first)
