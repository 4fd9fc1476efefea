"""What a killed ``tuneup autotune`` left: its work folder, and the user's files its trials
changed. Liveness is the folder's lock (:mod:`tuneup.owned_dirs`), never a pid; a dead run's
journals and folder snapshot are replayed before its folder (with the only copies of the
originals) is removed, at the next start."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tuneup import owned_dirs
from tuneup.autotune.put_back import restore
from tuneup.autotune.snapshot import FolderSnapshot

WORKDIR_PREFIX = "tuneup-autotune-"  # + mkdtemp's part; swept once their lock is free
SNAPSHOT_DIR = "snapshot"  # in the work directory: the script's folder before the first trial
BEAT_GRACE_S = 5.0  # after the run's last mark of life: its trials die with it (death signal)


@dataclass
class Recovered:
    """What a sweep put back of dead runs' trials, what it left (changed since), and where
    it kept the versions it replaced (:attr:`FolderSnapshot.aside`)."""

    put_back: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    set_aside: dict[str, list[str]] = field(default_factory=dict)


def sweep_stale_workdirs(recovered: Recovered | None = None) -> list[Path]:
    """Remove the work directories of autotune runs that died without cleaning up (SIGKILL,
    power loss): those whose owner no longer holds their lock, in whatever pid namespace it
    ran. What the dead run's trials changed in the user's files is put back first (its
    journals replayed), and only then is the folder, with the copies, removed. Returns
    what was removed."""
    recovered = recovered if recovered is not None else Recovered()
    return owned_dirs.sweep(WORKDIR_PREFIX, lambda folder: replay_workdir(folder, recovered))


def replay_workdir(folder: Path, recovered: Recovered) -> None:
    """Put back what the trials of a dead run changed: every journal not yet replayed, the
    last process's first, except paths changed after the run's last sign of life (by the
    user's own work since: those stay, named in ``recovered.left``)."""
    try:
        until = owned_dirs.last_beat(folder) + BEAT_GRACE_S
    except OSError:
        until = None
    journals = sorted(folder.glob("writes-*.jsonl"), key=_process_number, reverse=True)
    for journal in journals:
        recovered.put_back.extend(restore(journal, until, recovered.left))
    snapshot = FolderSnapshot.load(folder / SNAPSHOT_DIR)
    if snapshot is not None:
        compared = snapshot.compare_and_put_back(until=until)
        recovered.put_back.extend(compared.put_back)
        recovered.left.extend(compared.not_put_back)
        if snapshot.set_aside:
            recovered.set_aside[str(snapshot.aside)] = snapshot.set_aside


def _process_number(journal: Path) -> int:
    number = journal.stem.rpartition("-")[2]
    return int(number) if number.isdigit() else 0


def file_notes(put_back: list[str], not_put_back: list[str],
               snapshot: FolderSnapshot | None, recovered: Recovered) -> list[str]:
    """The report's notes on the user's files: exactly what was put back and what was not,
    and where the versions a folder compare replaced were kept (``snapshot``: this run's)."""
    notes = []
    compared_in_part = snapshot is not None and not snapshot.complete
    kept = dict(recovered.set_aside)
    if snapshot is not None and snapshot.set_aside:
        kept[str(snapshot.aside)] = snapshot.set_aside
    if put_back:
        notes.append(f"the script wrote {len(put_back)} file(s) or folder(s) during trials "
                     f"({_names(put_back)}): each was put back as it was")
    if not_put_back:
        notes.append(f"{len(not_put_back)} file(s) changed during trials could NOT be put back "
                     f"({_names(not_put_back)}): changed by a writer the write guard does not "
                     "see with no copy kept (a file too big to copy before the trials, or past "
                     "what a run copies or sets aside), or made unwritable; check them")
    if compared_in_part:
        notes.append("the script's folder holds more entries than the snapshot before trials "
                     "records: a file there changed by a writer the guard does not see may "
                     "not have been put back")
    if recovered.put_back:
        notes.append(f"a killed autotune run had left {len(recovered.put_back)} file(s) as its "
                     f"trials changed them ({_names(recovered.put_back)}): put back now")
    for folder, paths in kept.items():
        notes.append(f"{len(paths)} file(s) changed or made while a trial ran, by a writer the "
                     f"write guard does not see ({_names(paths)}), were put back as before the "
                     f"trial; the versions found are kept in {folder} (yours, if you edited "
                     "them during the run)")
    if recovered.left:
        notes.append(f"{len(recovered.left)} file(s) a killed autotune run's trials changed were "
                     f"changed again after it died, or had no copy ({_names(recovered.left)}): "
                     "left as they are")
    return notes


def _names(paths: list[str], shown: int = 20) -> str:
    more = len(paths) - shown
    return ", ".join(paths[:shown]) + (f" and {more} more" if more > 0 else "")
