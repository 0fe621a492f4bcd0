"""Benchmarks (commands, not tests): `midlens bench evidence`, and the method benches `midlens bench ms-poe`,
`moice` and `attn-calibration`.

Times are medians over repeats, interleaved across variants in one process so machine noise hits
them alike; ratios are against the baseline of the same run. Memory is the peak RSS growth of one
prefill, the median over several fresh processes per variant: the kernel's high-water mark is reset
(/proc/self/clear_refs = 5) after the model is loaded and read (VmHWM) after one cold prefill.

The memory children run with a fixed glibc mmap threshold (MALLOC_MMAP_THRESHOLD_, 64 KiB by default)
so that freed tensors go back to the kernel. Under glibc's default *dynamic* threshold, large blocks
freed early raise the threshold and later ones stay in the heap, fragmented: peak RSS then depends on
the order and shapes of transient allocations, not on what a method needs. Measured at 4096 tokens
(3 processes each): baseline 1219-1339 MB and Ms-PoE 1489-1642 MB (x1.17) with the dynamic threshold;
1154.1-1154.5 MB and 1156.3-1156.5 MB (x1.002) with the fixed one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from midlens.cli.options import add_device_args

# torch is imported by the functions that run models: `midlens --help` builds this module's parser.
from midlens.core.errors import MidlensError
from midlens.core.names import EVAL_MODEL, METHODS
from midlens.eval.bench_batch import add_arguments as add_batch_arguments
from midlens.eval.bench_batch import cmd_batch

VARIANTS_EVIDENCE = ("plain", "evidence", "eager")
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


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def bench_prompt(tokenizer, tokens: int):
    """A stacked prompt of about `tokens` tokens from the embedded corpus, and its passages."""
    from midlens.generators.prompt import render
    from midlens.retrievers.corpus import default_corpus_path, read_documents, to_passages

    passages = to_passages(read_documents(default_corpus_path()))
    question = "Which of these documents mentions the year 1994?"
    lo, hi = 1, len(passages)
    while lo < hi:  # most passages whose prompt stays within `tokens`
        mid = (lo + hi + 1) // 2
        if render(tokenizer, passages[:mid], question).num_tokens <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return render(tokenizer, passages[:lo], question)


# Shapes of the packaged models, for benchmarks with random weights (speed and memory depend on shapes only),
# e.g. on a machine the packaged weights cannot reach. The tokenizer comes from any model folder given.
RANDOM_SHAPES = {
    "smollm2-135m": dict(
        model_type="llama",
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=1e5,
        tie_word_embeddings=True,
    ),
    "qwen2.5-coder-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
}


def save_random_model(shape: str, folder: str | Path, tokenizer_dir: str | Path) -> Path:
    """A model folder with the architecture of `shape`, random weights, and the tokenizer of `tokenizer_dir`."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config

    spec = dict(RANDOM_SHAPES[shape])
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[spec.pop("model_type")]
    architecture = "LlamaForCausalLM" if config_cls is LlamaConfig else "Qwen2ForCausalLM"
    config = config_cls(**spec, vocab_size=len(tokenizer), architectures=[architecture])
    torch.manual_seed(0)
    folder = Path(folder)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    template = Path(tokenizer_dir) / "chat_template.jinja"
    if template.exists():
        shutil.copy(template, folder / template.name)
    return folder


def synchronize() -> None:
    """Wait for queued GPU work, so wall-clock times measure it (a no-op on the CPU)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def make_runner(variant: str, model_name: str, prompt_tokens: int, device: str = "cpu", dtype: str = "float32"):
    """-> (prefill(), decode(n) or None, prompt, answer(n) or None): closures over a freshly prepared model."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from midlens.generators.generator import Generator
    from midlens.generators.loading import load_model
    from midlens.generators.model_cache import resolve_model_dir

    loaded = load_model(model_name, device, dtype)
    prompt = bench_prompt(loaded.tokenizer, prompt_tokens)
    ids = torch.tensor([prompt.input_ids], device=loaded.device)

    if variant in ("plain", "eager"):  # the stock model, as transformers ships it
        model = (
            AutoModelForCausalLM.from_pretrained(
                resolve_model_dir(model_name),
                dtype=loaded.dtype,
                attn_implementation="sdpa" if variant == "plain" else "eager",
            )
            .to(loaded.device)
            .eval()
        )

        def prefill():
            with torch.inference_mode():
                if variant == "eager":  # the reference evidence is measured against: never a library path
                    model(ids, output_attentions=True, logits_to_keep=1)
                else:
                    model(ids, logits_to_keep=1)
            synchronize()

        return prefill, None, prompt, None

    gen = Generator(loaded, method="baseline" if variant == "evidence" else variant)
    with_probe = variant == "evidence"

    def prefill():
        probe = gen.new_probe(prompt) if with_probe else None
        with gen.running(probe):
            if probe is not None:
                probe.score_rows(list(range(*prompt.question_span)) + [prompt.num_tokens - 1])
            gen.forward(prompt.input_ids, DynamicCache(config=gen.model.config))
            if probe is not None:
                probe.take()
        synchronize()

    def decode(n: int, evidence: bool) -> float:
        """Tokens/s of n greedy decode steps after a prefill (with evidence: including scoring their rows)."""
        probe = gen.new_probe(prompt) if evidence else None
        with gen.running(probe):
            cache = DynamicCache(config=gen.model.config)
            logits = gen.forward(prompt.input_ids, cache)[-1]
            if probe is not None:
                probe.score_rows([0])
            synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                logits = gen.forward([int(logits.argmax())], cache)[-1]
            if probe is not None:
                probe.take()
            synchronize()
            elapsed = time.perf_counter() - t0
        return n / elapsed

    gen.eos_ids = set()  # answer(n): every variant decodes the same n tokens, whatever it would answer

    def answer(n: int) -> dict:
        """Seconds of one Generator.generate of exactly n tokens, and its parts (prefill, calibration, decode)."""
        t0 = time.perf_counter()
        result = gen.generate(prompt, max_new_tokens=n)
        synchronize()
        return {"answer_s": time.perf_counter() - t0, **result.timings, "generated_tokens": result.generated_tokens}

    return prefill, decode, prompt, answer


def child(variant: str, model_name: str, tokens: int, device: str = "cpu", dtype: str = "float32") -> None:
    prefill, _, prompt, _ = make_runner(variant, model_name, tokens, device, dtype)
    # No warm-up prefill: the allocator keeps what a warm-up freed (differently per variant), which hid
    # part of the second prefill's growth and inflated the resting size. One cold prefill per process.
    import gc

    import torch

    gc.collect()
    on_gpu = device.startswith("cuda")
    if on_gpu:  # GPU memory is the CUDA allocator's peak, exact and per process
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base, exact = torch.cuda.memory_allocated() / 1024, True
    else:
        base = _rss_kb("VmRSS")
        exact = _reset_peak()
    prefill()
    if on_gpu:
        peak = torch.cuda.max_memory_allocated() / 1024
    else:
        peak = _rss_kb("VmHWM") if exact else _rss_kb("VmRSS")
    print(
        json.dumps(
            {
                "variant": variant,
                "tokens": prompt.num_tokens,
                "base_mb": base / 1024,
                "peak_growth_mb": (peak - base) / 1024,
                "peak_mb": peak / 1024,
                "exact": exact,
                "mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
            }
        )
    )


MMAP_THRESHOLD = 65536


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
    env = dict(os.environ)
    if mmap_threshold > 0:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)  # read by glibc at process start
    else:
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
    out = subprocess.run(
        [sys.executable, "-m", "midlens.eval.bench", "--child", variant, model_name, str(tokens), device, dtype],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"memory probe for {variant} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


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
            runners[v][0]()  # warm-up
        samples: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(repeats):  # interleaved so drifts hit every variant
            for v in variants:
                samples[v] += timed(runners[v][0], 1)
        median = {v: statistics.median(s) for v, s in samples.items()}
        mem = {v: memory_of(v, model_name, tokens, memory_repeats, mmap_threshold, device, dtype) for v in variants}
        n = runners[variants[1]][2].num_tokens
        row = {
            "prompt_tokens": n,
            "prefill_s": median,
            "prefill_tok_per_s": {v: n / t for v, t in median.items()},
            "time_ratio": {v: median[v] / median[base] for v in variants},
            "peak_growth_mb": {v: mem[v]["peak_growth_mb"] for v in variants},
            "peak_rss_mb": {v: mem[v]["peak_mb"] for v in variants},
            "memory_ratio_total": {v: mem[v]["peak_mb"] / mem[base]["peak_mb"] for v in variants},
            "memory_ratio_growth": {
                v: mem[v]["peak_growth_mb"] / max(mem[base]["peak_growth_mb"], 1e-9) for v in variants
            },
        }
        if kind == "evidence":
            decode = runners["evidence"][1]
            plain_tps = statistics.median(decode(decode_tokens, False) for _ in range(3))
            ev_tps = statistics.median(decode(decode_tokens, True) for _ in range(3))
            row["decode_tok_per_s"] = {
                "without_evidence": plain_tps,
                "with_evidence": ev_tps,
                "ratio": ev_tps / plain_tps,
            }
        else:
            tps = {v: statistics.median(runners[v][1](decode_tokens, False) for _ in range(3)) for v in variants}
            row["decode_tok_per_s"] = {**tps, **{f"ratio {v}": tps[v] / tps[base] for v in variants[1:]}}
            answers: dict[str, list[dict]] = {v: [] for v in variants}
            for _ in range(repeats):  # interleaved, like the prefills
                for v in variants:
                    answers[v].append(runners[v][3](decode_tokens))
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
            print(
                f"{v:<{w}} {row['prefill_s'][v]:>10.3f} {row['prefill_tok_per_s'][v]:>8.0f} "
                f"{row['time_ratio'][v]:>7.3f} {row['peak_growth_mb'][v]:>9.0f} {row['peak_rss_mb'][v]:>8.0f} "
                f"{row['memory_ratio_total'][v]:>9.3f} {row['memory_ratio_growth'][v]:>8.3f}"
            )
        d = row["decode_tok_per_s"]
        print("decode tok/s: " + ", ".join(f"{k} {v:.3f}" for k, v in d.items()))
        if "answer" in row:
            a = row["answer"]
            print(f"answer path (Generator.generate, {a['new_tokens']} new tokens), median seconds:")
            for v, parts in a["seconds"].items():
                split = ", ".join(f"{k} {t:.3f}" for k, t in parts.items() if k.endswith("_s") and k != "answer_s")
                print(f"  {v:<{w}} {parts['answer_s']:>8.3f} s  x{a['time_ratio'][v]:.3f}  ({split})")


BENCH_EXAMPLES = """examples:
  midlens bench evidence --tokens 2048
  midlens bench ms-poe --tokens 2048,4096 --json bench.json
  midlens bench ms-poe --device cuda --dtype bfloat16
  midlens bench moice --tokens 2048 --memory-repeats 1
  midlens bench attn-calibration --tokens 1024 --decode-tokens 16
  midlens bench batch --model smollm2-135m --batch-sizes 1,8 --prompts 8 --repeats 1
  midlens bench batch --random-shape qwen2.5-coder-0.5b --device cuda --dtype bfloat16 --batch-sizes 1,4,16,32,64
"""


def add_bench_parser(sub) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmarks: evidence overhead; ms-poe, moice and attn-calibration cost against the baseline",
        epilog=BENCH_EXAMPLES,
    )
    bench.add_argument("kind", choices=["evidence", "batch", *(m for m in METHODS if m != "baseline")])
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
    add_batch_arguments(bench)
    add_device_args(bench)
    bench.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from midlens.core.device import dtype_name, resolve_device, resolve_dtype

    if args.kind == "batch":
        return cmd_batch(args)

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


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
    elif len(sys.argv) == 5 and sys.argv[1] == "--random-model":  # SHAPE FOLDER TOKENIZER_DIR
        print(save_random_model(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:  # `python -m midlens.eval.bench KIND ...`: the bench alone, without the other shells
        parser = argparse.ArgumentParser(prog="python -m midlens.eval.bench")
        add_bench_parser(parser.add_subparsers(dest="command", required=True))
        parsed = parser.parse_args(["bench", *sys.argv[1:]])
        sys.exit(parsed.func(parsed))
