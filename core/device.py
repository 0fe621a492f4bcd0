"""Where a model runs and in which precision: `auto` means CUDA + bfloat16 when a GPU is present; on a CPU, bfloat16
where the processor computes it natively (AVX512-BF16 or AMX), else fp32.

Every shell takes the same two strings (device `auto|cpu|cuda[:N]`, dtype `auto|float32|bfloat16|float16`); they
are resolved here, once, into torch objects, with an error naming what was asked and what exists.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from midlens.core.errors import DeviceError, Remedy

DEVICE_CHOICES = "auto | cpu | cuda | cuda:N"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise DeviceError(f"device {spec!r} is not a device name; use {DEVICE_CHOICES}.") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceError(f"device {spec!r}: midlens runs on {DEVICE_CHOICES}.")
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found == 0:
        raise DeviceError(
            f"device {spec!r} was asked for but this machine has no CUDA GPU visible to torch "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}).",
            remedies=[Remedy("device", "cpu"), Remedy("device", "auto", "to use a GPU only where there is one")],
        )
    index = 0 if device.index is None else device.index
    if index >= found:
        raise DeviceError(f"device {spec!r}: this machine has {found} CUDA GPU(s), cuda:0..cuda:{found - 1}.")
    return torch.device("cuda", index)


def resolve_dtype(spec: str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    if isinstance(spec, torch.dtype):
        if spec not in DTYPES.values():
            raise DeviceError(f"dtype {spec}: choose one of auto, {', '.join(DTYPES)}.")
        return spec
    spec = (spec or "auto").strip().lower()
    spec = DTYPE_ALIASES.get(spec, spec)
    if spec == "auto":
        # bf16 keeps SDPA on the fused kernels on a GPU. On a CPU with native bf16 it answers ~2x faster than fp32
        # with the same answers within the parity measured in docs/results/cpu-bf16/ (EM and F1 intervals include
        # zero on both packaged models and corpora); elsewhere bf16 is emulated and slower, so fp32.
        if device is not None and device.type == "cuda":
            return torch.bfloat16
        return cpu_default_dtype()
    if spec not in DTYPES:
        raise DeviceError(f"dtype {spec!r}: choose one of auto, {', '.join(DTYPES)}.")
    return DTYPES[spec]


CPU_DTYPE_ENV = "MIDLENS_CPU_DTYPE"


def cpu_default_dtype() -> torch.dtype:
    """What dtype="auto" means on a CPU: $MIDLENS_CPU_DTYPE when set (float32 or bfloat16: one setting for every
    process, a test suite's subprocesses included), else bf16 where the CPU runs it natively, else fp32."""
    chosen = os.environ.get(CPU_DTYPE_ENV, "").strip().lower()
    if chosen:
        chosen = DTYPE_ALIASES.get(chosen, chosen)
        if chosen not in ("float32", "bfloat16"):
            raise DeviceError(f"${CPU_DTYPE_ENV}={chosen!r}: set it to float32 or bfloat16, or unset it.")
        return DTYPES[chosen]
    return torch.bfloat16 if cpu_runs_bf16() else torch.float32


def cpu_runs_bf16() -> bool:
    """Whether this CPU computes bf16 natively, as torch reports it (AVX512-BF16 dot products or AMX tiles): where
    it does, bf16 matmuls run ~2-3x faster than fp32's; where it does not, they are emulated and slower."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_device_async(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the stream: pinned, copied asynchronously. A copy from pageable
    memory waits for every queued kernel, and one per decode step kept the host from running ahead of the GPU."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def id_tensor(ids: list[int]) -> torch.Tensor:
    """Token ids as a 1-D long tensor on the CPU. Through numpy: `torch.tensor` on a Python list of 32k ints takes
    5 ms, numpy under 1, and a prompt is converted on every prefill (on a GPU, where the host bounds a small
    model's prefill, that was 3 % of a 32k-token one)."""
    return torch.from_numpy(np.asarray(ids, dtype=np.int64))
