"""Generator: a loaded model run with one method, answering a stacked prompt and scoring its passages.

    gen = Generator("smollm2-135m", method="ms-poe(ratio_max=1.5)", device="auto", dtype="auto")
    prompt = gen.prompt("Who wrote X?", passages)
    answer = gen.generate(prompt)            # text + per-passage evidence + timings
    for piece in gen.stream(prompt): ...     # same, token by token

One forward pass over the prompt (SDPA, KV cache) both prepares generation and reads the evidence;
decoding reuses the cache and reads the answer's attention; calibration crops the cache back to the
passages and runs the content-free question ("N/A") on top of it.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Literal

import torch
from transformers import DynamicCache

from midlens.core.names import DEFAULT_MAX_NEW_TOKENS
from midlens.core.passage import Passage
from midlens.generators.context import MethodParts, method_context
from midlens.generators.evidence import Answer, EvidenceConfig, EvidenceMaps, passage_evidence
from midlens.generators.models import DEFAULT_MODEL, LoadedModel, load_model, non_finite_error
from midlens.generators.probe import PassageProbe
from midlens.generators.prompt import (
    CONTENT_FREE_QUESTION,
    DEFAULT_STYLE,
    StackedPrompt,
    build_prompt,
    render,
    shared_prefix_length,
)
from midlens.generators.registry import MethodConfig, build_parts, method_config
from midlens.generators.retrieval_heads import resolve_evidence


class Generator:
    def __init__(
        self,
        model: str | LoadedModel = DEFAULT_MODEL,
        method: str | MethodConfig = "baseline",
        evidence: EvidenceConfig | None = None,
        device: str = "auto",
        dtype: str = "auto",
        **method_options,
    ):
        """`method` is a registry name or spec (`"ms-poe(ratio_max=1.5)"`); keyword options override the spec's.
        `device`/`dtype` apply when `model` is a name; a LoadedModel keeps the device and dtype it has."""
        self.method: MethodConfig = method_config(method, method_options)  # before loading: fail fast
        self.loaded = load_model(model, device, dtype) if isinstance(model, str) else model
        self.evidence_config = resolve_evidence(evidence or EvidenceConfig(), self.loaded)
        self.parts: MethodParts = build_parts(self.method, self.loaded)
        self.evidence_config.layer_indices(self.num_layers)  # validate early
        eos = self.loaded.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        # Any special token ends the answer: decoding hides them, so a model that opens a new turn
        # (<|im_start|> where <|im_end|> was due, as briefly fine-tuned deltas do) would glue "system\nuser..."
        # onto its answer.
        self.eos_ids |= set(self.tokenizer.all_special_ids)

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def model(self) -> torch.nn.Module:
        return self.loaded.model

    @property
    def context_window(self) -> int:
        return self.loaded.context_window

    @property
    def num_layers(self) -> int:
        return len(self.parts.schemes)

    @property
    def device(self) -> torch.device:
        return self.loaded.device

    def prompt(
        self,
        question: str,
        passages: list[Passage],
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        truncate: Literal["error", "drop_last"] = "error",
        style: str = DEFAULT_STYLE,
    ) -> StackedPrompt:
        """`style`: the instruction, a name in generators.prompt.STYLES ("short" asks for the bare answer, "litm"
        is Liu et al.'s, which the position sweeps use)."""
        window = self.context_window - max_new_tokens
        return build_prompt(self.tokenizer, passages, question, window, truncate, style)

    @contextmanager
    def running(self, probe: PassageProbe | None = None):
        """This generator's method (and an optional probe) installed on the shared model, for inference."""
        with torch.inference_mode(), method_context(self.loaded, self.parts, probe):
            yield

    def forward(self, ids: list[int], cache: DynamicCache, keep: int = 1) -> torch.Tensor:
        """Logits [keep, vocab] for `ids` fed after `cache` (call inside `running()`)."""
        input_ids = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0]

    def new_probe(self, prompt: StackedPrompt) -> PassageProbe:
        """A probe that keeps the layers the evidence config aggregates (the others cost nothing)."""
        layers = set(self.evidence_config.layer_indices(self.num_layers)) | set(self.parts.answering_layers)
        return PassageProbe(prompt.passage_spans, self.num_layers, sorted(layers))

    def _pick(self, logits: torch.Tensor, temperature: float, top_p: float, rng: torch.Generator | None) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        if top_p < 1.0:
            sorted_probs, idx = probs.sort(descending=True)
            keep = sorted_probs.cumsum(0) - sorted_probs < top_p
            probs = torch.zeros_like(probs).scatter(0, idx[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=rng))

    def _steps(
        self,
        prompt: StackedPrompt,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
        calibrate: bool,
        reference: str | None = None,
        stop_at_line_end: bool = False,
    ) -> Iterator[str]:
        """Yields text deltas; returns the Answer (generator return value)."""
        if temperature > 0 and not 0 < top_p <= 1:
            raise ValueError(f"top_p={top_p} must be in (0, 1].")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0.")
        reference_ids = None if reference is None else self._reference_ids(reference)  # refused before decoding
        if prompt.num_tokens + max_new_tokens > self.context_window:
            raise ValueError(
                f"prompt ({prompt.num_tokens} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"context window ({self.context_window}); build the prompt with Generator.prompt()."
            )
        rng = torch.Generator(self.device).manual_seed(seed) if (temperature > 0 and seed is not None) else None
        probe = self.new_probe(prompt)
        q_rows = list(range(*prompt.question_span))
        last = prompt.num_tokens - 1
        timings: dict[str, float] = {}
        generated: list[int] = []
        text = ""
        bias = None
        if self.parts.bias_prompt is not None and self.parts.answering is not None and prompt.passages:
            t0 = time.perf_counter()
            bias = self._prompt_maps(self.parts.bias_prompt(self.tokenizer, prompt))
            timings["bias_s"] = time.perf_counter() - t0
        with self.running(probe):
            cache = DynamicCache(config=self.model.config)
            t0 = time.perf_counter()
            probe.score_rows(q_rows + [last])
            logits = prefill_logits = self.forward(prompt.input_ids, cache)[-1]
            # Damaged weights surface here as NaN logits; decoding them would give an empty answer and then a
            # bare "cannot convert float NaN to integer", so name the damaged file instead.
            if not bool(torch.isfinite(logits).all()):
                raise non_finite_error(self.loaded)
            rows = probe.take()[:, 0]  # [layers, H, S, P]
            timings["prefill_s"] = time.perf_counter() - t0
            last, question = _last_and_question(rows)
            maps = EvidenceMaps(last=last, question=question)
            if bias is not None:
                maps.bias_last, maps.bias_question = bias

            answering = nullcontext()
            if self.parts.answering is not None:
                seen = prompt.num_tokens  # prompt tokens the cache still holds
                if prompt.passages and bias is None:  # the method reads content-free-question maps before answering
                    t0 = time.perf_counter()
                    maps.null_last, maps.null_question, cropped = self._null_maps(prompt, cache, probe)
                    seen = seen if cropped is None else cropped  # the null question replaced the real one
                    timings["calibrate_s"] = time.perf_counter() - t0
                # Back to the prompt without its last token: that token's query gives the first answer token,
                # so it is read again below, under the method's bias.
                probe.score_rows([])
                cache.crop(min(seen, prompt.num_tokens - 1) - cache.get_seq_length())
                if seen < prompt.num_tokens - 1:
                    self.forward(prompt.input_ids[seen:-1], cache)
                answering = self.parts.answering(maps, prompt)

            with answering:
                t0 = time.perf_counter()
                if self.parts.answering is not None:
                    logits = prefill_logits = self.forward(prompt.input_ids[-1:], cache)[-1]
                probe.score_rows([0])  # each decode step: the fed-back token's own query
                while len(generated) < max_new_tokens:
                    token = self._pick(logits, temperature, top_p, rng)
                    if token in self.eos_ids:
                        break
                    generated.append(token)
                    new_text = self.tokenizer.decode(generated, skip_special_tokens=True)
                    if len(new_text) > len(text) and not new_text.endswith("\ufffd"):
                        yield new_text[len(text) :]
                        text = new_text
                    if stop_at_line_end and "\n" in text.lstrip():
                        break
                    if len(generated) == max_new_tokens:
                        break
                    logits = self.forward([token], cache)[-1]
                timings["decode_s"] = time.perf_counter() - t0
                if len(generated) > 1:
                    maps.answer = probe.take()[:, 0].mean(2)
                probe.score_rows([])

                reference_logprob = None
                if reference_ids is not None:
                    cache.crop(prompt.num_tokens - cache.get_seq_length())  # back to the prompt
                    reference_logprob = self._continuation_logprob(prefill_logits, reference_ids, cache)

            if calibrate and prompt.passages and maps.null_last is None:
                t0 = time.perf_counter()
                maps.null_last, maps.null_question, _ = self._null_maps(prompt, cache, probe)
                timings["calibrate_s"] = time.perf_counter() - t0
        final = self.tokenizer.decode(generated, skip_special_tokens=True)
        if len(final) > len(text):
            yield final[len(text) :]
        return Answer(
            question=prompt.question,
            text=final.strip(),
            passages=passage_evidence(prompt.passages, maps, self.evidence_config),
            model=self.loaded.name,
            method=self.method.to_dict(),
            evidence_config=self.evidence_config,
            prompt_tokens=prompt.num_tokens,
            generated_tokens=len(generated),
            timings=timings,
            dropped=prompt.dropped,
            maps=maps,
            reference_logprob=reference_logprob,
        )

    def _reference_ids(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("the reference answer is empty: pass a non-empty gold answer, or reference=None.")
        return ids

    def _continuation_logprob(self, first_logits: torch.Tensor, ids: list[int], cache: DynamicCache) -> float:
        """log p(ids | cached prompt): the prompt's last logits score the first token, one forward the rest."""
        logprob = torch.log_softmax(first_logits.float(), dim=-1)[ids[0]]
        if len(ids) > 1:
            logits = self.forward(ids[:-1], cache, keep=len(ids) - 1)
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            rows = torch.arange(len(ids) - 1, device=logprobs.device)
            logprob = logprob + logprobs[rows, torch.tensor(ids[1:], device=logprobs.device)].sum()
        return float(logprob)

    def _prompt_maps(self, prompt: StackedPrompt) -> tuple[torch.Tensor, torch.Tensor]:
        """(last, question) maps of another prompt, prefilled on its own cache before the real one is."""
        probe = self.new_probe(prompt)
        with self.running(probe):
            probe.score_rows(list(range(*prompt.question_span)) + [prompt.num_tokens - 1])
            self.forward(prompt.input_ids, DynamicCache(config=self.model.config))
            return _last_and_question(probe.take()[:, 0])

    def _null_maps(self, prompt: StackedPrompt, cache: DynamicCache, probe: PassageProbe):
        """ICR calibration: the same passages with a content-free question, on the cached prefix.

        Returns (last, question) maps and the length `cache` was cropped to (None when a fresh cache was used)."""
        null = render(self.tokenizer, prompt.passages, CONTENT_FREE_QUESTION, prompt.style)
        shared = min(shared_prefix_length(prompt.input_ids, null.input_ids), null.question_span[0])
        cropped = None
        if shared >= null.passage_spans[-1][1]:
            cache.crop(shared - cache.get_seq_length())
            cropped = shared
        else:  # a tokenizer merged across the question boundary: the cached passages don't apply
            shared, cache = 0, DynamicCache(config=self.model.config)
        rows_q = [i - shared for i in range(*null.question_span)]
        probe.score_rows(rows_q + [null.num_tokens - 1 - shared])
        self.forward(null.input_ids[shared:], cache)
        return *_last_and_question(probe.take()[:, 0]), cropped

    def generate(
        self,
        prompt: StackedPrompt,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = 0,
        calibrate: bool = True,
        on_token: Callable[[str], None] | None = None,
        reference: str | None = None,
        stop_at_line_end: bool = False,
    ) -> Answer:
        """Greedy by default (temperature 0); sampled with temperature > 0 (seeded, top-p).

        `reference` (a gold answer) also scores log p(reference | prompt) on the prompt's cached keys,
        so evaluation gets its continuous accuracy measure without a second prefill.
        `stop_at_line_end` ends decoding once the answer has a complete non-empty line: metrics that read
        only the first line (eval.metrics.first_line) score the same answer, decoded in fewer steps.
        """
        steps = self._steps(prompt, max_new_tokens, temperature, top_p, seed, calibrate, reference, stop_at_line_end)
        while True:
            try:
                piece = next(steps)
            except StopIteration as done:
                return done.value
            if on_token is not None:
                on_token(piece)

    def stream(self, prompt: StackedPrompt, **kwargs) -> GenerationStream:
        return GenerationStream(self._steps(prompt, **{**_STREAM_DEFAULTS, **kwargs}))

    def score(self, prompt: StackedPrompt, calibrate: bool = True) -> Answer:
        """Evidence for the passages without generating (one prefill, plus the calibration suffix)."""
        return self.generate(prompt, max_new_tokens=0, calibrate=calibrate)


def _last_and_question(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Probe rows [layers, H, question tokens + last, P] scored as question span + last token -> the last token's
    maps and the question's mean, each [layers, H, P]."""
    return rows[:, :, -1], rows[:, :, :-1].mean(2)


# stream() takes generate()'s keyword options but the callback, with generate()'s defaults (read, not copied).
_STREAM_DEFAULTS = {
    name: param.default
    for name, param in inspect.signature(Generator.generate).parameters.items()
    if name not in ("self", "prompt", "on_token")
}


class GenerationStream:
    """Iterate for text deltas; `answer` holds the full Answer once iteration ends."""

    def __init__(self, steps: Iterator[str]):
        self._steps = steps
        self.answer: Answer | None = None

    def __iter__(self) -> Iterator[str]:
        self.answer = yield from self._steps
