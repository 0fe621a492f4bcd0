"""Where evidence's prefill time goes: the stock model (SDPA), midlens' attention module without a probe, and with
the probe, at each prompt size; torch.profiler's top kernels per variant and the probe's own share (its
`observe` calls wrapped in a named range here, not in the library).

    python profile_evidence.py MODEL_DIR --tokens 2048,8192,32768 --device cuda --dtype bfloat16 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from midlens.eval.bench_runner import make_runner
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.probe import PassageProbe

VARIANTS = ("plain", "baseline", "evidence")


def earlier_probe_runner(path: Path, model: str, tokens: int, device: str, dtype: str):
    """The `evidence` variant with the PassageProbe of another version (its probe.py at `path`), so two versions
    are timed in one process, interleaved, against the same stock prefill."""
    import importlib.util

    from midlens.eval.bench_runner import Runner, bench_prompt, synchronize
    from midlens.generators import Generator, load_model

    spec = importlib.util.spec_from_file_location("earlier_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = Generator(load_model(model, device, dtype), method="baseline")
    prompt = bench_prompt(gen.tokenizer, tokens)

    def prefill() -> None:
        probe = module.PassageProbe(prompt.passage_spans, gen.num_layers, gen.probe_layers())
        with gen.running(probe):
            probe.score_rows(list(range(*prompt.question_span)) + [prompt.num_tokens - 1])
            gen.forward(prompt.input_ids, new_cache())
            probe.take()
        synchronize()

    return Runner(prompt, prefill)


def _named_observe():
    """PassageProbe.observe inside a named range, for the profiler only (timed runs call the library's own)."""
    observe = PassageProbe.observe

    def named(self, *args, **kwargs):
        with record_function("probe.observe"):
            return observe(self, *args, **kwargs)

    return named


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", default="2048,8192")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--earlier-probe", type=Path, help="another version's probe.py, timed as `evidence-before`")
    args = parser.parse_args()
    variants = VARIANTS + (("evidence-before",) if args.earlier_probe else ())
    args.out.mkdir(parents=True, exist_ok=True)
    library_observe, named_observe = PassageProbe.observe, _named_observe()
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    report = {"model": args.model, "device": args.device, "dtype": args.dtype, "sizes": []}
    if cuda:
        report["gpu"] = torch.cuda.get_device_name()
    for tokens in [int(t) for t in args.tokens.split(",")]:
        runners = {v: make_runner(v, args.model, tokens, args.device, args.dtype) for v in VARIANTS}
        if args.earlier_probe:
            runners["evidence-before"] = earlier_probe_runner(
                args.earlier_probe, args.model, tokens, args.device, args.dtype
            )
        for r in runners.values():  # warm-up: kernels, allocator
            r.prefill()
            r.prefill()
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.repeats):  # interleaved, so machine noise hits every variant alike
            for v, r in runners.items():
                t0 = time.perf_counter()
                r.prefill()
                times[v].append(time.perf_counter() - t0)
        median = {v: statistics.median(t) for v, t in times.items()}
        row = {
            "prompt_tokens": runners["plain"].prompt.num_tokens,
            "prefill_s": median,
            "ratio_to_plain": {v: median[v] / median["plain"] for v in variants},
            "probe_observe_s": None,
        }
        if cuda:  # peak memory of one prefill above what is held before it (weights, the other variants' models)
            peak = {}
            for v, r in runners.items():
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                held = torch.cuda.memory_allocated()
                r.prefill()
                peak[v] = torch.cuda.max_memory_allocated() - held
            row["peak_bytes_above_held"] = peak
            row["peak_ratio_to_plain"] = {v: peak[v] / peak["plain"] for v in variants}
        for v, r in runners.items():
            PassageProbe.observe = named_observe
            with profile(activities=activities) as prof:
                for _ in range(3):
                    r.prefill()
            PassageProbe.observe = library_observe
            table = prof.key_averages().table(
                sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=25, max_name_column_width=60
            )
            (args.out / f"profile-{v}-{tokens}.txt").write_text(table + "\n")
            # The host's side too: a prefill that waits on the host shows it here, not in the kernels.
            host = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)
            (args.out / f"profile-{v}-{tokens}-host.txt").write_text(host + "\n")
            if v.startswith("evidence"):
                for event in prof.key_averages():
                    if event.key == "probe.observe":
                        row["probe_observe_s"] = {
                            "cpu_total_per_prefill": event.cpu_time_total / 3 / 1e6,
                            "device_total_per_prefill": getattr(event, "device_time_total", 0.0) / 3 / 1e6,
                            "calls_per_prefill": event.count / 3,
                        }
        report["sizes"].append(row)
        print(json.dumps(row, indent=1), flush=True)
        del runners
        if cuda:
            torch.cuda.empty_cache()
    (args.out / "profile-evidence.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
