"""The doctor on hostile input: one line and exit 2 for what it cannot read, nothing from the
input that acts on the terminal, bounded time on huge reports, never invalid JSON out."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from tuneup.cli import main

REPORT = ("PyTorch version: 2.6.0+cu124\nIs debug build: False\nCUDA used to build PyTorch: 12.4\n"
          "GPU models and configuration: GPU 0: NVIDIA GeForce RTX 3090\n"
          "Nvidia driver version: 570.86\nIs CUDA available: True\n")


def doctor(*args: str, stdin: str | bytes | None = None):
    return CliRunner().invoke(main, ["doctor", *args], input=stdin)


def environment(**fields: object) -> str:
    base = {"torch": {"version": "2.6.0+cu124"}, "cpu": {"usable_cores": 8}}
    base.update(fields)
    return json.dumps({"environment": base})


UNREADABLE = {
    "deeply nested JSON": '{"environment": ' + "[" * 50_000 + "]" * 50_000 + "}",
    "a 5,000-digit number": '{"environment": {"cpu": {"usable_cores": ' + "9" * 5000 + "}}}",
    "NaN": '{"environment": {"cpu": {"usable_cores": NaN}, "torch": {}}}',
    "Infinity": '{"environment": {"cpu": {"usable_cores": -Infinity}, "torch": {}}}',
    "a negative core count": environment(cpu={"usable_cores": -4}),
    "a string where an object goes": environment(torch="2.6.0"),
    "a number where text goes": environment(torch={"version": 2.6}),
    "a bool where a count goes": environment(cpu={"usable_cores": True}),
    "an object where a list goes": environment(gpus={"name": "A100"}),
    "binary": b"\x00\x01\x02\x03\xff" * 200,
    "empty": "",
}


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
def test_unreadable_input_is_one_line_and_exit_2(kind):
    result = doctor("--from", "-", stdin=UNREADABLE[kind])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuneup doctor: ")
    assert "Traceback" not in result.output


def test_prose_is_text_and_gets_a_report_not_a_refusal():
    result = doctor("--from", "-", stdin="my training is slow, please help\n" * 5)
    assert result.exit_code == 0 and "not checked" in result.output, result.output
    assert "a text report" in result.output and "only the facts below were read" in result.output


def test_a_closed_standard_input_is_one_line_and_exit_2():
    process = subprocess.run([sys.executable, "-m", "tuneup.cli", "doctor", "--from", "-"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True)
    closed = subprocess.run(
        [sys.executable, "-c", "import sys, os; os.close(0); sys.stdin = None; "
                               "sys.argv = ['tuneup', 'doctor', '--from', '-']; "
                               "from tuneup.cli import main; main()"],
        capture_output=True, text=True)
    assert process.returncode == 2 and closed.returncode == 2
    assert closed.stderr.strip() == ("tuneup doctor: standard input is closed: pipe a report "
                                     "into it, or give a file")


@pytest.mark.parametrize("junk", ["\x1b[2J\x1b[H", "\x1b]0;title\x07", "\x00", "\x9b31m",
                                  "\x1b[31m", "\x07\x08"])
def test_nothing_from_the_report_reaches_the_terminal(junk):
    report = REPORT.replace("RTX 3090", f"RTX 3090{junk}").replace("570.86", f"570.86{junk}")
    for fmt in ("text", "json"):
        result = doctor("--from", "-", "--format", fmt, stdin=report)
        assert result.exit_code in (0, 1), result.output
        assert not any(ord(c) < 32 and c not in "\n\t" or 0x7f <= ord(c) < 0xa0
                       for c in result.output)
        assert "RTX 3090" in result.output


def test_a_huge_report_is_bounded_in_time_and_output(tmp_path):
    huge = tmp_path / "huge.txt"
    lines = (f"GPU {i}: NVIDIA A100-SXM4-40GB" for i in range(300_000))
    huge.write_text(REPORT.replace("GPU 0: NVIDIA GeForce RTX 3090", "\n".join(lines)))
    started = time.monotonic()
    result = doctor("--from", str(huge), "--format", "json")
    elapsed = time.monotonic() - started
    document = json.loads(result.output)
    assert len(document["environment"]["gpus"]) == 64
    assert any("first 64 of 300000 gpus" in note for note in document["environment"]["notes"])
    assert len(result.output) < 200_000 and elapsed < 30


def test_text_report_on_a_stdout_that_cannot_encode_it(tmp_path):
    report = tmp_path / "r.txt"
    report.write_text(REPORT)
    process = subprocess.run([sys.executable, "-m", "tuneup.cli", "doctor", "--from", str(report)],
                             capture_output=True, env={"PYTHONIOENCODING": "cp1252",
                                                       "PATH": "/usr/bin:/bin"})
    assert process.returncode in (0, 1), process.stderr
    assert b"Traceback" not in process.stderr and b"RTX 3090" in process.stdout


def test_bad_option_values_are_one_line(tmp_path):
    for args in (["--format", "yaml"], ["--torch", "banana"], ["--python", "three"],
                 ["--no-such-option"]):
        result = doctor(*args)
        assert result.exit_code == 2
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert result.output.startswith("tuneup doctor: ")


@pytest.mark.parametrize("invisible", ["\u200b", "\u200d", "\ufeff", "\u2060", "\u00ad", "\u200e"])
def test_invisible_characters_pasted_inside_a_version_are_not_read_as_a_cut(invisible):
    """A web page or chat adds zero-width characters; ``570\u200b.86`` is driver 570.86, not
    a driver 86 that needs an update."""
    pasted = REPORT.replace("570.86", f"570{invisible}.86").replace("12.4\n", f"12{invisible}.4\n")
    clean = json.loads(doctor("--from", "-", "--format", "json", stdin=REPORT).stdout)
    result = doctor("--from", "-", "--format", "json", stdin=pasted)
    assert result.exit_code == 0, result.output
    read = json.loads(result.stdout)
    assert read["environment"]["driver"]["version"] == "570.86"
    assert read["findings"] == clean["findings"]
