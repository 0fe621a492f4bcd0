"""`midlens bench cpu`: what each precision gives on this CPU, side by side, and what `dtype="auto"` picks.

The same prompts (HotpotQA evaluation split, 10 paragraphs, the gold at slot 5, the short instruction) are answered
by the model's answering default in each precision, loaded side by side in one process and interleaved prompt by
prompt, so the clock and the machine's load are shared. Per precision: the answers' text identical to fp32's, EM,
Kendall's tau of each prompt's evidence against fp32's, the share of answer sentences citing the same passages, the
gold answer's log-probability difference, seconds per prefill token and per decoded token, and the peak memory of a
cold prefill (a fresh process per precision, `bench_memory`). "int8" is torch's dynamic quantisation of the
Linear layers (weights int8, activations quantised per call; VNNI on CPUs that have it) of the fp32 model.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
from scipy.stats import kendalltau

from midlens.core.device import cpu_runs_bf16, dtype_name, resolve_dtype
from midlens.eval.datasets import load_hotpotqa
from midlens.eval.metrics import best_subspan_em
from midlens.eval.sweep import layout
from midlens.generators import Generator
from midlens.generators.models.loading import LoadedModel, load_model

PRECISIONS = ("float32", "bfloat16", "int8")


def int8_model(loaded: LoadedModel) -> LoadedModel:
    """A copy of an fp32 model whose Linear layers are dynamically quantised to int8 (torch.ao)."""
    from torch.ao.quantization import quantize_dynamic

    model = quantize_dynamic(copy.deepcopy(loaded.model), {torch.nn.Linear}, dtype=torch.qint8)
    return LoadedModel(name=loaded.name, model=model, tokenizer=loaded.tokenizer, context_window=loaded.context_window)


def _cited(answer) -> list[tuple[int, ...]]:
    return [tuple(sorted(s.position for s in c.sources)) for c in answer.citations]


def compare_precisions(
    model: str,
    n: int = 8,
    precisions: tuple[str, ...] = ("float32", "bfloat16"),
    max_words: int = 100,
    max_new_tokens: int = 16,
    memory_tokens: int = 1024,
    memory_repeats: int = 1,
) -> dict:
    """The comparison, as a dict (see the module doc); fp32 is the reference and always runs."""
    from midlens.eval.bench_memory import memory_of

    precisions = ("float32", *[p for p in precisions if p != "float32"])
    base = load_model(model, "cpu", "float32")
    loaded = {
        p: base if p == "float32" else int8_model(base) if p == "int8" else load_model(model, "cpu", p)
        for p in precisions
    }
    gens = {p: Generator(loaded[p]) for p in precisions}
    examples = load_hotpotqa(n=n, max_words=max_words)
    rows: dict[str, list[dict]] = {p: [] for p in precisions}
    for example in examples:
        passages = layout(example, 10, 5)
        for p in precisions:  # interleaved: each prompt in every precision before the next prompt
            gen = gens[p]
            prompt = gen.prompt(example.question, passages, max_new_tokens=max_new_tokens, style="short")
            t0 = time.perf_counter()
            answer = gen.generate(
                prompt, max_new_tokens=max_new_tokens, reference=example.answers[0], stop_at_line_end=True
            )
            rows[p].append(
                {
                    "text": answer.text,
                    "em": best_subspan_em(answer.text, example.answers),
                    "evidence": [q.score for q in answer.passages],
                    "cited": _cited(answer),
                    "logprob": answer.reference_logprob,
                    "prefill_s_per_token": answer.timings.get("prefill_s", 0.0) / answer.prompt_tokens,
                    "decode_s_per_token": answer.timings.get("decode_s", 0.0) / max(1, answer.generated_tokens - 1),
                    "answer_s": time.perf_counter() - t0,
                }
            )
    ref = rows["float32"]
    report = {
        "model": model,
        "prompts": len(examples),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_runs_bf16": cpu_runs_bf16(),
        "auto": dtype_name(resolve_dtype("auto", torch.device("cpu"))),
        "precisions": {},
    }
    for p in precisions:
        mine = rows[p]
        taus = [kendalltau(a["evidence"], b["evidence"]).statistic for a, b in zip(ref, mine, strict=True)]
        sentences = [(a["cited"], b["cited"]) for a, b in zip(ref, mine, strict=True) if a["text"] == b["text"]]
        same_cites = [x == y for a, b in sentences for x, y in zip(a, b, strict=False)]
        report["precisions"][p] = {
            "same_text_share": statistics.mean(a["text"] == b["text"] for a, b in zip(ref, mine, strict=True)),
            "em": statistics.mean(r["em"] for r in mine),
            "evidence_kendall_tau_median": statistics.median(taus),
            "evidence_kendall_tau_min": min(taus),
            "same_citations_share": statistics.mean(same_cites) if same_cites else None,
            "gold_logprob_diff_mean": statistics.mean(
                b["logprob"] - a["logprob"] for a, b in zip(ref, mine, strict=True)
            ),
            "prefill_speedup": _ratio(ref, mine, "prefill_s_per_token"),
            "decode_speedup": _ratio(ref, mine, "decode_s_per_token"),
            "answer_speedup": _ratio(ref, mine, "answer_s"),
        }
        if memory_repeats > 0 and p != "int8":  # int8 is a quantised copy made in-process, not a load
            mem = memory_of("baseline", model, memory_tokens, repeats=memory_repeats, device="cpu", dtype=p)
            report["precisions"][p]["prefill_peak_mb"] = mem["peak_mb"]
    return report


def _ratio(ref: list[dict], mine: list[dict], key: str) -> float:
    """fp32's median seconds over this precision's (above 1: faster)."""
    return statistics.median(r[key] for r in ref) / statistics.median(r[key] for r in mine)


def render(report: dict) -> str:
    lines = [
        f"{report['model']}, {report['prompts']} prompts, {report['threads']} thread(s), torch {report['torch']}; "
        f"this CPU runs bf16 natively: {report['cpu_runs_bf16']}; dtype='auto' picks {report['auto']}",
        "| precision | same text as fp32 | EM | evidence tau vs fp32 (median / min) | same citations | "
        "gold log-prob diff | prefill speed-up | decode speed-up | answer speed-up | prefill peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p, r in report["precisions"].items():
        cites = "-" if r["same_citations_share"] is None else f"{r['same_citations_share']:.2f}"
        lines.append(
            f"| {p} | {r['same_text_share']:.2f} | {r['em']:.2f} | {r['evidence_kendall_tau_median']:.3f} / "
            f"{r['evidence_kendall_tau_min']:.3f} | {cites} | {r['gold_logprob_diff_mean']:+.3f} | "
            f"{r['prefill_speedup']:.2f}x | {r['decode_speedup']:.2f}x | {r['answer_speedup']:.2f}x | "
            f"{r.get('prefill_peak_mb', float('nan')):.0f} |"
        )
    return "\n".join(lines)
