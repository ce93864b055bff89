"""The header every speed benchmark prints: which CPU, which of its vector / bf16 flags,
how many threads, and how loaded the machine was (numbers from different CPUs or loads
are not comparable; ratios within one interleaved run are)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from multimodal.precision import cpu_flags

FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16",
                     "amx_int8", "neon", "asimd", "sve")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_header() -> str:
    """One line: CPU model, cores, the flags that decide kernels and precision, torch's
    CPU capability, threads, and the load average when the run started."""
    flags = cpu_flags()
    have = [f for f in FLAGS_OF_INTEREST if f in flags]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"CPU: {cpu_model()}, {os.cpu_count()} cores; flags: {' '.join(have) or 'n/a'}; "
            f"torch {torch.__version__} capability {torch.backends.cpu.get_cpu_capability()}"
            f", {torch.get_num_threads()} thread(s); load average {load:.1f} at start")
