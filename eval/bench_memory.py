"""A bench variant's memory: the peak growth of one cold prefill, the median over several fresh processes.

Each process loads the model, resets the kernel's high-water mark (/proc/self/clear_refs = 5) and reads it
(VmHWM) after the prefill; on a GPU the measure is the CUDA allocator's peak.

The processes run with a fixed glibc mmap threshold (MALLOC_MMAP_THRESHOLD_, 64 KiB by default) so that freed
tensors go back to the kernel. Under glibc's default *dynamic* threshold, large blocks freed early raise the
threshold and later ones stay in the heap, fragmented: peak RSS then depends on the order and shapes of transient
allocations, not on what a method needs. Measured at 4096 tokens (3 processes each): baseline 1219-1339 MB and
Ms-PoE 1489-1642 MB (x1.17) with the dynamic threshold; 1154.1-1154.5 MB and 1156.3-1156.5 MB (x1.002) with the
fixed one.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from midlens.eval.memory import current_kb, peak_kb, reset_peak

MMAP_THRESHOLD = 65536


def prefill_memory(variant: str, model_name: str, tokens: int, device: str = "cpu", dtype: str = "float32") -> dict:
    """Memory of one cold prefill of `variant` in this process (meant to be a fresh one: see `memory_of`)."""
    import gc

    from midlens.eval.bench_runner import make_runner

    runner = make_runner(variant, model_name, tokens, device, dtype)
    # No warm-up prefill: the allocator keeps what a warm-up freed (differently per variant), which hid
    # part of the second prefill's growth and inflated the resting size. One cold prefill per process.
    gc.collect()
    base = current_kb(device)
    exact = reset_peak(device)  # GPU memory is the CUDA allocator's peak, exact and per process
    runner.prefill()
    peak = peak_kb(device) if exact else current_kb(device)
    return {
        "variant": variant,
        "tokens": runner.prompt.num_tokens,
        "base_mb": base / 1024,
        "peak_growth_mb": (peak - base) / 1024,
        "peak_mb": peak / 1024,
        "exact": exact,
        "mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    }


def memory_of(
    variant: str,
    model_name: str,
    tokens: int,
    repeats: int = 3,
    mmap_threshold: int = MMAP_THRESHOLD,
    device: str = "cpu",
    dtype: str = "float32",
) -> dict:
    """Median over `repeats` fresh processes. `mmap_threshold` = 0 keeps glibc's dynamic threshold, under
    which one process's peak varies by +-200 MB at 4k tokens, more than the differences being measured.
    On a GPU the measure is the CUDA allocator's peak during the prefill."""
    samples = [_memory_once(variant, model_name, tokens, mmap_threshold, device, dtype) for _ in range(repeats)]
    return {
        **samples[0],
        "peak_growth_mb": statistics.median(s["peak_growth_mb"] for s in samples),
        "peak_mb": statistics.median(s["peak_mb"] for s in samples),
        "samples_peak_mb": [s["peak_mb"] for s in samples],
    }


def _memory_once(variant: str, model_name: str, tokens: int, mmap_threshold: int, device: str, dtype: str) -> dict:
    """`prefill_memory` in a fresh interpreter. A subprocess rather than a multiprocessing child: the environment
    is given to it alone (glibc reads the threshold at process start), its output is kept for the error message,
    and it starts bare, without re-importing the parent's main module as a spawned child would."""
    env = dict(os.environ)
    if mmap_threshold > 0:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    else:
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
    call = f"prefill_memory{(variant, model_name, tokens, device, dtype)!r}"
    code = f"import json\nfrom midlens.eval.bench_memory import prefill_memory\nprint(json.dumps({call}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe for {variant} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
