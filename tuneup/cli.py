"""The ``tuneup`` command line: one group, one sub-command per entry point."""

from __future__ import annotations

import click

from tuneup import __version__


class LazyGroup(click.Group):
    """Imports a sub-command only when it runs, so ``tuneup doctor --from`` stays torch-free."""

    COMMANDS = {
        "doctor": ("tuneup.doctor.command", "doctor", "Check driver, CUDA, cuDNN, NCCL, the PyTorch build and the GPU against each other."),
        "autotune": ("tuneup.autotune.command", "autotune", "Probe a training script and write the settings that make it fastest."),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.COMMANDS:
            return None
        module, attr, _ = self.COMMANDS[name]
        return getattr(__import__(module, fromlist=[attr]), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in self.COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tuneup")
def main() -> None:
    """Make PyTorch training fast on the machine it lands on.

    \b
    tuneup doctor              diagnose this machine's GPU / CUDA / PyTorch stack
    tuneup doctor --from F     diagnose a `python -m torch.utils.collect_env` report
    tuneup autotune train.py   tune the training script's loader, batch, AMP, compile
    """
