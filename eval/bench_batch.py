"""`midlens bench batch`: examples per second of batched generation with evidence, beside HF `generate`.

The same 10-document MDQA prompts (embedded HotpotQA paragraphs, each prompt its own question and passages, so
lengths differ and rows are padded) are answered at each batch size, 32 new tokens, greedy:
  midlens   Generator.generate_batch, evidence on (the prompt's maps, the answer's, the content-free pass);
  hf        the stock transformers model's `generate` on the same left-padded batches, no evidence (the peer).
Every variant runs once untimed first; variants are interleaved per repeat so machine noise hits them alike;
ratios are against batch 1 and against hf at the same batch, from one run. Peak memory: the CUDA allocator's
high-water mark per variant, or, on the CPU, the process's peak RSS growth over the loaded model (VmHWM after a
reset, Linux).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

from midlens.eval.memory import peak_kb, reset_peak, rss_kb

DOCUMENTS = 10
QUESTIONS = (
    "Which of these documents mentions a year?",
    "Who is named first in these documents?",
    "What city appears in these documents?",
    "Which film is described here?",
)


def batch_prompts(generator, count: int) -> list:
    """`count` stacked prompts of DOCUMENTS passages each, from consecutive slices of the embedded corpus."""
    from midlens.retrievers.corpus import default_corpus_path, read_documents, to_passages

    passages = to_passages(read_documents(default_corpus_path()))
    prompts = []
    for i in range(count):
        start = (i * DOCUMENTS) % max(1, len(passages) - DOCUMENTS)
        # ~100 words a passage, as the sweeps clip them
        chosen = [replace(p, text=" ".join(p.text.split()[:100])) for p in passages[start : start + DOCUMENTS]]
        prompts.append(generator.prompt(QUESTIONS[i % len(QUESTIONS)], chosen, max_new_tokens=32))
    return prompts


def run(
    model: str,
    batch_sizes: list[int],
    prompts_count: int,
    new_tokens: int,
    repeats: int,
    device: str,
    dtype: str,
    random_shape: str | None = None,
) -> dict:
    if random_shape is None:
        return _measure(model, batch_sizes, prompts_count, new_tokens, repeats, device, dtype, None)
    # Speed depends on shapes only: random weights of a packaged model's shape, in a folder removed afterwards
    # (a 135M model is 0.5 GB; one left in the temp directory per run adds up).
    import tempfile

    from midlens.generators.models.model_cache import resolve_model_dir
    from midlens.generators.models.random_models import save_random_model

    tokenizer_dir = resolve_model_dir(random_shape)  # the shape's own tokenizer (and so its vocabulary)
    with tempfile.TemporaryDirectory(prefix="midlens-bench-batch-") as scratch:
        source = str(save_random_model(random_shape, Path(scratch) / random_shape, tokenizer_dir))
        return _measure(source, batch_sizes, prompts_count, new_tokens, repeats, device, dtype, random_shape)


def _measure(
    source: str,
    batch_sizes: list[int],
    prompts_count: int,
    new_tokens: int,
    repeats: int,
    device: str,
    dtype: str,
    random_shape: str | None,
) -> dict:
    """`run` on the model at `source` (a name, or a random-weights folder of `random_shape`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from midlens.core.progress import quiet_weight_loading
    from midlens.generators import Generator, load_model

    loaded = load_model(source, device, dtype)
    gen = Generator(loaded, method="baseline")  # the stock weights, as transformers' `generate` below runs them
    prompts = batch_prompts(gen, prompts_count)
    with quiet_weight_loading():
        stock = AutoModelForCausalLM.from_pretrained(loaded.folder, dtype=loaded.dtype, attn_implementation="sdpa")
    stock = stock.to(loaded.device).eval()

    def midlens_run(size: int) -> int:
        tokens = 0
        for start in range(0, len(prompts), size):
            answers = gen.generate_batch(prompts[start : start + size], max_new_tokens=new_tokens)
            tokens += sum(a.generated_tokens for a in answers)
        return tokens

    def hf_run(size: int) -> int:
        eos = sorted(gen.eos_ids)
        return sum(
            _hf_generate(stock, prompts[start : start + size], gen.pad_id, eos, new_tokens)
            for start in range(0, len(prompts), size)
        )

    # Warm-up of every variant: a new shape's first run pays for kernel plans (cuDNN attention builds one per shape)
    # and allocator growth; warming the smallest batch only left that in the first timed repeat of the others.
    for size in batch_sizes:
        midlens_run(size)
        hf_run(size)
    rows = _timed_rows({"midlens": midlens_run, "hf": hf_run}, batch_sizes, repeats, loaded.device, len(prompts))
    return {
        "model": loaded.name if random_shape is None else f"random weights, {random_shape} shape",
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "prompts": len(prompts),
        "prompt_tokens": [min(p.num_tokens for p in prompts), max(p.num_tokens for p in prompts)],
        "new_tokens": new_tokens,
        "repeats": repeats,
        "rows": rows,
    }


def _hf_generate(stock, chunk: list, pad: int, eos: list[int], new_tokens: int) -> int:
    """HF `generate` on one left-padded chunk of prompts, greedy: the tokens it generated (padding not counted)."""
    import torch

    width = max(p.num_tokens for p in chunk)
    ids = torch.full((len(chunk), width), pad, dtype=torch.long)
    mask = torch.zeros(len(chunk), width, dtype=torch.long)
    for b, p in enumerate(chunk):
        ids[b, width - p.num_tokens :] = torch.tensor(p.input_ids)
        mask[b, width - p.num_tokens :] = 1
    device = stock.get_input_embeddings().weight.device
    with torch.inference_mode():
        out = stock.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos,
        )
    return int((out[:, width:] != pad).sum())


def _timed_rows(runs: dict, batch_sizes: list[int], repeats: int, device, prompts: int) -> list[dict]:
    """Median wall time and peak memory of each (engine, batch size), interleaved over `repeats`, with the ratios
    against the smallest batch of the same engine and against HF at the same batch."""
    import torch

    variants = [(engine, size) for size in batch_sizes for engine in runs]
    times: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
    peaks: dict[tuple[str, int], float] = {}
    generated: dict[tuple[str, int], int] = {}
    # On a GPU the CUDA allocator's whole peak; on the CPU the peak RSS growth over the loaded model.
    base_kb = 0 if device.type == "cuda" else rss_kb()
    for _ in range(repeats):
        for engine, size in variants:
            reset_peak(device)
            t0 = time.perf_counter()
            generated[(engine, size)] = runs[engine](size)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[(engine, size)].append(time.perf_counter() - t0)
            peak_mb = (peak_kb(device) - base_kb) / 1024
            peaks[(engine, size)] = max(peaks.get((engine, size), 0.0), peak_mb)
    rows = []
    for engine, size in variants:
        seconds = statistics.median(times[(engine, size)])
        rows.append(
            {
                "engine": engine,
                "batch": size,
                "seconds": seconds,
                "examples_per_s": prompts / seconds,
                "generated_tokens": generated[(engine, size)],
                "peak_mb": peaks[(engine, size)],
            }
        )
    by = {(r["engine"], r["batch"]): r for r in rows}
    first = min(batch_sizes)
    for r in rows:
        r["x_batch_" + str(first)] = r["examples_per_s"] / by[(r["engine"], first)]["examples_per_s"]
        r["x_hf_same_batch"] = r["examples_per_s"] / by[("hf", r["batch"])]["examples_per_s"]
    return rows


def markdown(report: dict) -> str:
    first = min(r["batch"] for r in report["rows"])
    lines = [
        f"{report['model']} on {report['device']} ({report['dtype']}, {report['threads']} threads): "
        f"{report['prompts']} prompts of {report['prompt_tokens'][0]}-{report['prompt_tokens'][1]} tokens, "
        f"{report['new_tokens']} new tokens, median of {report['repeats']}",
        "",
        f"| engine | batch | examples/s | x batch {first} | x hf, same batch | peak MB | tokens generated |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['engine']} | {r['batch']} | {r['examples_per_s']:.3f} | {r['x_batch_' + str(first)]:.2f} | "
            f"{r['x_hf_same_batch']:.2f} | {r['peak_mb']:.0f} | {r['generated_tokens']} |"
        )
    return "\n".join(lines) + "\n"
