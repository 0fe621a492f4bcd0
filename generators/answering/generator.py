"""Generator: a loaded model run with one method, answering a stacked prompt and scoring its passages.

    gen = Generator("smollm2-135m", method="ms-poe(ratio_max=1.5)", device="auto", dtype="auto")
    prompt = gen.prompt("Who wrote X?", passages)
    answer = gen.generate(prompt)            # text + per-passage evidence + timings
    for piece in gen.stream(prompt): ...     # same, token by token

    answers = gen.generate_batch(prompts)    # several at once, each equal to its answer alone

One forward pass over the prompt (SDPA, KV cache) both prepares generation and reads the evidence;
decoding reuses the cache and reads the answer's attention; calibration runs the content-free question
("N/A") on the cached passages. The loop is written once, for a left-padded batch (generators.answering.decoding); a
single prompt is a batch of one. Citations are read and checked by generators.answering.citation_scoring, whose passes
never decode. This module is the public face over both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Literal

import torch
from transformers import DynamicCache

from midlens.core.answer_text import restates_question
from midlens.core.defaults import DEFAULT_MAX_NEW_TOKENS, MODEL_ALIASES, Truncate
from midlens.core.device import id_tensor
from midlens.core.errors import InvalidArgumentError, MethodConfigError, Remedy
from midlens.core.passage import Passage
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.batch import pad_token_id
from midlens.generators.answering.citation_scoring import verify_citations
from midlens.generators.answering.citations import Citation, CitationConfig, MeasuredCitations
from midlens.generators.answering.decoding import ATTRIBUTED, DecodeOptions, GenerationStream, answer_steps, drain
from midlens.generators.answering.support import Support, SupportModel, packaged_support, support_inputs
from midlens.generators.attention.anatomy import model_anatomy
from midlens.generators.attention.evidence import EvidenceConfig, for_windows
from midlens.generators.attention.probe import PassageProbe
from midlens.generators.methods.install import MethodParts, method_context
from midlens.generators.methods.registry import MethodConfig, build_parts, check_artefact, method_config
from midlens.generators.methods.retrieval_heads import resolve_evidence
from midlens.generators.models.loading import LoadedModel, load_model
from midlens.generators.models.packaged_models import DEFAULT_MODEL, default_method
from midlens.generators.models.prompt import (
    DEFAULT_STYLE,
    StackedPrompt,
    build_prompt,
)


class Generator:
    def __init__(
        self,
        model: str | LoadedModel = DEFAULT_MODEL,
        method: str | MethodConfig | None = None,
        evidence: EvidenceConfig | None = None,
        device: str = "auto",
        dtype: str = "auto",
        citations: CitationConfig | MeasuredCitations | Literal["measured"] | None = "measured",
        **method_options,
    ):
        """`method` is a registry name or spec (`"ms-poe(ratio_max=1.5)"`); keyword options override the spec's.
        None: the model's measured default (core.defaults.answer_method_for; the baseline for a model folder).
        `device`/`dtype` apply when `model` is a name; a LoadedModel keeps the device and dtype it has.
        `citations`: how each answer sentence's citations are read from its attention (None: no citations;
        "measured": the rule chosen on the train split for this model and method, `CitationConfig.measured`;
        `MeasuredCitations(evidence_from="mudaf")`: the rule measured with MuDAF's evidence blended in)."""
        if method is None:
            method = default_method(model)
        self.method: MethodConfig = method_config(method, method_options)  # before loading: fail fast
        if isinstance(model, str):  # an old name as the one it stands for (load_model notes the change)
            check_artefact(self.method, MODEL_ALIASES.get(model, model))
        self.loaded = load_model(model, device, dtype) if isinstance(model, str) else model
        self.windows = [layer.window for layer in model_anatomy(self.loaded.model)]  # per layer, None: sees all
        self.evidence_config = resolve_evidence(for_windows(evidence or EvidenceConfig(), self.windows), self.loaded)
        if isinstance(citations, str) and citations == "measured":
            citations = MeasuredCitations()
        # As given, before it is resolved for this model and method: another method on the same model
        # (Pipeline.with_method) resolves the same setting for itself, not this method's rule.
        self.citation_setting: CitationConfig | MeasuredCitations | None = citations
        if isinstance(citations, MeasuredCitations):
            citations = citations.resolve(self.loaded.name, self.method.spec())
        elif citations is not None and not isinstance(citations, CitationConfig):
            raise InvalidArgumentError(
                f'citations={citations!r}: pass a CitationConfig, "measured" (the rule measured for this model '
                "and method), MeasuredCitations(evidence_from=...) or None (no citations)."
            )
        self.citations = citations
        self.parts: MethodParts = build_parts(self.method, self.loaded)
        # Scoring generators on this model, by canonical method spec (restacking, `evidence_from` citations): each
        # loads its method's parts once (MuDAF's delta, hashed), not per call of a Pipeline made per call.
        self._scorers: dict[str, Generator] = {}
        self._scorers_lock = threading.Lock()
        self.evidence_scorer = self._citation_scorer()
        self._support_models: dict[bool, SupportModel | None] = {}  # loaded at the first answer (plain, verified)
        self.evidence_config.layer_indices(self.num_layers)  # validate early
        eos = self.loaded.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        # Any special token ends the answer: decoding hides them, so a model that opens a new turn
        # (<|im_start|> where <|im_end|> was due, as briefly fine-tuned deltas do) would glue "system\nuser..."
        # onto its answer.
        self.eos_ids |= set(self.tokenizer.all_special_ids)

    def _citation_scorer(self) -> Generator | None:
        """The generator whose evidence citations blend in when `CitationConfig.evidence_from` names another method
        than this one (built now: its parts load and are checked once, not at the first answer); else None."""
        spec = None if self.citations is None else self.citations.evidence_from
        if spec is None:
            return None
        try:
            config = method_config(spec)
        except MethodConfigError as err:  # a bad spec is the citations setting's fault, whatever it broke
            raise MethodConfigError(err.problem, about=Remedy("evidence_from", spec)) from None
        scorer = self.scorer(config)
        return None if scorer is self else scorer

    def scorer(self, config: MethodConfig) -> Generator:
        """A generator on this model running `config`, with this one's evidence settings and no citations (scoring
        generates nothing to cite), built once; this generator itself when it already runs `config`."""
        if config == self.method:
            return self
        spec = config.spec()
        with self._scorers_lock:
            if spec not in self._scorers:
                self._scorers[spec] = Generator(
                    self.loaded, method=config, evidence=self.evidence_config, citations=None
                )
            return self._scorers[spec]

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
        truncate: Truncate = "error",
        style: str = DEFAULT_STYLE,
    ) -> StackedPrompt:
        """`style`: the instruction, a name in generators.models.prompt.STYLES ("short" asks for the bare answer, "litm"
        is Liu et al.'s, which the position sweeps use)."""
        if max_new_tokens >= self.context_window:
            raise InvalidArgumentError(
                f"max_new_tokens={max_new_tokens} leaves no room for the prompt in {self.loaded.name}'s "
                f"{self.context_window}-token context window.",
                [Remedy("max_new_tokens", max(1, self.context_window // 8), "or another value well below the window")],
            )
        window = self.context_window - max_new_tokens
        return build_prompt(self.tokenizer, passages, question, window, truncate, style)

    @contextmanager
    def running(self, probe: PassageProbe | None = None):
        """This generator's method (and an optional probe) installed on the shared model, for inference; yields
        the context's `MethodRun`."""
        with torch.inference_mode(), method_context(self.loaded, self.parts, probe) as method_run:
            yield method_run

    def forward(self, ids: list[int], cache: DynamicCache, keep: int = 1, rows: int = 1) -> torch.Tensor:
        """Logits [keep, vocab] of the first row for `ids` fed after `cache` (call inside `running()`); `rows`
        feeds the same ids in that many batch rows, as a method with several instances answers (its bench)."""
        input_ids = id_tensor(ids)[None].expand(rows, -1).to(self.device)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0]

    def probe_layers(self) -> list[int]:
        """The layers a probe keeps: those the evidence config aggregates and those the method's answering hook
        reads (the others cost nothing)."""
        hook_layers = self.parts.answering.layers if self.parts.answering is not None else ()
        return sorted(set(self.evidence_config.layer_indices(self.num_layers)) | set(hook_layers))

    def new_probe(self, prompt: StackedPrompt) -> PassageProbe:
        """A probe of one prompt's passages, keeping `probe_layers()`."""
        return PassageProbe(prompt.passage_spans, self.num_layers, self.probe_layers())

    @property
    def pad_id(self) -> int:
        """The token left padding is filled with (never attended to; any valid id would do)."""
        return pad_token_id(self.tokenizer)

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
        ignore_eos: bool = False,
        on_citation: Callable[[Citation], None] | None = None,
    ) -> Answer:
        """Greedy by default (temperature 0); sampled with temperature > 0 (seeded, top-p).

        `reference` (a gold answer) also scores log p(reference | prompt) on the prompt's cached keys,
        so evaluation gets its continuous accuracy measure without a second prefill.
        `stop_at_line_end` ends decoding once the answer has a complete non-empty line: metrics that read
        only the first line (eval.metrics.first_line) score the same answer, decoded in fewer steps.
        `ignore_eos` decodes past end-of-sequence tokens (kept like any other) up to `max_new_tokens`, so
        benchmarks time the same number of steps whatever the model would answer.
        `on_citation` (citations on) gets each answer sentence's Citation as soon as the next sentence begins,
        the last ones when decoding ends; each equals its entry in the returned Answer's `citations`.
        """
        decode = DecodeOptions(max_new_tokens, temperature, top_p, seed, calibrate, stop_at_line_end, ignore_eos)
        steps = answer_steps(self, [prompt], decode, [reference], cite_as_you_go=on_citation is not None)
        answers = drain(
            steps,
            None if on_token is None else (lambda _row, piece: on_token(piece)),
            None if on_citation is None else (lambda _row, citation: on_citation(citation)),
        )
        return answers[0]

    def generate_batch(
        self,
        prompts: list[StackedPrompt],
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = 0,
        calibrate: bool = True,
        references: list[str | list[int] | None] | None = None,
        stop_at_line_end: bool = False,
        on_token: Callable[[int, str], None] | None = None,
        ignore_eos: bool = False,
        cancelled: Callable[[int], bool] | None = None,
        on_citation: Callable[[int, Citation], None] | None = None,
    ) -> list[Answer]:
        """`generate` for several prompts in one left-padded batch: each Answer equals the prompt's answer alone
        (same greedy text; evidence and log-probabilities equal up to floating-point summation order).
        `references`: one gold answer (text, or token ids as generated) or None per prompt; `on_token(row, piece)`
        streams every row. `cancelled(row)` is asked before each of a row's decode steps: once True, that row stops
        where it is (its Answer holds what it generated so far) and the batch goes on without it.
        `on_citation(row, citation)` (citations on) gets each row's answer sentences' Citations as they end, as
        `generate`'s does; a row's are complete, and equal to its Answer's, once the call returns."""
        decode = DecodeOptions(max_new_tokens, temperature, top_p, seed, calibrate, stop_at_line_end, ignore_eos)
        steps = answer_steps(self, prompts, decode, references, cancelled, cite_as_you_go=on_citation is not None)
        return drain(steps, on_token, on_citation)

    def verify(self, prompts: list[StackedPrompt], answers: list[Answer], batch_size: int = 8) -> list[Answer]:
        """Check every citation against the answer it came with: the same answer tokens are scored teacher-forced
        with each cited passage removed, in batches, and a source is verified when its answer sentence loses at
        least `CitationConfig.margin` nats (`logprob_drop` holds the loss). Answers are updated in place and
        returned. Costs one prefill per cited passage plus one for the full prompt, no decoding."""
        if self.citations is None:
            raise InvalidArgumentError("citations are off for this generator (citations=None): nothing to verify.")
        checked = verify_citations(self, prompts, answers, batch_size)
        for i in checked:  # the answers whose citations were checked: their support now reads the drops too
            answers[i].support = self.support_of(answers[i], verified=True)
        return answers

    def attribute(self, prompt: StackedPrompt, answer: str, verify: bool = False) -> Answer:
        """Read an answer this model did not write as if it had: `answer` teacher-forced after `prompt` in one pass,
        giving its per-sentence citations (spans in `Answer.text`, which is `answer` as the tokenizer round-trips
        it), the passages' evidence and the answer's log-probability (`reference_logprob`, per token in
        `token_logprobs`). `verify`: each citation checked by ablation (`verify`). `support` is the checked
        support model's (generators.answering.check: per sentence, the answer's its weakest sentence's), None where none
        ships for this model."""
        return self.attribute_batch([prompt], [answer], verify)[0]

    def attribute_batch(
        self, prompts: list[StackedPrompt], answers: list[str], verify: bool = False, batch_size: int = 8
    ) -> list[Answer]:
        """`attribute` for several (prompt, answer) pairs, `batch_size` at a time in left-padded batches; each
        Answer equals its pair's alone (up to floating-point summation order)."""
        if len(prompts) != len(answers):
            raise InvalidArgumentError(f"{len(answers)} answers for {len(prompts)} prompts: give one answer each.")
        ids = [self._given_ids(prompt, text, i) for i, (prompt, text) in enumerate(zip(prompts, answers, strict=True))]
        out: list[Answer] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            refs: list[str | list[int] | None] = list(ids[start : start + batch_size])
            out += drain(answer_steps(self, chunk, ATTRIBUTED, refs), None)
        if verify and self.citations is not None:
            self.verify(prompts, out, batch_size)
        return out

    def _given_ids(self, prompt: StackedPrompt, text: str, index: int) -> list[int]:
        """A given answer's tokens, refused when empty or when it does not fit the window after its prompt."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] if isinstance(text, str) else []
        if not isinstance(text, str) or not text.strip() or not ids:
            raise InvalidArgumentError(
                f"answer {index + 1} is empty ({text!r}): there is nothing to check; pass the answer's text."
            )
        if prompt.num_tokens + len(ids) > self.context_window:
            raise InvalidArgumentError(
                f"answer {index + 1} ({len(ids)} tokens) does not fit after its prompt ({prompt.num_tokens} tokens) "
                f"in {self.loaded.name}'s {self.context_window}-token context window; pass fewer or shorter passages "
                "(build the prompt with max_new_tokens at least the answer's length) or a shorter answer."
            )
        return ids

    def support_of(self, answer: Answer, verified: bool = False) -> Support | None:
        """How far `answer` can be trusted (generators.answering.support): the support model shipped for this model (the
        model-agnostic one for any other), plain or, once its citations were verified, reading the ablation drops.
        None with citations off (the features read them) or for a pass that generated nothing. An answer that
        restates the question is not rated (`Support.no_answer`): the features would score the question's words."""
        support = self._rated(answer, verified)
        if support is not None and restates_question(answer.text, answer.question):
            return support.no_answer()
        return support

    def _rated(self, answer: Answer, verified: bool) -> Support | None:
        if self.citations is None or not answer.answer_ids:
            return None
        if answer.checked:
            # Teacher-forced features: the generation-time model would read them as this model's own confidence;
            # the checked support model is fitted on such passes (generators.answering.check).
            from midlens.generators.answering.check import checked_support

            return checked_support(answer, lambda: self.loaded.sha256, self.method.spec())
        method = self.method.spec()  # the support model says whether it was fitted on this method's answers
        if verified not in self._support_models:
            self._support_models[verified] = packaged_support(
                self.loaded.name, lambda: self.loaded.sha256, verified, method
            )
        model = self._support_models[verified]
        return None if model is None else model.support(support_inputs(answer), method)

    def stream(self, prompt: StackedPrompt, **kwargs) -> GenerationStream:
        reference = kwargs.pop("reference", None)  # generate()'s other keywords but the callbacks: DecodeOptions'
        steps = answer_steps(self, [prompt], DecodeOptions(**kwargs), [reference], cite_as_you_go=True)
        return GenerationStream(steps)

    def score(self, prompt: StackedPrompt, calibrate: bool = True) -> Answer:
        """Evidence for the passages without generating (one prefill, plus the calibration suffix)."""
        return self.generate(prompt, max_new_tokens=0, calibrate=calibrate)

    def score_batch(self, prompts: list[StackedPrompt], calibrate: bool = True) -> list[Answer]:
        return self.generate_batch(prompts, max_new_tokens=0, calibrate=calibrate)
