"""Regenerate tuneup/doctor/data/cuda_errors.csv from a CUDA toolkit: every ``cudaError_t``
(its code, name, the exact ``cudaGetErrorString`` text and the header's description) and every
``CUresult`` of the driver API (code, name, description).

Run where a CUDA toolkit is installed (no GPU or driver needed: the strings are a lookup in
libcudart):  python scripts/harvest_cuda_errors.py [/usr/local/cuda]

Which category a code belongs to (an environment fault the doctor diagnoses, or a fault of the
program) is judgement, declared once below in ``ENVIRONMENT``; every other code is a program
error: the doctor says so instead of refusing the text.
"""

from __future__ import annotations

import csv
import ctypes
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tuneup" / "doctor" / "data" / "cuda_errors.csv"

# runtime name -> (category, severity, fix). A code proves its category (error) only when the
# message alone settles it; otherwise it is a lead (warning).
ENVIRONMENT = {
    "cudaErrorInsufficientDriver": (
        "driver-too-old", "error",
        "update the NVIDIA driver to one that runs the build's CUDA (nvidia-smi shows the highest "
        "CUDA the driver runs), or install a torch build for an older CUDA"),
    "cudaErrorCallRequiresNewerDriver": (
        "driver-too-old", "error", "update the NVIDIA driver"),
    "cudaErrorUnsupportedPtxVersion": (
        "driver-too-old", "error",
        "update the NVIDIA driver: the PTX was made by a newer CUDA toolkit than the driver knows"),
    "cudaErrorInvalidPtx": (
        "driver-too-old", "warning",
        "a PTX JIT failure is most often a driver older than the toolkit that made the PTX: "
        "update the NVIDIA driver, or install a build with SASS for the GPU"),
    "cudaErrorCompatNotSupportedOnDevice": (
        "driver-too-old", "error",
        "the host driver is older than the container's CUDA, and forward compatibility works only "
        "on data-center GPUs: update the host driver, or use a container image for the host's "
        "CUDA (nvidia-smi on the host)"),
    "cudaErrorNoKernelImageForDevice": (
        "arch-unsupported", "error",
        "install a build whose arch list (torch.cuda.get_arch_list()) covers the GPU's compute "
        "capability (nvidia-smi --query-gpu=compute_cap --format=csv)"),
    "cudaErrorInvalidKernelImage": (
        "arch-unsupported", "warning",
        "compare torch.cuda.get_arch_list() with the GPU's compute capability"),
    "cudaErrorInvalidDeviceFunction": (
        "arch-unsupported", "warning",
        "the build (or an extension) has no kernel for the GPU: compare "
        "torch.cuda.get_arch_list() with nvidia-smi --query-gpu=compute_cap --format=csv"),
    "cudaErrorNoDevice": (
        "no-gpu-visible", "error",
        "check nvidia-smi; in a container start it with --gpus all; unset CUDA_VISIBLE_DEVICES "
        "or set it to an existing index"),
    "cudaErrorInvalidDevice": (
        "no-gpu-visible", "warning",
        "the program asked for a GPU index that does not exist here: check CUDA_VISIBLE_DEVICES "
        "and nvidia-smi -L (a MIG-partitioned GPU shows one device per process)"),
    "cudaErrorDevicesUnavailable": (
        "no-gpu-visible", "error",
        "the GPU is in exclusive-process compute mode and busy, or prohibited: nvidia-smi -q -d "
        "COMPUTE; sudo nvidia-smi -c DEFAULT"),
    "cudaErrorSystemNotReady": (
        "no-gpu-visible", "error",
        "on NVSwitch systems (HGX/DGX A100, H100, H200, B200) start NVIDIA Fabric Manager with "
        "exactly the driver's version: systemctl status nvidia-fabricmanager; install the "
        "nvidia-fabricmanager package of the driver's branch and version"),
    "cudaErrorSystemDriverMismatch": (
        "no-gpu-visible", "error",
        "the loaded kernel module and the user-space driver (libcuda) differ: reboot after a "
        "driver update, or remove a second libcuda (container compat libraries) from the path"),
    "cudaErrorStubLibrary": (
        "no-gpu-visible", "error",
        "a libcuda stub (from a toolkit's lib64/stubs) is loaded instead of the driver: remove "
        "the stubs folder from LD_LIBRARY_PATH, install the NVIDIA driver"),
    "cudaErrorInitializationError": (
        "no-gpu-visible", "warning",
        "CUDA could not initialise: check nvidia-smi; after a driver update reboot; in a "
        "container start it with --gpus all"),
    "cudaErrorUnknown": (
        "no-gpu-visible", "warning",
        "CUDA failed to initialise with no reason: reboot after a driver (re)install or a "
        "suspend (or reload nvidia_uvm: sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm)"),
    "cudaErrorDeviceNotLicensed": (
        "no-gpu-visible", "error", "the vGPU has no license: check the NVIDIA license client"),
    "cudaErrorMpsConnectionFailed": (
        "no-gpu-visible", "warning",
        "the CUDA MPS server is not reachable: start nvidia-cuda-mps-control -d or unset "
        "CUDA_MPS_PIPE_DIRECTORY"),
}
PROGRAM_FIX = ("not an environment fault: the stack can be healthy; rerun with "
               "CUDA_LAUNCH_BLOCKING=1 to find the failing call")
SOURCE = "CUDA {version} {header}{strings}"


def main(root: Path) -> None:
    include = root / "include"
    library = next(iter(sorted((root / "lib64").glob("libcudart.so.*"))), None)
    strings = ctypes.CDLL(str(library)) if library else None
    if strings is not None:
        strings.cudaGetErrorString.restype = ctypes.c_char_p
    version = re.search(r"#define CUDA_VERSION (\d+)", (include / "cuda.h").read_text())
    release = f"{int(version.group(1)) // 1000}.{int(version.group(1)) % 1000 // 10}"
    runtime = _enum((include / "driver_types.h").read_text(), "cudaError", r"cuda(?:Error\w+|Success)")
    driver = _enum((include / "cuda.h").read_text(), "cudaError_enum", r"CUDA_(?:ERROR_\w+|SUCCESS)")
    by_code = {code: name for name, code, _ in runtime}
    rows = []
    for name, code, doc in runtime:
        if code == 0:
            continue
        text = strings.cudaGetErrorString(code).decode() if strings else ""
        rows.append(_row("cuda-runtime", name, code, text, doc, name,
                         SOURCE.format(version=release, header="driver_types.h",
                                       strings=" and cudaGetErrorString" if text else "")))
    for name, code, doc in driver:
        if code == 0:
            continue
        rows.append(_row("cuda-driver", name, code, "", doc, by_code.get(code, ""),
                         SOURCE.format(version=release, header="cuda.h", strings="")))
    with OUT.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["api", "name", "code", "text", "category", "severity", "cause", "fix",
                         "source"])
        writer.writerows(rows)
    print(f"{len(rows)} codes -> {OUT}")


def _enum(header: str, tag: str, names: str) -> list[tuple[str, int, str]]:
    """(name, value, description) of each member of the enum ``tag``."""
    start = header.index(f"enum __device_builtin__ {tag}") if tag == "cudaError" else \
        header.index(f"typedef enum {tag}")
    body = header[start:header.index("}", start)]
    found = []
    for match in re.finditer(rf"/\*\*((?:(?!\*/).)*)\*/\s*({names})\s*=\s*(\d+)", body, re.S):
        doc = " ".join(match.group(1).replace("*", " ").replace("\\ref", "").split())
        doc = re.sub(r"::(\w+)", r"\1", doc).split(". ")[0].rstrip(".") + "."
        found.append((match.group(2), int(match.group(3)), doc))
    return found


def _row(api: str, name: str, code: int, text: str, doc: str, runtime_name: str,
         source: str) -> list[object]:
    category, severity, fix = ENVIRONMENT.get(runtime_name, ("program-error", "info", PROGRAM_FIX))
    return [api, name, code, text, category, severity, doc, fix, source]


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/local/cuda"))
