"""What the user sees: live progress while trials run, then the result as a table or JSON."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tuneup.autotune import protocol
from tuneup.autotune.search import Outcome, describe
from tuneup.autotune.search.outcome import RunnerUp
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.autotune.space import default_value
from tuneup.settings.schema import knob_facts


class Progress:
    """Current stage and trial, best so far and time left (live on a terminal); a line per trial."""

    def __init__(self, console: Console, time_left: Callable[[], float],
                 quiet: bool = False) -> None:
        self.console = console
        self.time_left = time_left
        self.quiet = quiet
        self.stage_name = "starting"
        self.current = ""
        self.best_text = "—"
        self.done = 0
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        if self.console.is_terminal and not self.quiet:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4,
                              transient=True, get_renderable=self._render)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def _render(self) -> Text:
        left = max(0.0, self.time_left())
        return Text.assemble(
            ("autotune ", "bold"), (f"[{self.stage_name}] ", "cyan"),
            f"trials done: {self.done}  now: {self.current or '—'}  ",
            ("best: ", "bold"), f"{self.best_text}  ",
            (f"{left:.0f} s left", "dim"),
        )

    def _line(self, text: str) -> None:
        if not self.quiet:  # above the live status line on a terminal; piped, one line each
            self.console.print(text, highlight=False, markup=False,
                               soft_wrap=not self.console.is_terminal)

    def stage(self, name: str) -> None:
        self.stage_name = name

    def trial_started(self, trial: Trial) -> None:
        self.current = trial.id

    def trial_finished(self, result: TrialResult) -> None:
        self.current = ""
        self.done += 1
        speed = f"{result.samples_per_s:.0f} samples/s" if result.samples_per_s else result.message
        self._line(f"  [{self.stage_name}] {result.trial.id}: {result.status}"
                   + (f", {speed}" if speed else "")
                   + f"  ({max(0.0, self.time_left()):.0f} s left)")

    def best(self, samples_per_s: float, speedup: float, label: str) -> None:
        """The settings the search holds as best: updated when a stage adopts its pick
        (after its race), so this can lag a faster trial line above it."""
        self.best_text = f"{label} at {samples_per_s:.0f} samples/s ({speedup:.2f}x)"


def knob_rows(outcome: Outcome) -> list[tuple[str, Any, Any]]:
    """(knob, PyTorch default, chosen) for every knob; chosen equals default when untouched."""
    rows = []
    for name, value in outcome.file_knobs.to_dict().items():
        default = default_value(name, outcome.facts)
        rows.append((name, default, default if value is None else value))
    return rows


def to_json(outcome: Outcome, script: Path, output: Path | None, elapsed_s: float,
            budget_s: float) -> dict[str, Any]:
    """The result as one JSON-ready object (what ``--format json`` prints)."""
    return {
        "script": str(script),
        "settings": str(output) if output else None,
        "device": outcome.facts.device,
        "effective_batch": outcome.facts.effective_batch,
        "ranks": outcome.facts.ranks,
        "baseline": describe(outcome.baseline_knobs),
        "baseline_samples_per_s": round(outcome.baseline_samples_per_s, 2),
        "tuned_samples_per_s": (None if outcome.kept_baseline
                                else round(outcome.tuned_samples_per_s, 2)),
        "speedup": None if outcome.speedup is None else round(outcome.speedup, 3),
        "speedup_interval": ([round(v, 3) for v in outcome.speedup_interval]
                             if outcome.speedup_interval else None),
        "speedup_measured_by": outcome.measured_by,
        "confirmed": outcome.confirmed,
        "runner_up": _runner_up_json(outcome),
        "knobs": {name: {"default": default, "chosen": chosen}
                  for name, default, chosen in knob_rows(outcome)},
        "settings_knobs": outcome.file_knobs.to_dict(),
        "rejected": [{"trial": r.trial_id, "reason": r.reason} for r in outcome.losers],
        "not_finished": [{"trial": r.trial_id, "reason": r.reason} for r in outcome.unfinished],
        "every_trial": outcome.facts.every_trial.changed(),
        "notes": outcome.notes,
        "trials": [_trial_json(r) for r in outcome.results],
        "elapsed_s": round(elapsed_s, 1),
        "budget_s": budget_s,
    }


def _runner_up_json(outcome: Outcome) -> dict[str, Any] | None:
    runner_up = outcome.runner_up
    if runner_up is None:
        return None
    return {"label": describe(runner_up.knobs),
            "settings_knobs": outcome.facts.as_run(runner_up.knobs).to_dict(),
            "relative_speed": round(runner_up.relative_speed, 3),
            "confidence": round(runner_up.confidence, 3)}


def runner_up_text(runner_up: RunnerUp) -> str:
    """``runner-up: amp=bfloat16 at 0.94x the pick's speed; the pick is faster with 97 %
    confidence``; below 50 % the rounds call it a tie, and the notes say why the pick
    stands (the simpler settings, compile on all its rounds, the defaults)."""
    label = describe(runner_up.knobs) if runner_up.knobs.changed() else "PyTorch defaults"
    text = (f"runner-up: {label} at {runner_up.relative_speed:.2f}x the "
            f"pick's speed; the pick is faster with {runner_up.confidence:.0%} confidence")
    return text if runner_up.confidence >= 0.5 else text + " (a tie on these rounds: see the notes)"


def _trial_json(result: TrialResult) -> dict[str, Any]:
    return {
        "id": result.trial.id,
        "status": result.status,
        "samples_per_s": result.samples_per_s,
        "step_s": result.step_time,
        "warmup_s": result.warmup_s,
        "data_wait_share": result.data_wait_share,
        "breakdown": result.breakdown,  # seconds a step: data_wait, device, host
        "input_shapes": result.input_shapes,  # distinct batch shapes measured
        "message": result.message or None,
    }


def print_table(console: Console, outcome: Outcome, output: Path | None, elapsed_s: float) -> None:
    """The human summary: knobs default → chosen, throughput, speedup, rejections."""
    table = Table(title="tuneup autotune", title_justify="left")
    table.add_column("knob")
    table.add_column("default")
    table.add_column("chosen")
    for name, default, chosen in knob_rows(outcome):
        # a knob no stage searches (every trial ran with it) is set, not a tuned change
        searched = knob_facts(name).group is not None
        style = "bold green" if chosen != default and searched else ""
        table.add_row(name, _show(default), Text(_show(chosen), style=style))
    console.print(table)
    if every := every_trial_text(outcome):
        console.print(f"set for every trial, the baseline's too (not a tuned change): {every}",
                      highlight=False, markup=False)
    hw = outcome.facts
    if outcome.kept_baseline:
        console.print(f"samples/s: {baseline_label(outcome)} {outcome.baseline_samples_per_s:,.0f}"
                      f"; {escape(speedup_text(outcome))}", highlight=False)
    else:
        console.print(f"samples/s: {baseline_label(outcome)} {outcome.baseline_samples_per_s:,.0f}"
                      f" -> tuned {outcome.tuned_samples_per_s:,.0f}, "
                      f"speedup [bold]{escape(speedup_text(outcome))}[/bold]", highlight=False)
    if outcome.runner_up is not None:
        console.print(runner_up_text(outcome.runner_up), highlight=False, markup=False)
    ranks = f" on each of {hw.ranks} ranks" if hw.ranks > 1 else ""
    console.print(f"({hw.device}, effective batch {hw.effective_batch}{ranks}, "
                  f"{len(outcome.results)} trials in {elapsed_s:.0f} s)", highlight=False)
    for title, rejections in (("rejected", outcome.losers),
                              ("not finished (budget)", outcome.unfinished)):
        if rejections:
            console.print(f"{title}:", highlight=False, markup=False)
        for rejection in rejections:  # under its heading the budget's "budget: " is said
            reason = rejection.reason.removeprefix(f"{protocol.BUDGET}: ")
            console.print(f"  {rejection.trial_id}: {reason}", highlight=False, markup=False)
    for note in outcome.notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    if output:
        console.print(f"settings written to {output}", highlight=False, markup=False)


def speedup_text(outcome: Outcome) -> str:
    """``1.61x [1.52, 1.70] (confirmed: re-measured in 4 interleaved round(s) ...)``: the
    figure with how it was measured; no figure when the baseline was kept (its runs set
    against themselves show only noise)."""
    if outcome.kept_baseline:
        every = every_trial_text(outcome)
        also = f" (and {every} set for every trial, theirs too)" if every else ""
        kept = (f"the largest micro-batch that fits kept{also}: nothing beat it"
                if outcome.baseline_knobs.changed()
                else f"PyTorch's defaults kept{also}: nothing beat them")
        return f"{kept} beyond noise; no speed-up to claim"
    text = f"{outcome.speedup:.2f}x"
    if outcome.speedup_interval:
        low, high = outcome.speedup_interval
        text += f" [{low:.2f}, {high:.2f}]"
    return f"{text} ({outcome.measured_by})"


def every_trial_text(outcome: Outcome) -> str | None:
    """``fixed_malloc_thresholds on``: the knobs no stage searches that every trial ran
    with, the baseline's too ("PyTorch's defaults kept" once sat above a table showing
    ``fixed_malloc_thresholds off -> on``); None when there are none."""
    changed = outcome.facts.every_trial.changed()
    return ", ".join(f"{name} {_show(value)}" for name, value in changed.items()) or None


def baseline_label(outcome: Outcome) -> str:
    """``defaults``, or ``micro_batch=64 (fits)`` when the user's batch did not."""
    knobs = outcome.baseline_knobs
    return f"{describe(knobs)} (fits)" if knobs.changed() else "defaults"


def _show(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
