"""What citations cost: generation with citations against without (`Generator(..., citations=None)`), and
verification as a multiple of generation, on the same HotpotQA prompts (10 paragraphs, eval split).

Time comes from one process that alternates the two generators on the same loaded model, prompt by prompt (the
order flipped every repeat), so a busy shared CPU slows both alike; the ratio is of the summed times, as wall time
and as the process's CPU time (on one thread, the compute; on a shared CPU, wall time also counts the waits for a
core). Peak memory (ru_maxrss) comes from one fresh process per variant, since a process's peak never comes down;
the cite process reads it after generation and again after verification.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from midlens.core.files import write_atomic

VARIANTS = ("plain", "cite")
# Timed in the alternating process: the two generators, each also streamed (`Generator.stream`, read through
# `events()`): a streamed answer with citations scores each sentence's rows when it ends and runs the calibration
# pass before the first token, so its time to the first delta is measured too.
TIMED = (*VARIANTS, "plain-stream", "cite-stream")


def _prompts(gen, n: int, max_words: int, max_new_tokens: int) -> list:
    from midlens.eval.cite import layout
    from midlens.eval.datasets import load_hotpotqa

    examples = load_hotpotqa(n, 0, mode="cite", max_words=max_words or None, split="eval")
    return [gen.prompt(ex.question, layout(ex, 1, 0), max_new_tokens=max_new_tokens) for ex in examples]


def child(
    task: str, model: str, n: int, repeats: int, max_words: int, max_new_tokens: int, evidence_from: str | None = None
) -> dict:
    """One measurement in this process: `plain` or `cite` (that variant only, for its memory peak; `cite` also
    verifies), or `alternate` (both generators, alternating, for the time ratio). `evidence_from`: the citing
    generator blends in that method's evidence (`CitationConfig.evidence_from`: one more prefill per answer)."""
    import torch

    from midlens.generators.answering.citations import CitationConfig
    from midlens.generators.answering.generator import Generator
    from midlens.generators.models.loading import load_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    loaded = load_model(model, "cpu", "float32")
    plain = Generator(loaded, citations=None)
    cited = Generator(loaded, citations=CitationConfig(evidence_from=evidence_from))
    prompts = _prompts(plain, n, max_words, max_new_tokens)
    out: dict = {"task": task, "prompts": len(prompts), "prompt_tokens": [p.num_tokens for p in prompts]}
    if task in VARIANTS:
        # A peak is reached by one prompt as by many of the same length: one keeps the two extra processes cheap.
        prompts = prompts[:1]
        gen = plain if task == "plain" else cited
        t0 = time.perf_counter()
        answers = [gen.generate(p, max_new_tokens=max_new_tokens) for p in prompts]
        out["generate_s"] = time.perf_counter() - t0
        out["peak_rss_generate_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if task == "cite":
            t0 = time.perf_counter()
            gen.verify(prompts, answers)
            out["verify_s"] = time.perf_counter() - t0
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return out
    times: dict[str, list[float]] = {v: [] for v in TIMED}
    cpu: dict[str, list[float]] = {v: [] for v in TIMED}
    first_delta: dict[str, list[float]] = {v: [] for v in TIMED if v.endswith("-stream")}
    answers = []
    cite_evidence_s: list[float] = []
    for r in range(repeats):
        for i, prompt in enumerate(prompts):
            order = TIMED if (r + i) % 2 == 0 else TIMED[::-1]
            for variant in order:
                gen = plain if variant.startswith("plain") else cited
                t0, c0 = time.perf_counter(), time.process_time()
                if variant.endswith("-stream"):
                    stream = gen.stream(prompt, max_new_tokens=max_new_tokens)
                    first = None
                    for event in stream.events():
                        if first is None and isinstance(event, str):
                            first = time.perf_counter() - t0
                    first_delta[variant].append(first if first is not None else time.perf_counter() - t0)
                    answer = stream.answer
                else:
                    answer = gen.generate(prompt, max_new_tokens=max_new_tokens)
                times[variant].append(time.perf_counter() - t0)
                cpu[variant].append(time.process_time() - c0)
                if variant == "cite" and r == 0:
                    answers.append(answer)
                if variant == "cite":  # the scorer's prefill, inside the cite time (evidence_from only)
                    cite_evidence_s.append(answer.timings.get("cite_evidence_s", 0.0))
    t0, c0 = time.perf_counter(), time.process_time()
    cited.verify(prompts, answers)
    verify_s, verify_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    out.update(
        times=times,
        cpu=cpu,
        first_delta=first_delta,
        ratio=sum(times["cite"]) / sum(times["plain"]),
        cpu_ratio=sum(cpu["cite"]) / sum(cpu["plain"]),
        stream_ratio=sum(times["cite-stream"]) / sum(times["plain-stream"]),
        stream_cpu_ratio=sum(cpu["cite-stream"]) / sum(cpu["plain-stream"]),
        first_delta_ratio=sum(first_delta["cite-stream"]) / max(sum(first_delta["plain-stream"]), 1e-9),
        cite_evidence_s=cite_evidence_s,
        verify_s=verify_s,
        verify_multiple=verify_s / (sum(times["cite"]) / repeats),
        verify_cpu_multiple=verify_cpu_s / (sum(cpu["cite"]) / repeats),
        cited_passages=sum(len({s.position for c in a.citations for s in c.sources}) for a in answers),
        answer_tokens=[len(a.answer_ids) for a in answers],
    )
    return out


def measure(
    model: str, n: int, repeats: int, max_words: int, max_new_tokens: int, out: Path, evidence_from: str | None = None
) -> dict:
    """Each measurement in a fresh subprocess; the summary written to `out` (JSON) and returned."""
    results = {}
    for task in ("alternate", *VARIANTS):
        arguments = f"{task!r}, {model!r}, {n}, {repeats}, {max_words}, {max_new_tokens}, {evidence_from!r}"
        code = (
            "import json, sys; from midlens.eval.cite_cost import child; "
            f"print('RESULT ' + json.dumps(child({arguments})))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        results[task] = json.loads(line.removeprefix("RESULT "))
    alternate = results["alternate"]
    summary = {
        "model": model,
        "n": n,
        "repeats": repeats,
        "max_words": max_words,
        "max_new_tokens": max_new_tokens,
        "evidence_from": evidence_from,
        "threads": int(os.environ.get("OMP_NUM_THREADS", "1")),
        "ratio": alternate["ratio"],
        "cpu_ratio": alternate["cpu_ratio"],
        "stream_ratio": alternate["stream_ratio"],
        "stream_cpu_ratio": alternate["stream_cpu_ratio"],
        "first_delta_ratio": alternate["first_delta_ratio"],
        "generate_plain_cpu_s": sum(alternate["cpu"]["plain"]) / len(alternate["cpu"]["plain"]),
        "generate_cite_cpu_s": sum(alternate["cpu"]["cite"]) / len(alternate["cpu"]["cite"]),
        "verify_cpu_multiple": alternate["verify_cpu_multiple"],
        "peak_rss_generate_mb": {v: results[v]["peak_rss_generate_mb"] for v in VARIANTS},
        "generate_plain_s": sum(alternate["times"]["plain"]) / len(alternate["times"]["plain"]),
        "generate_cite_s": sum(alternate["times"]["cite"]) / len(alternate["times"]["cite"]),
        "verify_multiple": alternate["verify_multiple"],
        "peak_rss_mb": {v: results[v]["peak_rss_mb"] for v in VARIANTS},
        "runs": results,
    }
    write_atomic(Path(out), json.dumps(summary, indent=2) + "\n")
    return summary
