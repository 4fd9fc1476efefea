"""Recorded windows replayed into samples: NVML through the fake module and the real
:class:`GpuReader`, the process, host and runtime figures as the recording gives them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fake_nvml import FakeNvml

from tuneup.watch.nvml import open_gpus
from tuneup.watch.samples import HostSample, ProcessSample, RuntimeSample, Sample

RECORDINGS = Path(__file__).with_name("recordings")


def load(name: str) -> dict[str, Any]:
    return json.loads((RECORDINGS / f"{name}.json").read_text())


def _at(value: Any, tick: int) -> Any:
    return value[tick] if isinstance(value, list) else value


def replay(recording: dict[str, Any]) -> list[Sample]:
    nvml = FakeNvml(recording)
    reader, note = open_gpus(nvml)
    assert note is None and reader is not None
    samples = []
    for tick in range(len(recording["ticks"])):
        nvml.advance()
        processes = tuple(
            ProcessSample(pid=p["pid"], role=p["role"], cpu_percent=_at(p["cpu"], tick),
                          busy_threads=_at(p["busy"], tick), threads=p["threads"], rss=p["rss"],
                          read_bytes=None)
            for p in recording["processes"])
        host = recording["host"]
        runtime = recording["runtime"]
        records: tuple[RuntimeSample, ...] = ()
        if runtime is not None:
            per_tick = {key: value * (tick + 1) for key, value in runtime["per_tick"].items()}
            static = {k: v for k, v in runtime.items() if k != "per_tick"}
            records = (RuntimeSample(**static, **per_tick),)
        samples.append(Sample(
            t=float(tick), gpus=reader.read({p.pid for p in processes}), processes=processes,
            host=HostSample(cpu_percent=_at(host["cpu"], tick),
                            iowait_percent=_at(host["iowait"], tick),
                            swap_bytes_s=host["swap_bytes_s"],
                            memory_available=host["memory_available"],
                            memory_total=host["memory_total"], usable_cores=host["usable_cores"]),
            runtime=records))
    return samples


def published(directory: Path) -> list[int]:
    """The pids whose feed files lie in ``directory`` (the watcher knows them from the job's
    process tree and never lists the folder; a test lists it for them)."""
    return [int(path.name[:-5]) for path in directory.glob("*.json") if path.name[:-5].isdigit()]
