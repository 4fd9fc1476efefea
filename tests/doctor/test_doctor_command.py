"""`tuneup doctor`: options, exit codes, JSON shape, bad input, and no torch import for --from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuneup import __version__
from tuneup.cli import main

CORPUS = Path(__file__).parents[1] / "data" / "doctor-corpus"


def invoke(*args: str, stdin: str | bytes | None = None):
    return CliRunner().invoke(main, ["doctor", *args], input=stdin)


def test_report_with_an_error_exits_1_and_names_the_fix() -> None:
    result = invoke("--from", str(CORPUS / "case01" / "collect_env.txt"))
    assert result.exit_code == 1
    assert "TU101" in result.output and "✗" in result.output
    # the newest release with sm_120 kernels that the 570 driver runs (CUDA 12.8), for pip and uv
    assert ("pip install torch==2.11.0 --index-url https://download.pytorch.org/whl/cu128 "
            "(uv: uv pip install torch==2.11.0 --torch-backend=cu128)") in result.output
    assert "\x1b[" not in result.output  # plain text when not a terminal


def test_healthy_report_exits_0() -> None:
    result = invoke("--from", str(CORPUS / "case48" / "collect_env.txt"))
    assert result.exit_code == 0, result.output


def test_unchecked_facts_are_shown() -> None:
    result = invoke("--from", str(CORPUS / "case20" / "collect_env.txt"))
    assert "not checked" in result.output


def test_json_shape_and_round_trip() -> None:
    result = invoke("--from", str(CORPUS / "case17" / "collect_env.txt"), "--format", "json")
    assert result.exit_code == 1
    document = json.loads(result.output)
    assert document["tuneup"] == __version__
    assert {"tuneup", "environment", "findings", "summary"} <= set(document)
    assert document["summary"]["errors"] >= 1 and "warnings" in document["summary"]
    for item in document["findings"]:
        assert {"code", "category", "severity", "message", "fix"} <= set(item)
        if "install" in item:  # the fix's commands, for scripts
            assert set(item["install"]) == {"pip", "uv"}
            assert item["install"]["pip"] in item["fix"] and item["install"]["uv"] in item["fix"]
    assert any("install" in item for item in document["findings"])
    again = invoke("--from", "-", "--format", "json", stdin=result.output)
    assert json.loads(again.output)["findings"] == document["findings"]


def test_requested_torch_settles_python_support() -> None:
    report = str(CORPUS / "case40" / "collect_env.txt")
    assert invoke("--from", report).exit_code == 0
    result = invoke("--from", report, "--torch", "2.1.0")
    assert result.exit_code == 1 and "python-unsupported" not in result.output  # text shows codes
    assert "TU701" in result.output


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "no such file"),
        (b"", "empty"),
        (bytes(range(256)) * 8, "binary"),
    ],
)
def test_unreadable_input_exits_2_with_one_line(
    tmp_path: Path, content: bytes | None, words: str
) -> None:
    path = tmp_path / "report.txt"
    if content is not None:
        path.write_bytes(content)
    result = invoke("--from", str(path))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output


def test_bad_usage_exits_2() -> None:
    assert invoke("--format", "yaml").exit_code == 2
    assert (
        invoke("--torch", "latest", "--from", str(CORPUS / "case01" / "collect_env.txt")).exit_code
        == 2
    )


def test_from_never_imports_torch() -> None:
    code = (
        "import sys\nfrom tuneup.cli import main\n"
        "try:\n    main(['doctor', '--from', sys.argv[1], '--format', 'json'])\n"
        "except SystemExit:\n    pass\n"
        "sys.stderr.write('TORCH=' + str('torch' in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(CORPUS / "case01" / "collect_env.txt")],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
    )
    assert "TORCH=False" in done.stderr


def test_the_live_doctor_on_this_machine_exits_0() -> None:
    import torch

    done = subprocess.run(
        [sys.executable, "-c", "from tuneup.cli import main; main(['doctor'])"],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    if torch.cuda.is_available():  # the GPU torch uses is named, and no CPU-only advice given
        assert torch.cuda.get_device_name(0) in done.stdout
        assert "No NVIDIA GPU found" not in done.stdout


def test_a_machine_without_a_gpu_is_told_what_decides_its_speed(no_gpu) -> None:
    result = invoke()
    assert result.exit_code == 0, result.output
    assert "No NVIDIA GPU found" in result.output
    for fact in ("bf16", "usable CPU cores", "/dev/shm"):
        assert fact in result.output
