"""The ``tuneup`` command line: one group, one sub-command per entry point, and the one place
where errors become a line on stderr and an exit code (see :mod:`tuneup.errors`)."""

from __future__ import annotations

import sys
from typing import Any

import click

from tuneup import __version__
from tuneup.errors import EXIT_INTERRUPTED, EXIT_USAGE, TuneupError


class LazyGroup(click.Group):
    """Imports a sub-command only when it runs, so ``tuneup doctor --from`` stays torch-free."""

    invoked: str | None = None  # the sub-command being run: errors name it

    COMMANDS = {
        "doctor": ("tuneup.doctor.command", "doctor", "Check driver, CUDA, cuDNN, NCCL, the PyTorch build and the GPU against each other."),
        "autotune": ("tuneup.autotune.command", "autotune", "Probe a training script and write the settings that make it fastest."),
        "watch": ("tuneup.watch.command", "watch", "Run a training job (or attach to one) and say why it is as fast as it is."),
        "settings": ("tuneup.settings.show", "settings", "Show the tuned knobs as DataLoader, transformers, Lightning or environment arguments."),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.COMMANDS:
            return None
        self.invoked = name
        module, attr, _ = self.COMMANDS[name]
        return getattr(__import__(module, fromlist=[attr]), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in self.COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run with click's own error handling off, then map every outcome to one exit."""
        kwargs.setdefault("standalone_mode", False)
        self.invoked = None
        _replace_unencodable()
        try:
            code = super().main(*args, **kwargs)
        except click.exceptions.Exit as done:
            code = done.exit_code
        except click.ClickException as exc:  # usage: one line, never the usage block
            _say(self.invoked, exc.format_message() + _hint(self.invoked, exc))
            code = EXIT_USAGE if isinstance(exc, click.UsageError) else exc.exit_code
        except click.exceptions.Abort:
            _say(self.invoked, "interrupted")
            code = EXIT_INTERRUPTED
        except TuneupError as exc:
            _say(self.invoked, str(exc))
            code = exc.exit_code
        except KeyboardInterrupt:
            _say(self.invoked, "interrupted")
            code = EXIT_INTERRUPTED
        try:
            sys.stdout.flush()  # here, not at exit, where a closed pipe would be exit 1
        except BrokenPipeError:
            code = self._closed()
        sys.exit(code or 0)

    def invoke(self, ctx: click.Context) -> Any:
        """A pipe whose reader exited becomes :class:`OutputClosed` here, before click's own
        handler turns it into a silent exit 1 (the doctor's "error finding")."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            from tuneup.terminal import stdout_closed

            raise stdout_closed() from None

    def _closed(self) -> int:
        from tuneup.terminal import stdout_closed

        error = stdout_closed()
        _say(self.invoked, str(error))
        return error.exit_code


def _replace_unencodable() -> None:
    """A terminal or redirect that cannot encode a character (cp1252 on Windows, LANG=C)
    gets a replacement character, never a crash in the middle of a report."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="replace")


def _say(command: str | None, message: str) -> None:
    prefix = f"tuneup {command}" if command else "tuneup"
    click.echo(f"{prefix}: {message}", err=True)


def _hint(command: str | None, exc: click.ClickException) -> str:
    if "No such option" in exc.format_message() and command == "autotune":
        return " (pass the script's own arguments after --)"
    return ""


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tuneup")
def main() -> None:
    """Make PyTorch training fast on the machine it lands on.

    In the order you meet them: diagnose, tune, run, watch.

    \b
    tuneup doctor                      is this machine's driver / CUDA / PyTorch stack right?
    tuneup doctor --from report.txt    the same for a pasted collect_env report or error
    tuneup autotune train.py -- ARGS   probe the script, write train.tuneup.json
    python train.py                    tuned_loader / tuned_loop apply that file
    tuneup settings show train.py --as hf   the same knobs as TrainingArguments (or lightning)
    tuneup watch -- python train.py    why the job trains at the speed it does, live
    tuneup watch --daemon              the same for every training job on the machine

    Each command's --help says more; docs/ has a walk-through from a slow job to a fast one.
    """


if __name__ == "__main__":
    main()
