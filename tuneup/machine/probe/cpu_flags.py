"""The CPU flags that matter for training speed, shared by the live probe and the readers."""

from __future__ import annotations

# CPU flags that decide which kernels and dtypes run fast; everything else is noise here.
RELEVANT_CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "sve",
    "sve2",
    "bf16",
    "i8mm",  # aarch64 "Features"
)

def relevant_flags(flags_text: str) -> list[str]:
    """The flags of :data:`RELEVANT_CPU_FLAGS` present in a space-separated flag list."""
    present = set(flags_text.split())
    return [flag for flag in RELEVANT_CPU_FLAGS if flag in present]
