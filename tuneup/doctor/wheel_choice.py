"""The torch wheel ``scripts/setup.sh`` installs on this machine, from the doctor's own tables.

Torch-free (the standard library and ``packaging``), so it runs before torch is installed:
``python -m tuneup.doctor.wheel_choice`` prints pip's arguments on stdout and one line on
stderr saying why. Without an NVIDIA GPU (no ``/proc/driver/nvidia/version`` and no
``nvidia-smi`` answering) that is the CPU wheel, so no multi-GB CUDA build is pulled. With
one, the wheel ``tuneup doctor`` names in its fixes (``rules.recommend.find_wheel``): the
newest stable CUDA variant of the wanted release whose kernels cover every GPU and whose CUDA
the driver runs, else the newest release where one does (the GPU too new or the driver too
old for the wanted one); an experimental variant only where no stable one fits. ``TUNEUP_TORCH`` names the
release (then kept: the CPU wheel when none of its variants fits), ``TUNEUP_TORCH_INDEX`` the
index (no choice made).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from tuneup.doctor import knowledge as kb
from tuneup.doctor.rules.context import Context
from tuneup.doctor.rules.recommend import find_wheel
from tuneup.machine.probe.nvidia_smi import NvidiaFacts, read_nvidia
from tuneup.machine.snapshot import GPU, Driver, Platform, Snapshot

DEFAULT_TORCH = "2.13.0"  # the release the project is tested with
INDEX = "https://download.pytorch.org/whl/{variant}"
CPU = "cpu"
ENV_TORCH, ENV_INDEX = "TUNEUP_TORCH", "TUNEUP_TORCH_INDEX"

@dataclass(frozen=True)
class WheelChoice:
    """One torch wheel: its version, its download.pytorch.org variant, and why."""

    version: str
    variant: str
    reason: str
    index_url: str | None = None  # set: the user's own index

    def pip_args(self) -> list[str]:
        return [f"torch=={self.version}", "--index-url",
                self.index_url or INDEX.format(variant=self.variant)]


def choose(facts: NvidiaFacts | None, python: str | None, wanted: str = DEFAULT_TORCH,
           pinned: bool = False) -> WheelChoice:
    """The wheel for this driver, these GPUs and this Python (``pinned``: only ``wanted``'s
    release; otherwise the newest release that fits when ``wanted``'s does not)."""
    if facts is None:
        return WheelChoice(wanted, CPU, "no NVIDIA GPU: the CPU wheel")
    snapshot = Snapshot(
        platform=Platform(python_version=python, os_family="linux"),
        driver=Driver(version=facts.driver),
        gpus=[GPU(index=i, name=name, vendor="nvidia", compute_capability=cc)
              for i, (name, cc) in enumerate(facts.gpus)])
    ctx = Context(snapshot)
    known = [gpu.cc for gpu in ctx.nvidia_gpus if gpu.cc]
    start = kb.torch_release(wanted)
    found = find_wheel(ctx, cc=known[0] if known else None, start=start, same_release_only=pinned)
    machine = _describe(ctx, facts)
    if found is None:
        which = f"torch {wanted} wheel" if pinned else "torch wheel"
        return WheelChoice(wanted, CPU, f"no {which} in tuneup's tables fits {machine}: the "
                           "CPU wheel (`tuneup doctor` says why)")
    release, variant = found
    version = wanted if release is start else release.latest
    return WheelChoice(version, variant, f"{machine}: the {variant} wheel")


def _describe(ctx: Context, facts: NvidiaFacts) -> str:
    gpus = ", ".join(f"{gpu.name} (CC {gpu.cc or '?'})" for gpu in ctx.nvidia_gpus) or "a GPU"
    return f"{gpus}, driver {facts.driver or 'unknown'}"


def from_environment(environ: dict[str, str], facts: Callable[[], NvidiaFacts | None],
                     python: str | None) -> WheelChoice:
    """What set-up installs: the variables' wheel when set, else :func:`choose`'s."""
    wanted = environ.get(ENV_TORCH, "").strip()
    index = environ.get(ENV_INDEX, "").strip()
    if index:
        return WheelChoice(wanted or DEFAULT_TORCH, "", f"{ENV_INDEX}={index}", index_url=index)
    return choose(facts(), python, wanted or DEFAULT_TORCH, pinned=bool(wanted))


def main() -> None:
    python = ".".join(map(str, sys.version_info[:3]))
    choice = from_environment(dict(os.environ), read_nvidia, python)
    print(f"tuneup setup: installing torch {choice.version} ({choice.reason})", file=sys.stderr)
    print(" ".join(choice.pip_args()))


if __name__ == "__main__":
    main()
