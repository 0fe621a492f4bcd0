"""Benchmarks (commands, not tests): `midlens bench evidence`, and the method benches `midlens bench ms-poe`,
`moice` and `attn-calibration`.

Times are medians over repeats, interleaved across variants in one process so machine noise hits
them alike; ratios are against the baseline of the same run. Memory is the peak growth of one prefill,
the median over several fresh processes per variant (eval.bench_memory).
"""

from __future__ import annotations

import statistics
import time

# torch is imported by the functions that run models: `midlens --help` builds this module's parser.
from midlens.core.errors import MidlensError
from midlens.eval.bench_memory import MMAP_THRESHOLD, memory_of
from midlens.eval.bench_runner import make_runner

# plain: transformers' own SDPA forward; module: the same prefill through midlens' attention module, no probe;
# evidence: with the probe reading the question's and the last token's passage mass; score: Generator.score, what a
# caller pays for evidence (that prefill, the content-free pass, the Answer); eager: transformers returning its maps.
VARIANTS_EVIDENCE = ("plain", "module", "evidence", "score", "eager")
# A method bench (`midlens bench NAME`) times the baseline, then the method's own variants (its registry entry's
# `bench_variants`), through Generator; it also times the whole answer path, Generator.generate (prefill with
# evidence, the method's extra passes, decoding): attn-calibration costs nothing in the plain prefill and all of its
# work happens there.


def method_variants(kind: str) -> tuple[str, ...]:
    from midlens.generators.methods.registry import REGISTRY

    variants = REGISTRY[kind].bench_variants
    if not variants:
        raise MidlensError(
            f"method {kind!r} has no bench variants: `midlens bench` times those whose entry lists some."
        )
    return ("baseline", *variants)


def timed(fn, repeats: int) -> list[float]:  # fn synchronizes the GPU itself
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def run(
    kind: str,
    model_name: str,
    token_sizes: list[int],
    repeats: int,
    decode_tokens: int,
    memory_repeats: int = 3,
    mmap_threshold: int = MMAP_THRESHOLD,
    device: str = "cpu",
    dtype: str = "float32",
    skip_eager: bool = False,
) -> dict:
    """Time every variant of `kind` at each prompt size against the baseline in one run, with peak memory.

    One function on purpose: the variants are interleaved repeat by repeat in one loop, so every ratio compares
    timings taken under the same machine load; split, the loops would drift apart."""
    import torch

    variants = VARIANTS_EVIDENCE if kind == "evidence" else method_variants(kind)
    if skip_eager:
        variants = tuple(v for v in variants if v != "eager")
    base = variants[0]
    report: dict = {
        "kind": kind,
        "model": model_name,
        "device": device,
        "dtype": dtype,
        "gpu": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None,
        "threads": torch.get_num_threads(),
        "malloc_mmap_threshold": mmap_threshold or "glibc default (dynamic)",
        "sizes": [],
    }
    for tokens in token_sizes:
        runners = {v: make_runner(v, model_name, tokens, device, dtype) for v in variants}
        for v in variants:
            runners[v].prefill()  # warm-up
        samples: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(repeats):  # interleaved so drifts hit every variant
            for v in variants:
                samples[v] += timed(runners[v].prefill, 1)
        median = {v: statistics.median(s) for v, s in samples.items()}
        n = runners[variants[1]].prompt.num_tokens
        row = {
            "prompt_tokens": n,
            "prefill_s": median,
            "prefill_tok_per_s": {v: n / t for v, t in median.items()},
            "time_ratio": {v: median[v] / median[base] for v in variants},
        }
        if "module" in median:  # evidence's own cost: against the same prefill through the same module
            row["over_module"] = {v: median[v] / median["module"] for v in variants}
        if memory_repeats > 0:  # 0: timings only (each memory figure is a fresh process per variant and repeat)
            mem = {v: memory_of(v, model_name, tokens, memory_repeats, mmap_threshold, device, dtype) for v in variants}
            row |= {
                "peak_growth_mb": {v: mem[v]["peak_growth_mb"] for v in variants},
                "peak_rss_mb": {v: mem[v]["peak_mb"] for v in variants},
                "memory_ratio_total": {v: mem[v]["peak_mb"] / mem[base]["peak_mb"] for v in variants},
                "memory_ratio_growth": {
                    v: mem[v]["peak_growth_mb"] / max(mem[base]["peak_growth_mb"], 1e-9) for v in variants
                },
            }
        if kind == "evidence":
            decode = runners["evidence"].decode
            plain_tps = statistics.median(decode(decode_tokens, False) for _ in range(3))
            ev_tps = statistics.median(decode(decode_tokens, True) for _ in range(3))
            row["decode_tok_per_s"] = {
                "without_evidence": plain_tps,
                "with_evidence": ev_tps,
                "ratio": ev_tps / plain_tps,
            }
        else:
            tps = {v: statistics.median(runners[v].decode(decode_tokens, False) for _ in range(3)) for v in variants}
            row["decode_tok_per_s"] = {**tps, **{f"ratio {v}": tps[v] / tps[base] for v in variants[1:]}}
            answers: dict[str, list[dict]] = {v: [] for v in variants}
            for _ in range(repeats):  # interleaved, like the prefills
                for v in variants:
                    answers[v].append(runners[v].answer(decode_tokens))
            parts = {v: {k: statistics.median(a[k] for a in runs) for k in runs[0]} for v, runs in answers.items()}
            row["answer"] = {
                "new_tokens": decode_tokens,
                "seconds": parts,
                "time_ratio": {v: parts[v]["answer_s"] / parts[base]["answer_s"] for v in variants},
            }
        report["sizes"].append(row)
        del runners
    return report


def print_report(report: dict) -> None:
    for row in report["sizes"]:
        print(
            f"\n{report['kind']} bench, {report['model']}, {row['prompt_tokens']} prompt tokens, "
            f"{report['device']} {report['dtype']}, {report['threads']} threads"
        )
        w = max(16, *(len(v) for v in row["prefill_s"]))
        print(
            f"{'variant':<{w}} {'prefill s':>10} {'tok/s':>8} {'time x':>7} {'peak +MB':>9} {'peak MB':>8} "
            f"{'mem x tot':>9} {'mem x +':>8}"
        )
        for v in row["prefill_s"]:
            memory = (
                f" {row['peak_growth_mb'][v]:>9.0f} {row['peak_rss_mb'][v]:>8.0f} "
                f"{row['memory_ratio_total'][v]:>9.3f} {row['memory_ratio_growth'][v]:>8.3f}"
                if "peak_rss_mb" in row
                else "  (memory not measured: --memory-repeats 0)"
            )
            print(
                f"{v:<{w}} {row['prefill_s'][v]:>10.3f} {row['prefill_tok_per_s'][v]:>8.0f} "
                f"{row['time_ratio'][v]:>7.3f}{memory}"
            )
        if "over_module" in row:
            ratios = ", ".join(f"{v} {r:.3f}" for v, r in row["over_module"].items())
            print(f"time over the module's own prefill: {ratios}")
        d = row["decode_tok_per_s"]
        print("decode tok/s: " + ", ".join(f"{k} {v:.3f}" for k, v in d.items()))
        if "answer" in row:
            a = row["answer"]
            print(f"answer path (Generator.generate, {a['new_tokens']} new tokens), median seconds:")
            for v, parts in a["seconds"].items():
                split = ", ".join(f"{k} {t:.3f}" for k, t in parts.items() if k.endswith("_s") and k != "answer_s")
                print(f"  {v:<{w}} {parts['answer_s']:>8.3f} s  x{a['time_ratio'][v]:.3f}  ({split})")
