"""`midlens bench`: benchmarks (commands, not tests) of evidence, each method against the baseline, batched
generation and the HTTP service; the measuring lives in midlens.eval.bench, bench_batch, bench_runner, bench_memory
and midlens.serve.bench."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from midlens.cli.options import add_device_args
from midlens.core.defaults import EVAL_MODEL
from midlens.core.method_spec import method_names
from midlens.eval.bench_memory import MMAP_THRESHOLD

BENCH_EXAMPLES = """examples:
  midlens bench evidence --tokens 2048
  midlens bench ms-poe --tokens 2048,4096 --json bench.json
  midlens bench ms-poe --device cuda --dtype bfloat16
  midlens bench moice --tokens 2048 --memory-repeats 1
  midlens bench attn-calibration --tokens 1024 --decode-tokens 16
  midlens bench batch --model smollm2-135m --batch-sizes 1,8 --prompts 8 --repeats 1
  midlens bench batch --random-shape qwen2.5-coder-0.5b --device cuda --dtype bfloat16 --batch-sizes 1,4,16,32,64
  midlens bench serve --batch-sizes 1,4,16 --prompts 16 --decode-tokens 16 --out docs/results/serve
"""


def add_parser(sub) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmarks: evidence overhead; ms-poe, moice and attn-calibration cost against the baseline; batching; "
        "midlens serve against in-process batching",
        epilog=BENCH_EXAMPLES,
    )
    bench.add_argument(
        "kind", choices=["evidence", "batch", "serve", "cpu", *(m for m in method_names() if m != "baseline")]
    )
    bench.add_argument("--model", default=EVAL_MODEL)
    bench.add_argument(
        "--tokens",
        default=None,
        help="comma-separated prompt sizes (evidence, moice, attn-calibration: 2048; ms-poe: 2048,4096)",
    )
    bench.add_argument("--repeats", type=int, default=5, help="timed runs per variant (median)")
    bench.add_argument("--decode-tokens", type=int, default=32, help="tokens decoded per timed run")
    bench.add_argument(
        "--memory-repeats", type=int, default=3, help="fresh processes per variant (median); 0 measures no memory"
    )
    bench.add_argument(
        "--mmap-threshold",
        type=int,
        default=MMAP_THRESHOLD,
        help="glibc MALLOC_MMAP_THRESHOLD_ (bytes) for the memory processes; 0 = glibc's dynamic default",
    )
    bench.add_argument(
        "--skip-eager", action="store_true", help="evidence: leave out the eager reference (long prompts)"
    )
    bench.add_argument(
        "--precisions",
        default="float32,bfloat16",
        help="cpu: precisions compared with fp32 (float32, bfloat16, int8: dynamic quantisation of the Linear layers)",
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
    if args.kind == "serve":
        return _run_serve(args)
    if args.kind == "cpu":
        return _run_cpu(args)

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


def _run_cpu(args: argparse.Namespace) -> int:
    """Each precision against fp32 on this CPU (eval.bench_cpu), and what dtype='auto' picks here."""
    from midlens.core.errors import InvalidArgumentError
    from midlens.eval.bench_cpu import PRECISIONS, compare_precisions, render

    chosen = tuple(p.strip() for p in args.precisions.split(",") if p.strip())
    bad = [p for p in chosen if p not in PRECISIONS]
    if bad:
        raise InvalidArgumentError(f"--precisions {','.join(bad)}: choose from {', '.join(PRECISIONS)}.")
    report = compare_precisions(
        args.model,
        n=args.prompts or 8,
        precisions=chosen,
        memory_tokens=int((args.tokens or "1024").split(",")[0]),
        memory_repeats=args.memory_repeats,
    )
    print(render(report))
    if args.json:
        from midlens.core.files import write_atomic

        write_atomic(Path(args.json), json.dumps(report, indent=2) + "\n")
    return 0


def _add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-sizes", help="comma-separated batch sizes, serve: client counts (default 1,4,16,64; serve 1,4,16)"
    )
    parser.add_argument("--prompts", type=int, help="prompts answered at every batch size (default batch 64, serve 16)")
    parser.add_argument(
        "--random-shape", choices=["smollm2-135m", "qwen2.5-coder-0.5b"], help="random weights, this shape"
    )
    parser.add_argument("--max-batch-size", type=int, default=16, help="serve: the server's --max-batch-size")
    parser.add_argument(
        "--batch-wait-timeout", type=float, default=0.02, help="serve: the server's --batch-wait-timeout (seconds)"
    )
    parser.add_argument("--out", type=Path, help="serve: folder for README.md (the table) and bench.json")


def _run_batch(args: argparse.Namespace) -> int:
    from midlens.core.device import dtype_name, resolve_device, resolve_dtype
    from midlens.eval.bench_batch import markdown, run

    device = resolve_device(args.device)
    dtype = dtype_name(resolve_dtype(args.dtype, device))
    sizes = sorted({int(x) for x in (args.batch_sizes or "1,4,16,64").split(",")})
    prompts = args.prompts or 64
    report = run(args.model, sizes, prompts, args.decode_tokens, args.repeats, str(device), dtype, args.random_shape)
    print(markdown(report))
    if args.json:
        from midlens.core.files import write_atomic

        write_atomic(Path(args.json), json.dumps(report, indent=2) + "\n")
    return 0


def _run_serve(args: argparse.Namespace) -> int:
    import sys

    from midlens.serve import bench

    levels = sorted({int(x) for x in (args.batch_sizes or "1,4,16").split(",")})
    command = "midlens " + " ".join(sys.argv[1:])
    prompts = args.prompts or 16
    report = bench.run(
        args.model, prompts, levels, args.decode_tokens, args.max_batch_size, args.batch_wait_timeout, command
    )
    print(bench.markdown(report))
    if args.out:
        bench.write(report, args.out)
    if args.json:
        from midlens.core.files import write_atomic

        write_atomic(Path(args.json), json.dumps(report, indent=2) + "\n")
    return 0
