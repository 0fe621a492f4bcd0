"""Where a batch's time goes: midlens' `generate_batch` (evidence on) beside HF `generate` on the same left-padded
prompts of `midlens bench batch`, one batch each under torch.profiler, after warm-ups. Per engine: wall time, the
host's and the device's busy time, and the top operators; for midlens also its own phase timings (prefill, the
content-free calibration pass, decoding) from the Answer.

    python profile_batch.py MODEL_DIR --batch 32 --device cuda --dtype bfloat16 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

from midlens.eval.bench_batch import _hf_generate, batch_prompts
from midlens.generators import Generator, load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = args.device.startswith("cuda")
    loaded = load_model(args.model, args.device, args.dtype)
    gen = Generator(loaded)
    prompts = batch_prompts(gen, args.batch)
    stock = AutoModelForCausalLM.from_pretrained(loaded.folder, dtype=loaded.dtype, attn_implementation="sdpa")
    stock = stock.to(loaded.device).eval()
    eos = sorted(gen.eos_ids)
    phases: dict[str, float] = {}

    def midlens_batch() -> int:
        answers = gen.generate_batch(prompts, max_new_tokens=args.new_tokens)
        phases.update(answers[0].timings)
        return sum(a.generated_tokens for a in answers)

    def hf_batch() -> int:
        return _hf_generate(stock, prompts, gen.pad_id, eos, args.new_tokens)

    engines = {"midlens": midlens_batch, "hf": hf_batch}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for run in engines.values():  # warm-up: kernels, allocator
        run()
        run()
    wall: dict[str, list[float]] = {e: [] for e in engines}
    for _ in range(args.repeats):  # interleaved
        for engine, run in engines.items():
            sync()
            t0 = time.perf_counter()
            run()
            sync()
            wall[engine].append(time.perf_counter() - t0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    report = {
        "model": args.model,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": args.dtype,
        "batch": args.batch,
        "prompt_tokens": [min(p.num_tokens for p in prompts), max(p.num_tokens for p in prompts)],
        "new_tokens": args.new_tokens,
        "engines": {},
    }
    for engine, run in engines.items():
        with profile(activities=activities) as prof:
            tokens = run()
            sync()
        events = prof.key_averages()
        device_s = sum(getattr(e, "self_device_time_total", 0.0) for e in events) / 1e6
        for sort in ("self_cpu_time_total", "self_device_time_total" if cuda else "cpu_time_total"):
            table = events.table(sort_by=sort, row_limit=30, max_name_column_width=70)
            (args.out / f"profile-batch-{engine}-{sort}.txt").write_text(table + "\n")
        report["engines"][engine] = {
            "wall_s_median": statistics.median(wall[engine]),
            "wall_s": wall[engine],
            "generated_tokens": tokens,
            "device_busy_s_profiled": device_s,
            "launches": sum(e.count for e in events if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel"))),
            "syncs": sum(e.count for e in events if "Synchronize" in e.key or e.key == "aten::item"),
        }
        if engine == "midlens":
            report["engines"][engine]["phases_s"] = dict(phases)
    report["midlens_over_hf"] = report["engines"]["midlens"]["wall_s_median"] / report["engines"]["hf"]["wall_s_median"]
    (args.out / "profile-batch.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=1), flush=True)


if __name__ == "__main__":
    main()
