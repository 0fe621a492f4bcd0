"""`midlens bench`: benchmarks (commands, not tests) of evidence, each method against the baseline, and batched
generation; the measuring lives in midlens.eval.bench, bench_batch, bench_runner and bench_memory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from midlens.cli.options import add_device_args
from midlens.core.method_spec import method_names
from midlens.core.names import EVAL_MODEL
from midlens.eval.bench_memory import MMAP_THRESHOLD

BENCH_EXAMPLES = """examples:
  midlens bench evidence --tokens 2048
  midlens bench ms-poe --tokens 2048,4096 --json bench.json
  midlens bench ms-poe --device cuda --dtype bfloat16
  midlens bench moice --tokens 2048 --memory-repeats 1
  midlens bench attn-calibration --tokens 1024 --decode-tokens 16
  midlens bench batch --model smollm2-135m --batch-sizes 1,8 --prompts 8 --repeats 1
  midlens bench batch --random-shape qwen2.5-coder-0.5b --device cuda --dtype bfloat16 --batch-sizes 1,4,16,32,64
"""


def add_parser(sub) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmarks: evidence overhead; ms-poe, moice and attn-calibration cost against the baseline",
        epilog=BENCH_EXAMPLES,
    )
    bench.add_argument("kind", choices=["evidence", "batch", *(m for m in method_names() if m != "baseline")])
    bench.add_argument("--model", default=EVAL_MODEL)
    bench.add_argument(
        "--tokens",
        default=None,
        help="comma-separated prompt sizes (evidence, moice, attn-calibration: 2048; ms-poe: 2048,4096)",
    )
    bench.add_argument("--repeats", type=int, default=5, help="timed runs per variant (median)")
    bench.add_argument("--decode-tokens", type=int, default=32, help="tokens decoded per timed run")
    bench.add_argument("--memory-repeats", type=int, default=3, help="fresh processes per variant (median)")
    bench.add_argument(
        "--mmap-threshold",
        type=int,
        default=MMAP_THRESHOLD,
        help="glibc MALLOC_MMAP_THRESHOLD_ (bytes) for the memory processes; 0 = glibc's dynamic default",
    )
    bench.add_argument(
        "--skip-eager", action="store_true", help="evidence: leave out the eager reference (long prompts)"
    )
    bench.add_argument("--json", help="also write the report to this file")
    _add_batch_arguments(bench)
    add_device_args(bench)
    bench.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from midlens.core.device import dtype_name, resolve_device, resolve_dtype
    from midlens.eval.bench import print_report, run

    if args.kind == "batch":
        return _run_batch(args)

    device = resolve_device(args.device)
    dtype = dtype_name(resolve_dtype(args.dtype, device))
    if args.tokens:
        sizes = args.tokens
    elif args.kind == "evidence":
        sizes = "2048"
    else:
        from midlens.generators.methods.registry import REGISTRY

        sizes = ",".join(str(t) for t in REGISTRY[args.kind].bench_tokens)
    report = run(
        args.kind,
        args.model,
        [int(x) for x in sizes.split(",")],
        args.repeats,
        args.decode_tokens,
        args.memory_repeats,
        args.mmap_threshold,
        str(device),
        dtype,
        args.skip_eager,
    )
    print_report(report)
    if args.json:
        from midlens.core.files import write_atomic

        write_atomic(Path(args.json), json.dumps(report, indent=2) + "\n")
    return 0


def _add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", default="1,4,16,64", help="comma-separated batch sizes")
    parser.add_argument("--prompts", type=int, default=64, help="prompts answered at every batch size")
    parser.add_argument(
        "--random-shape", choices=["smollm2-135m", "qwen2.5-coder-0.5b"], help="random weights, this shape"
    )


def _run_batch(args: argparse.Namespace) -> int:
    from midlens.core.device import dtype_name, resolve_device, resolve_dtype
    from midlens.eval.bench_batch import markdown, run

    device = resolve_device(args.device)
    dtype = dtype_name(resolve_dtype(args.dtype, device))
    sizes = sorted({int(x) for x in args.batch_sizes.split(",")})
    report = run(
        args.model, sizes, args.prompts, args.decode_tokens, args.repeats, str(device), dtype, args.random_shape
    )
    print(markdown(report))
    if args.json:
        from midlens.core.files import write_atomic

        write_atomic(Path(args.json), json.dumps(report, indent=2) + "\n")
    return 0
