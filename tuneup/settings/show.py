"""``tuneup settings show``: the tuned knobs as another ecosystem's own arguments, to paste.

For people who would rather write ``TrainingArguments(dataloader_num_workers=4, bf16=True)``
or ``export OMP_NUM_THREADS=8`` than call tuneup from their script. The spellings come
from :mod:`tuneup.integrations.knobs_as`, the tables ``tuned_trainer`` and
``tuned_trainer_kwargs`` apply, so the two never disagree. Neither torch nor any
ecosystem's library is imported.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import IO, Any

import click

from tuneup.errors import UsageError
from tuneup.integrations import knobs_as
from tuneup.settings import Settings, SettingsError, store

ECOSYSTEMS = {
    "plain": "DataLoader keyword arguments and torch calls",
    "hf": "transformers.TrainingArguments fields",
    "lightning": "lightning.Trainer keyword arguments",
    "env": "environment variables",
}
# how each ecosystem's arguments are pasted: the call they go into and one argument's form
_PASTE = {
    "plain": ("DataLoader(...,", "    {name}={value!r},", ")"),
    "hf": ("TrainingArguments(...,", "    {name}={value!r},", ")"),
    "lightning": ("L.Trainer(...,", "    {name}={value!r},", ")"),
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def settings() -> None:
    """Read the settings file `tuneup autotune` wrote."""


@settings.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", required=False, metavar="[SCRIPT.py | SETTINGS.json]")
@click.option("--as", "ecosystem", type=click.Choice(list(ECOSYSTEMS)), default="plain",
              show_default=True, help="Whose arguments to print: " + "; ".join(
                  f"{name} = {what}" for name, what in ECOSYSTEMS.items()) + ".")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Text to paste, or one JSON object.")
def show(path: str | None, ecosystem: str, output_format: str) -> None:
    """Print the tuned knobs as another library's own arguments, to paste instead of calling
    tuneup from the script.

    PATH is a training script (its settings file is the one the runtime would read:
    TUNEUP_SETTINGS when set, else SCRIPT.tuneup.json beside it) or a settings file.
    Without PATH, TUNEUP_SETTINGS names the file.

    \b
    tuneup settings show train.py                  DataLoader kwargs and torch calls
    tuneup settings show train.py --as hf          TrainingArguments fields
    tuneup settings show train.py --as lightning   lightning.Trainer kwargs
    tuneup settings show train.py --as env         export lines (OMP_NUM_THREADS, ...)

    The knobs are those in the file; on another machine than the one it was tuned on the
    runtime applies only pin_memory (docs/settings.md). tuned_trainer (transformers) and
    tuned_trainer_kwargs (Lightning) apply the same arguments for you (docs/integrations.md).
    """
    file = settings_path(path)
    found = _read(file)
    spelled = spell(found, ecosystem, file)
    if output_format == "json":
        click.echo(json.dumps({"path": str(file), "as": ecosystem, "arguments": spelled.arguments,
                               "calls": list(spelled.calls), "left_out": spelled.left_out},
                              indent=2))
    else:
        write_text(file, found, ecosystem, spelled)


def settings_path(path: str | None) -> Path:
    """The file to show: the runtime's choice for a script, or the file named."""
    override = os.environ.get(store.ENV_PATH)
    if path is None:
        if not override:
            raise UsageError("name the training script or the settings file "
                             f"(or set {store.ENV_PATH})")
        return Path(override).expanduser()
    if path.endswith(".py"):
        return Path(override).expanduser() if override else store.default_path(path)
    return Path(path).expanduser()


def _read(file: Path) -> Settings:
    if not file.exists():
        raise UsageError(f"no settings file at {file}: run `tuneup autotune` on the script "
                         "first, or name the file")
    try:
        return store.read(file)
    except SettingsError as exc:
        raise UsageError(f"cannot use {file}: {exc}") from None


def spell(found: Settings, ecosystem: str, file: Path) -> knobs_as.Spelled:
    """The file's knobs in ``ecosystem``'s terms."""
    knobs = found.knobs
    if ecosystem == "hf":  # the batch autotune measured is the per-device batch to split
        return knobs_as.as_hf(knobs, batch_size=found.measured.effective_batch_size)
    if ecosystem == "lightning":
        return knobs_as.as_lightning(knobs)
    if ecosystem == "env":
        return knobs_as.as_env(knobs, str(file.resolve()))
    return knobs_as.as_plain(knobs)


def write_text(file: Path, found: Settings, ecosystem: str, spelled: knobs_as.Spelled,
               out: IO[str] | None = None) -> None:
    """The arguments as lines to paste, then the statements for the script (process-wide
    switches, what has no argument), then what has no spelling here and why."""
    from rich.markup import escape

    from tuneup import terminal

    console = terminal.console(file=out, highlight=False, soft_wrap=True)
    console.print(f"[bold]tuneup settings[/bold] — {escape(str(file))} as "
                  f"{ECOSYSTEMS[ecosystem]}")
    if not found.knobs.changed():
        console.print("no knobs set: PyTorch's defaults are the tuned ones")
        return
    for line in _pasted(ecosystem, spelled.arguments):
        console.print(escape(line))
    if spelled.calls:
        console.print("\n[bold]in your script[/bold]")
        for call in spelled.calls:
            console.print(escape(call))
    if spelled.left_out:
        console.print("\n[bold]not expressed here[/bold]")
        for name, why in spelled.left_out.items():
            console.print(f"  {name}: {escape(why)}")
    if found.fingerprint:
        console.print("\n[dim]tuned on a fingerprinted machine: elsewhere the runtime applies "
                      "only pin_memory (docs/settings.md)[/dim]")


def _pasted(ecosystem: str, arguments: dict[str, Any]) -> list[str]:
    if not arguments:
        return []
    if ecosystem == "env":
        return [f"export {name}={shlex.quote(str(value))}" for name, value in arguments.items()]
    opening, argument, closing = _PASTE[ecosystem]
    return [opening, *(argument.format(name=name, value=value)
                       for name, value in arguments.items()), closing]
