"""What a bench times, prepared on a freshly loaded model: one variant's prefill, its greedy decode steps, and its
whole answer path.

Variants: `plain` and `eager` are the stock transformers model (SDPA; eager attention returning its maps, the
reference evidence is measured against: never a library path); `module` is the baseline Generator's forward without a
probe, `evidence` the same with a probe scoring the question and the last prompt token, `score` the whole
`Generator.score` (with the content-free pass); any other name is a method spec run through Generator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from midlens.generators.attention.positional_attention import new_cache

if TYPE_CHECKING:  # torch loads with the model: `midlens --help` imports the bench modules
    from midlens.generators.models.prompt import StackedPrompt


@dataclass(frozen=True)
class Runner:
    prompt: StackedPrompt
    prefill: Callable[[], None]  # one prefill of the prompt, the GPU synchronized
    # decode(n, evidence) -> tokens/s of n greedy steps after a prefill (with evidence: scoring their rows too);
    # None for the stock model.
    decode: Callable[[int, bool], float] | None = None
    # answer(n) -> seconds of one Generator.generate of exactly n tokens and its parts (prefill, calibration,
    # decode); None for the stock model.
    answer: Callable[[int], dict] | None = None


def bench_prompt(tokenizer, tokens: int) -> StackedPrompt:
    """A stacked prompt of about `tokens` tokens from the embedded corpus, and its passages."""
    from midlens.generators.models.prompt import render
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


def synchronize() -> None:
    """Wait for queued GPU work, so wall-clock times measure it (a no-op on the CPU)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def make_runner(
    variant: str, model_name: str, prompt_tokens: int, device: str = "cpu", dtype: str = "float32"
) -> Runner:
    """`variant` prepared on a freshly loaded `model_name`, with a prompt of about `prompt_tokens` tokens."""
    from midlens.generators import load_model

    loaded = load_model(model_name, device, dtype)
    prompt = bench_prompt(loaded.tokenizer, prompt_tokens)
    if variant in ("plain", "eager"):
        return Runner(prompt, _stock_prefill(variant, loaded, prompt))
    return _generator_runner(variant, loaded, prompt)


def _stock_prefill(variant: str, loaded, prompt: StackedPrompt) -> Callable[[], None]:
    """The stock model, as transformers ships it: `plain` with SDPA, `eager` returning its attention maps."""
    import torch
    from transformers import AutoModelForCausalLM

    from midlens.core.progress import quiet_weight_loading

    with quiet_weight_loading():
        model = AutoModelForCausalLM.from_pretrained(
            loaded.folder,
            dtype=loaded.dtype,
            attn_implementation="sdpa" if variant == "plain" else "eager",
        )
    model = model.to(loaded.device).eval()
    ids = torch.tensor([prompt.input_ids], device=loaded.device)

    def prefill() -> None:
        with torch.inference_mode():
            if variant == "eager":
                model(ids, output_attentions=True, logits_to_keep=1)
            else:
                model(ids, logits_to_keep=1)
        synchronize()

    return prefill


def _generator_runner(variant: str, loaded, prompt: StackedPrompt) -> Runner:

    from midlens.generators import Generator

    gen = Generator(loaded, method="baseline" if variant in ("module", "evidence", "score") else variant)
    with_probe = variant == "evidence"
    scored = variant == "score"
    # A method that answers each prompt with several instances (Attention Buckets) runs them as batch rows: one
    # row alone would time its native-base instance, i.e. the baseline.
    rows = gen.parts.rows_per_prompt

    def prefill() -> None:
        if scored:
            gen.score(prompt)
            synchronize()
            return
        probe = gen.new_probe(prompt) if with_probe else None
        with gen.running(probe):
            if probe is not None:
                probe.score_rows(list(range(*prompt.question_span)) + [prompt.num_tokens - 1])
            gen.forward(prompt.input_ids, new_cache(), rows=rows)
            if probe is not None:
                probe.take()
        synchronize()

    def decode(n: int, evidence: bool) -> float:
        probe = gen.new_probe(prompt) if evidence else None
        with gen.running(probe):
            cache = new_cache()
            logits = gen.forward(prompt.input_ids, cache, rows=rows)[-1]
            if probe is not None:
                probe.score_rows([0])
            synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                logits = gen.forward([int(logits.argmax())], cache, rows=rows)[-1]
            if probe is not None:
                probe.take()
            synchronize()
            elapsed = time.perf_counter() - t0
        return n / elapsed

    def answer(n: int) -> dict:
        t0 = time.perf_counter()
        # ignore_eos: every variant decodes the same n tokens, whatever it would answer
        result = gen.generate(prompt, max_new_tokens=n, ignore_eos=True)
        synchronize()
        return {"answer_s": time.perf_counter() - t0, **result.timings, "generated_tokens": result.generated_tokens}

    return Runner(prompt, prefill, decode, answer)
