"""Generator: a loaded model run with one method, answering a stacked prompt and scoring its passages.

    gen = Generator("smollm2-135m", method="ms-poe(ratio_max=1.5)", device="auto", dtype="auto")
    prompt = gen.prompt("Who wrote X?", passages)
    answer = gen.generate(prompt)            # text + per-passage evidence + timings
    for piece in gen.stream(prompt): ...     # same, token by token

    answers = gen.generate_batch(prompts)    # several at once, each equal to its answer alone

One forward pass over the prompt (SDPA, KV cache) both prepares generation and reads the evidence;
decoding reuses the cache and reads the answer's attention; calibration runs the content-free question
("N/A") on the cached passages. The loop is written once, for a left-padded batch (generators.batch); a
single prompt is a batch of one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from collections.abc import Generator as Generator_
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import DynamicCache

from midlens.core.checks import check_max_new_tokens
from midlens.core.device import id_tensor
from midlens.core.errors import InvalidArgumentError, MethodConfigError, Remedy
from midlens.core.names import DEFAULT_MAX_NEW_TOKENS, Truncate
from midlens.core.passage import Passage
from midlens.core.sentences import sentence_spans
from midlens.generators.anatomy import model_anatomy
from midlens.generators.answer import Answer
from midlens.generators.batch import BatchRun, pad_token_id
from midlens.generators.citations import (
    Citation,
    CitationConfig,
    MeasuredCitations,
    cite,
    token_end,
    token_ends,
)
from midlens.generators.context import MethodParts, method_context
from midlens.generators.detokenize import IncrementalText
from midlens.generators.evidence import EvidenceConfig, PassageEvidence, for_windows, passage_evidence
from midlens.generators.instances import Mixture, expand
from midlens.generators.loading import LoadedModel, load_model
from midlens.generators.methods.registry import MethodConfig, build_parts, method_config
from midlens.generators.packaged_models import DEFAULT_MODEL, default_method
from midlens.generators.probe import PassageProbe
from midlens.generators.prompt import (
    CONTENT_FREE_QUESTION,
    DEFAULT_STYLE,
    StackedPrompt,
    build_prompt,
    render,
    render_many,
)
from midlens.generators.retrieval_heads import resolve_evidence
from midlens.generators.rope_regimes import regime_groups, rope_switches, row_reach
from midlens.generators.support import Support, SupportModel, packaged_support, support_inputs


@dataclass(frozen=True)
class DecodeOptions:
    """What one generation call decodes with (`Generator.generate`'s keywords, as one value for the loop)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = 0
    calibrate: bool = True  # also the content-free pass (calibrated evidence)
    stop_at_line_end: bool = False
    ignore_eos: bool = False
    # The references are the answers: their tokens are teacher-forced in one chunk whose attention is read and
    # cited as a generated answer's would be (`Generator.attribute`); nothing is decoded.
    forced: bool = False


# Verification's passes: the answer's own tokens scored teacher-forced, nothing generated, nothing calibrated.
TEACHER_FORCED = DecodeOptions(max_new_tokens=0, seed=None, calibrate=False)
# A given answer read as if this model had written it: calibrated like a generated answer, whose citations blend
# in the calibrated evidence.
ATTRIBUTED = DecodeOptions(max_new_tokens=0, seed=None, calibrate=True, forced=True)


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
        None: the model's measured default (core.names.answer_method_for; the baseline for a model folder).
        `device`/`dtype` apply when `model` is a name; a LoadedModel keeps the device and dtype it has.
        `citations`: how each answer sentence's citations are read from its attention (None: no citations;
        "measured": the rule chosen on the train split for this model and method, `CitationConfig.measured`;
        `MeasuredCitations(evidence_from="mudaf")`: the rule measured with MuDAF's evidence blended in)."""
        if method is None:
            method = default_method(model)
        self.method: MethodConfig = method_config(method, method_options)  # before loading: fail fast
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
        self._evidence_scorer = self._citation_scorer()
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

    def _citation_evidence(self, prompts: list[StackedPrompt], calibrate: bool) -> list[list[PassageEvidence]] | None:
        """Each prompt's passage evidence as `CitationConfig.evidence_from`'s method reads it (one prefill per
        prompt, batched); None where citations blend in the answering pass's own."""
        if self._evidence_scorer is None:
            return None
        # A rule that blends in only the raw evidence (the default model's, measured) has no use for the
        # scorer's content-free pass.
        calibrate = calibrate and self.citations.evidence_weight > 0
        return [answer.passages for answer in self._evidence_scorer.score_batch(prompts, calibrate=calibrate)]

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
        """`style`: the instruction, a name in generators.prompt.STYLES ("short" asks for the bare answer, "litm"
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

    def _pick(self, logits: torch.Tensor, temperature: float, top_p: float, rng: torch.Generator | None) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        if top_p < 1.0:
            sorted_probs, idx = probs.sort(descending=True)
            keep = sorted_probs.cumsum(0) - sorted_probs < top_p
            probs = torch.zeros_like(probs).scatter(0, idx[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=rng))

    def _check(self, prompts: list[StackedPrompt], decode: DecodeOptions) -> None:
        if decode.temperature > 0 and not 0 < decode.top_p <= 1:
            share = "nucleus sampling keeps a share of the probability mass, in (0, 1]."
            raise InvalidArgumentError(share, (), Remedy("top_p", decode.top_p))
        max_new_tokens = check_max_new_tokens(decode.max_new_tokens)
        for prompt in prompts:
            if prompt.num_tokens + max_new_tokens > self.context_window:
                raise InvalidArgumentError(
                    f"the prompt ({prompt.num_tokens} tokens) and the answer (max_new_tokens={max_new_tokens}) exceed "
                    f"the context window ({self.context_window}); build the prompt with Generator.prompt(), which "
                    "leaves room for the answer.",
                    [Remedy("max_new_tokens", max(0, self.context_window - prompt.num_tokens), "at most")],
                )

    def _steps(
        self,
        prompts: list[StackedPrompt],
        decode: DecodeOptions,
        references: list[str | list[int] | None] | None = None,
        cancelled: Callable[[int], bool] | None = None,
        cite_as_you_go: bool = False,
        grouped: bool = False,
    ) -> Generator_[tuple[int, str | Citation], None, list[Answer]]:
        """The generation loop, for a batch: yields (row, text delta); returns one Answer per prompt.
        `grouped`: the prompts are known to share one RoPE regime (`generators.rope_regimes`).

        Each row is answered as it would be alone: its own positions and stopping (EOS, line end, max tokens),
        its own sampling stream (seeded with `decode.seed`, as a lone prompt would be), its evidence and citations
        read from its own scoring rows. With `cite_as_you_go` (and citations on) it also yields (row, Citation) for
        each answer sentence once the next one has begun: the calibration pass then runs before decoding (its
        scores are what a citation blends in), and each Citation equals the one in the final Answer.

        In order: the citation scorer's own pass (`evidence_from`), the prefill, the method's answering hook,
        decoding, the answer's attention and the references' log-probabilities, the content-free pass, the
        Answers."""
        self._check(prompts, decode)
        references = references or [None] * len(prompts)
        if len(references) != len(prompts):
            raise ValueError(f"{len(references)} references for {len(prompts)} prompts: give one (or None) each.")
        reference_ids = [None if r is None else self._reference_ids(r) for r in references]  # refused before decoding
        groups = [list(range(len(prompts)))] if grouped else self._rope_groups(prompts, decode, reference_ids)
        if len(groups) > 1:  # rows a length-switching RoPE would rotate otherwise than alone: batches of their own
            return (yield from self._each_group(groups, prompts, decode, reference_ids, cancelled, cite_as_you_go))
        sampled = decode.temperature > 0 and decode.seed is not None
        rows = _Rows.start(len(prompts), decode.max_new_tokens, sampled, decode.seed, self.device, cancelled)
        rows.decoders = [IncrementalText(self.tokenizer) for _ in prompts]
        hook = self.parts.answering
        mixture = Mixture(self.parts.instances, len(prompts))  # one row per prompt unless the method runs several
        reference_logprobs: list[list[float] | None] = [None] * len(prompts)
        citer: _SentenceCiter | None = None
        # Before this method is installed: the scorer runs its own on the same shared model. Nothing to cite when
        # nothing is generated (scoring, verification's teacher-forced passes).
        t0 = time.perf_counter()
        nothing_cited = decode.max_new_tokens == 0 and not decode.forced
        cited_evidence = None if nothing_cited else self._citation_evidence(prompts, decode.calibrate)
        cite_evidence_s = time.perf_counter() - t0
        with self.running() as method_run:
            run = BatchRun(
                self.loaded,
                expand(prompts, mixture.count),
                method_run,
                self.probe_layers(),
                cite=self.citations is not None,
            )
            if cited_evidence is not None:
                run.timings["cite_evidence_s"] = cite_evidence_s
            with method_run.probe(run.probe):
                logits = first_logits = self._prefill(run, mixture)
                with hook(run.view()) if hook is not None else nullcontext():
                    t0 = time.perf_counter()
                    if hook is not None:  # the last prompt token's query gives the first answer token: read it
                        logits = first_logits = mixture.logits(run.reread_last())  # again, under the method
                    if cite_as_you_go and self.citations is not None:
                        if decode.calibrate:  # the cache holds the prompt alone, as after decoding: the same maps
                            run.content_free_maps()
                        citer = _SentenceCiter(self, run, mixture, prompts, cited_evidence)
                    yield from self._decode(run, mixture, rows, logits, decode, citer)
                    run.timings["decode_s"] = time.perf_counter() - t0
                    segment_mass = self._read_answer_attention(run, rows, mixture.count)
                    mix = None if mixture.instances is None else mixture.reference
                    if decode.forced:
                        reference_logprobs = self._force(run, rows, first_logits, reference_ids, mix)
                        segment_mass = self._read_answer_attention(run, rows, mixture.count)
                    elif any(r is not None for r in reference_ids):
                        reference_logprobs = run.reference_logprobs(first_logits, reference_ids, mix)
                if decode.calibrate:
                    run.content_free_maps()
        answers = []
        for b, prompt in enumerate(prompts):
            final = self.tokenizer.decode(rows.generated[b], skip_special_tokens=True)
            if len(final) > len(rows.texts[b]):
                yield b, final[len(rows.texts[b]) :]
            mass = None if segment_mass is None else mixture.mass(segment_mass, b)
            cited = None if cited_evidence is None else cited_evidence[b]
            answers.append(
                self._answer(run, mixture, b, prompt, final, rows, mass, reference_logprobs[b], cited, decode.forced)
            )
        if citer is not None:  # the citations still due (the last sentence's, or a row's that ended mid-sentence)
            for b, answer in enumerate(answers):
                for citation in answer.citations[citer.emitted[b] :]:
                    yield b, citation
        return answers

    def _rope_groups(
        self, prompts: list[StackedPrompt], decode: DecodeOptions, reference_ids: list[list[int] | None]
    ) -> list[list[int]]:
        """The prompts in batches that rotate as each prompt alone would (one batch unless the model's RoPE tables
        switch with the length, LongRoPE's or dynamic NTK's: `generators.rope_regimes`)."""
        switches = rope_switches(self.model) if len(prompts) > 1 else []
        if not switches:
            return [list(range(len(prompts)))]
        # The content-free pass may run whether or not calibration is asked for (a method's hook reads it).
        with_passages = [p for p in prompts if p.passages]
        requests = [(p.passages, CONTENT_FREE_QUESTION, p.style) for p in with_passages]
        nulls = dict(zip(map(id, with_passages), render_many(self.tokenizer, requests, sentences=False), strict=True))
        reaches = [
            row_reach(
                p.num_tokens,
                decode.max_new_tokens,
                0 if ref is None else len(ref),
                nulls[id(p)].num_tokens if id(p) in nulls else None,
            )
            for p, ref in zip(prompts, reference_ids, strict=True)
        ]
        return regime_groups(reaches, switches)

    def _each_group(
        self,
        groups: list[list[int]],
        prompts: list[StackedPrompt],
        decode: DecodeOptions,
        reference_ids: list[list[int] | None],
        cancelled: Callable[[int], bool] | None,
        cite_as_you_go: bool,
    ) -> Generator_[tuple[int, str | Citation], None, list[Answer]]:
        """`_steps` on each group of rows in turn, its rows' events and Answers under the caller's row numbers."""
        answers: list[Answer | None] = [None] * len(prompts)
        for group in groups:
            steps = self._steps(
                [prompts[i] for i in group],
                decode,
                [reference_ids[i] for i in group],
                None if cancelled is None else (lambda r, group=group: cancelled(group[r])),
                cite_as_you_go,
                grouped=True,
            )
            while True:
                try:
                    row, event = next(steps)
                except StopIteration as finished:
                    for i, answer in zip(group, finished.value, strict=True):
                        answers[i] = answer
                    break
                yield group[row], event
        return answers

    def _prefill(self, run: BatchRun, mixture: Mixture) -> torch.Tensor:
        """The prompts' forward pass (the probe reading the passages' attention): the first answer token's logits."""
        t0 = time.perf_counter()
        logits = mixture.logits(run.prefill())
        run.timings["prefill_s"] = time.perf_counter() - t0
        return logits

    def _decode(
        self,
        run: BatchRun,
        mixture: Mixture,
        rows: _Rows,
        logits: torch.Tensor,
        decode: DecodeOptions,
        citer: _SentenceCiter | None = None,
    ) -> Iterator[tuple[int, str | Citation]]:
        """Pick, stream and feed back tokens until every row is done; yields (row, text delta) and, with a
        `citer`, (row, Citation) as each answer sentence ends."""
        temperature, top_p, stop_at_line_end, ignore_eos = (
            decode.temperature,
            decode.top_p,
            decode.stop_at_line_end,
            decode.ignore_eos,
        )
        while not all(rows.done):
            # Greedy rows all at once: one argmax and one device-to-host copy per step, not one per row (each a
            # synchronisation of the GPU stream: 32 per step at batch 32).
            # Each row's next-token distribution in fp32 (the answer's own confidence, read by generators.support).
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            greedy = logits.argmax(dim=-1).tolist() if temperature <= 0 else None
            top2 = logprobs.topk(2, dim=-1).values
            margins = (top2[:, 0] - top2[:, 1]).tolist()  # how decided the step was, whatever was picked
            # A greedy token is the argmax, so its log-probability is the top one (log-softmax keeps the order).
            chosen = top2[:, 0].tolist() if greedy is not None else None
            for b in range(len(rows.done)):
                if not rows.done[b] and rows.cancelled is not None and rows.cancelled(b):
                    rows.done[b] = True  # the other rows never see this one: their answers do not change
                if rows.done[b]:
                    continue
                token = greedy[b] if greedy is not None else self._pick(logits[b], temperature, top_p, rows.rngs[b])
                if not ignore_eos and token in self.eos_ids:
                    rows.done[b] = True
                    continue
                rows.generated[b].append(token)
                rows.logprobs[b].append(chosen[b] if chosen is not None else float(logprobs[b, token]))
                rows.margins[b].append(margins[b])
                new_text = rows.decoders[b].push(token)
                rows.ends[b].append(token_end(new_text, rows.ends[b]))  # citations.token_ends, as each prefix decodes
                if len(new_text) > len(rows.texts[b]) and not new_text.endswith("\ufffd"):
                    yield b, new_text[len(rows.texts[b]) :]
                    rows.texts[b] = new_text
                    if citer is not None:
                        yield from citer.ended(b, rows)
                if (stop_at_line_end and "\n" in rows.texts[b].lstrip()) or len(rows.generated[b]) == rows.limit:
                    rows.done[b] = True
            if all(rows.done):
                break
            for b in range(len(rows.done)):
                rows.fed[b] += not rows.done[b]
            tokens = [g[-1] if not d else self.pad_id for g, d in zip(rows.generated, rows.done, strict=True)]
            logits = mixture.logits(run.step(mixture.rows(tokens)), live=[not d for d in rows.done])

    def _read_answer_attention(self, run: BatchRun, rows: _Rows, count: int) -> list[torch.Tensor | None] | None:
        """Each batch row's mean answer maps (`maps.answer`) and, when citations are on, its per-token attention over
        the passages' headings and sentences [layers, H, fed, segments] (None where no token was fed back). Batch
        row r is an instance of prompt r // `count`, whose decoding state `rows` holds."""
        if not any(rows.fed):
            run.probe.score_rows([])
            return None
        taken = run.probe.take()
        segments = run.probe.take_answer_spans()
        run.probe.score_rows([])
        for r, maps in enumerate(run.maps):
            b = r // count
            passages = len(run.prompts[r].passages)
            if len(rows.generated[b]) > 1:
                maps.answer = taken[:, r, :, : rows.fed[b], :passages].mean(2)
        return _segments_per_row(run, rows, count, segments)

    def _force(
        self,
        run: BatchRun,
        rows: _Rows,
        first_logits: torch.Tensor,
        answers: list[list[int] | None],
        mix: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> list[list[float] | None]:
        """Given answers teacher-forced in one chunk after the prompts, their attention read as an answer's own:
        `rows` then hold them as if decoded (tokens, character ends, log-probabilities, margins, the rows fed
        back), so the Answer, its evidence and its citations are assembled by the same code as a generated one's.
        Returns each answer's token log-probabilities."""
        t0 = time.perf_counter()
        logprobs, margins = run.teacher_forced(first_logits, answers, mix, read=self.citations is not None)
        run.timings["answer_s"] = time.perf_counter() - t0  # the answer's chunk: what checking adds to the prefill
        for b, ids in enumerate(answers):
            ids = ids or []
            rows.generated[b] = list(ids)
            rows.ends[b] = token_ends(self.tokenizer, rows.generated[b])
            rows.logprobs[b] = list(logprobs[b] or [])
            rows.margins[b] = list(margins[b] or [])
            rows.fed[b] = max(len(ids) - 1, 0)  # token j's query produced token j + 1; the last produced nothing
            rows.done[b] = True
        return logprobs

    def _passage_evidence(self, prompt: StackedPrompt, maps) -> list[PassageEvidence]:
        return passage_evidence(
            prompt.passages,
            maps,
            self.evidence_config,
            prompt.passage_spans,
            self.windows,
            prompt.num_tokens,
            prompt.question_span,
        )

    def _cite(
        self,
        prompt: StackedPrompt,
        decoded: str,
        ids: list[int],
        segment_mass: torch.Tensor | None,
        evidence: list[PassageEvidence],
        ends: list[int] | None,
    ) -> list[Citation]:
        """The citations of an answer (`decoded`, possibly still growing) from its rows' segment mass: the one
        computation behind a finished Answer's citations and those streamed as each sentence ends."""
        return cite(
            prompt,
            decoded.strip(),
            decoded,
            ids,
            self.tokenizer,
            segment_mass,
            self.evidence_config,
            self.citations,
            evidence,
            ends,
        )

    def _answer(
        self,
        run: BatchRun,
        mixture: Mixture,
        b: int,
        prompt: StackedPrompt,
        decoded: str,
        rows: _Rows,
        segment_mass: torch.Tensor | None,
        reference_logprobs: list[float] | None,
        cited_evidence: list[PassageEvidence] | None = None,
        checked: bool = False,
    ) -> Answer:
        """Row `b`'s Answer. `cited_evidence`: the evidence citations blend in when it is not this pass's own
        (`evidence_from`); `checked`: the answer was given and teacher-forced (`attribute`), not generated."""
        ids, ends = rows.generated[b], rows.ends[b]
        text = decoded.strip()
        maps = mixture.maps(run.maps, b)
        passages = self._passage_evidence(prompt, maps)
        citations = []
        if self.citations is not None:
            t0 = time.perf_counter()
            evidence = passages if cited_evidence is None else cited_evidence
            citations = self._cite(prompt, decoded, ids, segment_mass, evidence, ends)
            run.timings["cite_s"] = run.timings.get("cite_s", 0.0) + time.perf_counter() - t0
        answer = Answer(
            question=prompt.question,
            text=text,
            passages=passages,
            model=self.loaded.name,
            method=self.method.to_dict(),
            evidence_config=self.evidence_config,
            prompt_tokens=prompt.num_tokens,
            generated_tokens=len(ids),
            timings=dict(run.timings),
            dropped=prompt.dropped,
            maps=maps,
            reference_logprob=None if reference_logprobs is None else sum(reference_logprobs),
            reference_token_logprobs=reference_logprobs,
            method_state=run.scratch[b * mixture.count],
            citations=citations,
            answer_ids=list(ids),
            token_logprobs=list(rows.logprobs[b]),
            token_margins=list(rows.margins[b]),
            checked=checked,
        )
        answer.support = self.support_of(answer)
        return answer

    def _reference_ids(self, text: str | list[int]) -> list[int]:
        ids = list(text) if isinstance(text, list) else self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("the reference answer is empty: pass a non-empty gold answer, or reference=None.")
        return ids

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
        steps = self._steps([prompt], decode, [reference], cite_as_you_go=on_citation is not None)
        answers = _drain(
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
        steps = self._steps(prompts, decode, references, cancelled, cite_as_you_go=on_citation is not None)
        return _drain(steps, on_token, on_citation)

    def verify(self, prompts: list[StackedPrompt], answers: list[Answer], batch_size: int = 8) -> list[Answer]:
        """Check every citation against the answer it came with: the same answer tokens are scored teacher-forced
        with each cited passage removed, in batches, and a source is verified when its answer sentence loses at
        least `CitationConfig.margin` nats (`logprob_drop` holds the loss). Answers are updated in place and
        returned. Costs one prefill per cited passage plus one for the full prompt, no decoding."""
        if self.citations is None:
            raise InvalidArgumentError("citations are off for this generator (citations=None): nothing to verify.")
        jobs: list[tuple[int, int | None]] = []  # (answer, removed passage position or None for the full prompt)
        scored: list[StackedPrompt] = []
        for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
            cited = sorted({s.position for c in answer.citations for s in c.sources})
            if not cited:
                continue
            if prompt.num_tokens + len(answer.answer_ids) > self.context_window:
                raise InvalidArgumentError(
                    f"cannot verify the citations of answer {i + 1}: its prompt ({prompt.num_tokens} tokens) and "
                    f"answer ({len(answer.answer_ids)} tokens) no longer fit the {self.context_window}-token window; "
                    "verify with the prompt the answer was generated from, or with fewer passages."
                )
            for position in [None, *cited]:
                kept = [p for j, p in enumerate(prompt.passages, start=1) if j != position]
                ablated = None if position is None else render(self.tokenizer, kept, prompt.question, prompt.style)
                scored.append(prompt if ablated is None else ablated)
                jobs.append((i, position))
        logprobs: list[list[float]] = []
        for start in range(0, len(scored), batch_size):
            chunk = scored[start : start + batch_size]
            refs = [answers[i].answer_ids for i, _ in jobs[start : start + batch_size]]
            results = _drain(self._steps(chunk, TEACHER_FORCED, refs), None)
            logprobs += [r.reference_token_logprobs for r in results]
        full: dict[int, list[float]] = {}
        for (i, position), lp in zip(jobs, logprobs, strict=True):
            if position is None:
                full[i] = lp
                continue
            for citation in answers[i].citations:
                a, b = citation.tokens
                drop = sum(full[i][a:b]) - sum(lp[a:b])
                for source in citation.sources:
                    if source.position == position:
                        source.logprob_drop, source.verified = drop, drop >= self.citations.margin
        for i in full:  # the answers whose citations were checked: their support now reads the drops too
            answers[i].support = self.support_of(answers[i], verified=True)
        return answers

    def attribute(self, prompt: StackedPrompt, answer: str, verify: bool = False) -> Answer:
        """Read an answer this model did not write as if it had: `answer` teacher-forced after `prompt` in one pass,
        giving its per-sentence citations (spans in `Answer.text`, which is `answer` as the tokenizer round-trips
        it), the passages' evidence and the answer's log-probability (`reference_logprob`, per token in
        `token_logprobs`). `verify`: each citation checked by ablation (`verify`). `support` is the checked
        support model's (generators.checking: per sentence, the answer's its weakest sentence's), None where none
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
            out += _drain(self._steps(chunk, ATTRIBUTED, refs), None)
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
        """How far `answer` can be trusted (generators.support): the support model shipped for this model (the
        model-agnostic one for any other), plain or, once its citations were verified, reading the ablation drops.
        None with citations off (the features read them) or for a pass that generated nothing."""
        if self.citations is None or not answer.answer_ids:
            return None
        if answer.checked:
            # Teacher-forced features: the generation-time model would read them as this model's own confidence;
            # the checked support model is fitted on such passes (generators.checking).
            from midlens.generators.checking import checked_support

            return checked_support(answer, lambda: self.loaded.sha256)
        method = self.method.spec()  # the support model says whether it was fitted on this method's answers
        if verified not in self._support_models:
            self._support_models[verified] = packaged_support(
                self.loaded.name, lambda: self.loaded.sha256, verified, method
            )
        model = self._support_models[verified]
        return None if model is None else model.support(support_inputs(answer), method)

    def stream(self, prompt: StackedPrompt, **kwargs) -> GenerationStream:
        reference = kwargs.pop("reference", None)  # generate()'s other keywords but the callbacks: DecodeOptions'
        steps = self._steps([prompt], DecodeOptions(**kwargs), [reference], cite_as_you_go=True)
        return GenerationStream(steps)

    def score(self, prompt: StackedPrompt, calibrate: bool = True) -> Answer:
        """Evidence for the passages without generating (one prefill, plus the calibration suffix)."""
        return self.generate(prompt, max_new_tokens=0, calibrate=calibrate)

    def score_batch(self, prompts: list[StackedPrompt], calibrate: bool = True) -> list[Answer]:
        return self.generate_batch(prompts, max_new_tokens=0, calibrate=calibrate)


def _segments_per_row(
    run: BatchRun, rows: _Rows, count: int, segments: torch.Tensor | None
) -> list[torch.Tensor | None]:
    """Each batch row's fed answer tokens' mass over its prompt's segments [layers, H, fed, segments] (None where
    nothing was fed); batch row r is an instance of prompt r // `count`."""
    per_row: list[torch.Tensor | None] = []
    for r, prompt in enumerate(run.prompts):
        fed = rows.fed[r // count]
        per_row.append(None if segments is None or fed == 0 else segments[:, r, :, :fed, : len(prompt.segments())])
    return per_row


class _SentenceCiter:
    """Citations of a streamed answer's sentences as they end: a sentence has ended once the splitter sees the
    next one begin. Each is computed as the final Answer's will be (`cite` on the answer so far, with the rows fed
    so far and the passage evidence), so the streamed Citation equals the final one."""

    def __init__(
        self,
        generator: Generator,
        run: BatchRun,
        mixture: Mixture,
        prompts: list[StackedPrompt],
        cited_evidence: list[list[PassageEvidence]] | None = None,
    ):
        self.generator, self.run, self.mixture, self.prompts = generator, run, mixture, prompts
        self.emitted = [0] * len(prompts)
        self._evidence: dict[int, list[PassageEvidence]] = dict(enumerate(cited_evidence or []))

    def ended(self, b: int, rows: _Rows) -> Iterator[tuple[int, Citation]]:
        text = rows.texts[b]
        ended = len(sentence_spans(text.strip())) - 1  # the last sentence may still grow
        if ended <= self.emitted[b] or not self.prompts[b].passages:
            return
        mass = self.mixture.mass(_segments_per_row(self.run, rows, self.mixture.count, self._segments()), b)
        citations = self.generator._cite(
            self.prompts[b], text, rows.generated[b], mass, self._evidence_of(b), rows.ends[b]
        )
        for citation in citations[self.emitted[b] : ended]:
            yield b, citation
        self.emitted[b] = max(self.emitted[b], min(ended, len(citations)))

    def _segments(self) -> torch.Tensor | None:
        return self.run.probe.answer_spans_so_far()

    def _evidence_of(self, b: int) -> list[PassageEvidence]:
        if b not in self._evidence:
            maps = self.mixture.maps(self.run.maps, b)
            self._evidence[b] = self.generator._passage_evidence(self.prompts[b], maps)
        return self._evidence[b]


def _drain(
    steps: Generator_[tuple[int, str | Citation], None, list[Answer]],
    on_token: Callable[[int, str], None] | None,
    on_citation: Callable[[int, Citation], None] | None = None,
) -> list[Answer]:
    """Run the steps to their Answers, handing each event to its callback (with citations asked for, the steps
    hand over every Citation of every row exactly once, the ones still due when decoding ended last)."""
    while True:
        try:
            row, event = next(steps)
        except StopIteration as done:
            return done.value
        if isinstance(event, str):
            if on_token is not None:
                on_token(row, event)
        elif on_citation is not None:
            on_citation(row, event)


class GenerationStream:
    """Iterate for text deltas; `answer` holds the full Answer once iteration ends. `events()` also yields each
    answer sentence's Citation (citations on) as soon as the next sentence has begun, the last one at the end."""

    def __init__(self, steps: Iterator[tuple[int, str | Citation]]):
        self._steps = steps
        self.answer: Answer | None = None

    def __iter__(self) -> Iterator[str]:
        for event in self.events():
            if isinstance(event, str):
                yield event

    def events(self) -> Iterator[str | Citation]:
        """Text deltas (str) and Citations in the order they became known, the last sentence's once decoding ends."""
        while True:
            try:
                _row, event = next(self._steps)
            except StopIteration as done:
                self.answer = done.value[0]
                return
            yield event


@dataclass
class _Rows:
    """Per-row decoding state of one batch."""

    generated: list[list[int]]
    texts: list[str]  # each row's answer as streamed so far
    ends: list[list[int]]  # each row's decoded character end per generated token (citations.token_ends)
    done: list[bool]
    fed: list[int]  # decode steps that fed this row's token back (its answer-attention rows)
    rngs: list[torch.Generator | None]
    limit: int
    cancelled: Callable[[int], bool] | None = None  # row -> stop it now (its client left)
    decoders: list[IncrementalText] = field(default_factory=list)  # each row's text, decoded a few tokens a step
    logprobs: list[list[float]] = field(default_factory=list)  # each generated token's log-probability when picked
    margins: list[list[float]] = field(default_factory=list)  # top-1 minus top-2 log-probability at each step

    @classmethod
    def start(
        cls,
        batch: int,
        limit: int,
        sampled: bool,
        seed: int | None,
        device: torch.device,
        cancelled: Callable[[int], bool] | None = None,
    ) -> _Rows:
        rngs = [torch.Generator(device).manual_seed(seed) if sampled else None for _ in range(batch)]
        return cls(
            [[] for _ in range(batch)],
            [""] * batch,
            [[] for _ in range(batch)],
            [limit == 0] * batch,
            [0] * batch,
            rngs,
            limit,
            cancelled,
            logprobs=[[] for _ in range(batch)],
            margins=[[] for _ in range(batch)],
        )
