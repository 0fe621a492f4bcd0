"""This process's memory as the benchmarks read it: the resident set and its peak from the Linux kernel
(/proc/self/status; the peak is reset through /proc/self/clear_refs), or the CUDA allocator's on a GPU.

torch is imported only on a GPU path: `midlens --help` imports the bench modules that use this one."""

from __future__ import annotations

from pathlib import Path


def rss_kb(field: str = "VmRSS") -> int:
    """A figure of /proc/self/status in KiB: VmRSS (resident now) or VmHWM (the peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _on_gpu(device: object) -> bool:
    return str(device).startswith("cuda")


def reset_peak(device: object = "cpu") -> bool:
    """Start a new peak here: the CUDA allocator's on a GPU, else the kernel's RSS high-water mark; False where the
    kernel refuses (VmHWM then still holds the process's whole-life peak)."""
    if _on_gpu(device):
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def current_kb(device: object = "cpu") -> float:
    """Memory in use now, in KiB: the CUDA allocator's on a GPU, else the resident set."""
    if _on_gpu(device):
        import torch

        return torch.cuda.memory_allocated() / 1024
    return rss_kb("VmRSS")


def peak_kb(device: object = "cpu") -> float:
    """The peak since `reset_peak`, in KiB: the CUDA allocator's on a GPU (after queued work), else VmHWM."""
    if _on_gpu(device):
        import torch

        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 1024
    return rss_kb("VmHWM")
