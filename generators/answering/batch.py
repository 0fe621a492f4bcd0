"""One batch of stacked prompts on one KV cache: the state a generation loop and a method's passes share.

Prompts are left-padded to one width, so every row's last prompt token sits in the same column and decoding
appends one column per step for all rows at once. Per row the model sees exactly what it would see alone:
positions count that row's own tokens (padding takes none), and a [B, 1, L, T] boolean mask hides every other
row's padding. With no padding the mask is None and SDPA runs causal, as for a single prompt.

Passes beyond the plain prefill/decode (the content-free question that calibrates evidence, a copy of the
prompt a method reads its bias from, a reference answer's log-probability) go through `BatchRun` too. A pass
that must not see part of the cache appends its tokens after it with those columns hidden, at the positions
they would have alone, and crops the cache back afterwards: no row ever needs a cache of its own length.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache

from midlens.core.device import id_tensor, to_device_async
from midlens.generators.attention.evidence import EvidenceMaps, RowMaps
from midlens.generators.attention.masks import padded_causal
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.probe import PassageProbe
from midlens.generators.methods.install import AnsweringView, MethodRun
from midlens.generators.models.loading import LoadedModel, non_finite_error
from midlens.generators.models.prompt import CONTENT_FREE_QUESTION, StackedPrompt, render_many, shared_prefix_length


def pad_token_id(tokenizer: Any) -> int:
    """The token left padding is filled with (never attended to; any valid id would do)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


def padded_block(
    tokens: list[list[int]], starts: list[int], pad_id: int, right_aligned: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk of columns holding each row's tokens (empty for a row with none), padded to the longest:
    right-aligned (the last tokens share the last column, as a prompt's or a question's) or left-aligned (the
    first tokens share the first column, a continuation of the prompt). Row b's tokens sit at positions
    starts[b], starts[b] + 1, ...  -> (ids, positions, valid), each [B, width], on the CPU."""
    batch, width = len(tokens), max((len(t) for t in tokens), default=0)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    positions = torch.zeros(batch, width, dtype=torch.long)
    valid = torch.zeros(batch, width, dtype=torch.bool)
    for b, (row, start) in enumerate(zip(tokens, starts, strict=True)):
        if not row:
            continue
        cols = slice(width - len(row), width) if right_aligned else slice(0, len(row))
        ids[b, cols] = id_tensor(row)
        positions[b, cols] = torch.arange(start, start + len(row))
        valid[b, cols] = True
    return ids, positions, valid


def _crop(cache: DynamicCache, columns: int) -> None:
    """Keep the first `columns` cached columns (the cache takes the number to remove, as a negative count)."""
    extra = cache.get_seq_length() - columns
    if extra > 0:
        cache.crop(-extra)


class BatchRun:
    """A left-padded batch of prompts, its KV cache, its passage probe and each row's evidence maps.

    Created inside a method context on `loaded` (`Generator.running()`); `method_run` is that context's handle (a
    pass with a probe of its own swaps it in there)."""

    def __init__(
        self,
        loaded: LoadedModel,
        prompts: list[StackedPrompt],
        method_run: MethodRun,
        layers: list[int],
        cite: bool = False,
    ):
        """`cite`: the answer's own queries also record their mass over each passage's heading and sentences
        (`StackedPrompt.segments`), what citations are read from."""
        if not prompts:
            raise ValueError("a batch needs at least one prompt.")
        self.loaded = loaded
        self.prompts = prompts
        self.method_run = method_run
        self.layers = layers
        self.device = loaded.device
        self.pad_id = pad_token_id(loaded.tokenizer)
        lengths = [p.num_tokens for p in prompts]
        self.width = max(lengths)  # columns of the prompt; the last prompt token of every row is at width - 1
        self.offsets = [self.width - n for n in lengths]
        ids, positions, valid = padded_block([p.input_ids for p in prompts], [0] * len(prompts), self.pad_id, True)
        self.ids, self.positions = ids.to(self.device), positions.to(self.device)
        self.key_valid = valid.to(self.device)  # grows by one column per decode step
        self.next_position = torch.tensor(lengths, device=self.device)
        self.column_spans = [
            [(s + o, e + o) for s, e in p.passage_spans] for p, o in zip(prompts, self.offsets, strict=True)
        ]
        segments = [
            [(s + o, e + o) for s, e in (g.tokens for g in p.segments())]
            for p, o in zip(prompts, self.offsets, strict=True)
        ]
        self.probe = PassageProbe(
            self.column_spans, len(method_run.modules), layers, answer_spans=segments if cite else None
        )
        self.cache = new_cache()
        self.maps: list[EvidenceMaps] = []
        self.scratch: list[dict[str, Any]] = [{} for _ in prompts]  # each row's answering-hook state
        self.timings: dict[str, float] = {}  # the batch's, shared by its rows' answers
        self._content_free_done = False

    def view(self) -> AnsweringView:
        """What an answering hook may see and do of this batch."""
        return AnsweringView(
            prompts=self.prompts,
            column_spans=self.column_spans,
            width=self.width,
            device=self.device,
            tokenizer=self.loaded.tokenizer,
            maps=self.maps,
            scratch=self.scratch,
            timings=self.timings,
            content_free_maps=self.content_free_maps,
            prompt_maps=self.prompt_maps,
        )

    @property
    def batch_size(self) -> int:
        return len(self.prompts)

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        key_valid: torch.Tensor,
        keep: int = 1,
        all_valid: bool | None = None,
    ):
        """Logits [B, keep, vocab] for the chunk `ids` [B, L] at `positions`, appended to the cache; `key_valid`
        [B, cached + L] says which columns each row may attend to (`all_valid`: every one of them, if known)."""
        mask = padded_causal(key_valid, ids.shape[1], all_valid)
        out = self.loaded.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        return out.logits

    def _split(self, taken: torch.Tensor, counts: list[int]) -> list[RowMaps]:
        """Probe rows [layers, B, H, S, P] scored as (last, question tokens..., padding) -> each row's maps."""
        out = []
        for b, (prompt, count) in enumerate(zip(self.prompts, counts, strict=True)):
            rows = taken[:, b, :, :, : len(prompt.passages)]
            out.append(RowMaps(last=rows[:, :, 0], question=rows[:, :, 1 : 1 + count].mean(2)))
        return out

    def _scoring_rows(self, last: int, question_rows: list[list[int]]) -> torch.Tensor:
        """[B, S]: each row's last token first, then its question's tokens, padded with the last token."""
        width = 1 + max(len(r) for r in question_rows)
        return torch.tensor([[last, *r] + [last] * (width - 1 - len(r)) for r in question_rows], dtype=torch.long)

    def prefill(self) -> torch.Tensor:
        """The prompt through the model, reading each row's last-token and question maps: last logits [B, vocab]."""
        question_rows = [
            [o + i for i in range(*p.question_span)] for p, o in zip(self.prompts, self.offsets, strict=True)
        ]
        self.probe.score_rows(self._scoring_rows(self.width - 1, question_rows))
        logits = self.forward(self.ids, self.positions, self.key_valid)[:, -1]
        if not bool(torch.isfinite(logits).all()):
            # Damaged weights surface here as NaN logits; decoding them would give an empty answer and then a
            # bare "cannot convert float NaN to integer", so name the damaged file instead.
            raise non_finite_error(self.loaded)
        rows = self._split(self.probe.take(), [len(r) for r in question_rows])
        self.maps = [EvidenceMaps(last=r.last, question=r.question) for r in rows]
        self.probe.score_rows([])
        return logits

    def reread_last(self) -> torch.Tensor:
        """The last prompt column read again (under whatever a method has set since the prefill): [B, vocab]."""
        valid = self.key_valid[:, : self.width]
        self.crop(self.width - 1)
        self.probe.score_rows([])
        logits = self.forward(self.ids[:, -1:], self.positions[:, -1:], valid)[:, -1]
        self.key_valid = valid
        return logits

    def step(self, tokens: list[int]) -> torch.Tensor:
        """One decode step: each row's token appended at its next position; the probe scores the new rows."""
        ids = to_device_async(torch.tensor(tokens)[:, None], self.device)
        positions = self.next_position[:, None].clone()
        self.next_position += 1
        self.key_valid = torch.cat([self.key_valid, torch.ones_like(self.key_valid[:, :1])], dim=1)
        self.probe.score_rows([0])
        # Decoding appends valid columns to the prompt's: only left padding hides any key from a step.
        return self.forward(ids, positions, self.key_valid, all_valid=not any(self.offsets))[:, -1]

    def crop(self, columns: int) -> None:
        """Back to the first `columns` columns (the prompt's are 0..width-1); decode positions run on."""
        _crop(self.cache, columns)
        self.key_valid = self.key_valid[:, :columns]

    def content_free_maps(self) -> None:
        """ICR calibration: each row's passages with the content-free question "N/A", read on the cached passages.

        The null question is appended after the prompt's columns with the row's own question hidden, at the
        positions it would have right after the passages; the cache is cropped back to the prompt afterwards (and
        anything generated is dropped). Sets `null_last` / `null_question` of every row that has passages; once
        per batch (a method's hook may have asked for them before the generator does)."""
        if self._content_free_done or not any(p.passages for p in self.prompts):
            return
        self._content_free_done = True
        t0 = time.perf_counter()
        self.crop(self.width)
        self._content_free_maps()
        self.timings["calibrate_s"] = time.perf_counter() - t0

    def _content_free_maps(self) -> None:
        tokenizer = self.loaded.tokenizer
        cached = self.cache.get_seq_length()
        batch = self.batch_size
        suffixes: list[list[int]] = [[] for _ in range(batch)]  # each row's null tokens after the shared prefix
        shared = [0] * batch
        question_rows: list[list[int]] = [[] for _ in range(batch)]
        fresh: dict[int, StackedPrompt] = {}  # null prompts that do not share the passages' tokens: prefilled alone
        # One render per prompt (a method's instance rows repeat theirs), all in one call of the tokenizer: rendered
        # one by one, a batch of 32 took longer on the host than its decoding on a GPU.
        distinct = list({id(p): p for p in self.prompts if p.passages}.values())
        requests = [(p.passages, CONTENT_FREE_QUESTION, p.style) for p in distinct]
        nulls = dict(zip(map(id, distinct), render_many(tokenizer, requests, sentences=False), strict=True))
        for b, prompt in enumerate(self.prompts):
            if not prompt.passages:
                continue
            null = nulls[id(prompt)]
            s = min(shared_prefix_length(prompt.input_ids, null.input_ids), null.question_span[0])
            if s < null.passage_spans[-1][1]:  # a tokenizer merged across the question boundary
                fresh[b] = null
                continue
            suffixes[b], shared[b] = null.input_ids[s:], s
            question_rows[b] = [i - s for i in range(*null.question_span)]  # within the suffix, shifted below
        appended = [b for b in range(batch) if suffixes[b]]
        if appended:
            ids, positions, block_valid = padded_block(suffixes, shared, self.pad_id, right_aligned=True)
            width = ids.shape[1]
            prefix_valid = torch.zeros(batch, cached, dtype=torch.bool)
            for b in appended:
                prefix_valid[b, self.offsets[b] : self.offsets[b] + shared[b]] = True
                start = width - len(suffixes[b])  # right-aligned: the last null token is in the last column
                question_rows[b] = [start + i for i in question_rows[b]]
            self.probe.score_rows(self._scoring_rows(width - 1, question_rows))
            key_valid = torch.cat([prefix_valid, block_valid], dim=1).to(self.device)
            self.forward(ids.to(self.device), positions.to(self.device), key_valid)
            rows = self._split(self.probe.take(), [len(r) for r in question_rows])
            self.probe.score_rows([])
            _crop(self.cache, cached)
            for b in appended:
                self.maps[b].null_last, self.maps[b].null_question = rows[b].last, rows[b].question
        if fresh:
            for b, maps in zip(fresh, self.prompt_maps(list(fresh.values())), strict=True):
                self.maps[b].null_last, self.maps[b].null_question = maps.last, maps.question

    def prompt_maps(self, prompts: list[StackedPrompt]) -> list[RowMaps]:
        """(last, question) maps of other prompts (one per row), prefilled as a batch of their own.

        Schemes that keep per-sequence state (Ms-PoE's head order) are re-seeded by that prefill: a method that
        reads other prompts must not also rely on such a scheme."""
        other = BatchRun(self.loaded, prompts, self.method_run, self.layers)
        with self.method_run.probe(other.probe):
            other.prefill()
        return [RowMaps(m.last, m.question) for m in other.maps]

    def reference_logprobs(
        self,
        first_logits: torch.Tensor,
        references: list[list[int] | None],
        mix: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> list[list[float] | None]:
        """log p(token | prompt, earlier tokens) of each reference token, per row: `first_logits` [B, vocab] score
        each first token, one forward the rest (appended after the prompt's columns; the cache is cropped back to
        the prompt first and after). With `mix`, the batch's rows are several instances per prompt (consecutive):
        `references` and `first_logits` are per prompt and `mix` takes the rows' logits to the prompts'."""
        return self.teacher_forced(first_logits, references, mix)[0]

    def teacher_forced(
        self,
        first_logits: torch.Tensor,
        references: list[list[int] | None],
        mix: Callable[[torch.Tensor], torch.Tensor] | None = None,
        read: bool = False,
    ) -> tuple[list[list[float] | None], list[list[float] | None]]:
        """`reference_logprobs` and, per reference token, the top-1 minus top-2 log-probability where it was
        scored (the margin a generated token records). `read`: the probe also records the fed tokens' attention
        as an answer's own (their passage and segment mass; take it with `probe.take`/`take_answer_spans`
        before the next pass), so a given answer is cited from this one forward as a generated one is."""
        count = len(self.prompts) // len(references)
        prompt_refs, references = references, [r for r in references for _ in range(count)]
        self.crop(self.width)
        self.probe.score_rows([])
        first = torch.log_softmax(first_logits.float(), dim=-1)
        first_top = first.topk(2, dim=-1).values
        first_margins = (first_top[:, 0] - first_top[:, 1]).tolist()
        logprobs: list[list[float] | None] = [
            None if ids is None else [float(first[b, ids[0]])] for b, ids in enumerate(prompt_refs)
        ]
        margins: list[list[float] | None] = [
            None if ids is None else [first_margins[b]] for b, ids in enumerate(prompt_refs)
        ]
        width = max((len(ids) - 1 for ids in references if ids is not None), default=0)
        if width <= 0:
            return logprobs, margins
        # Each reference but its last token, left-aligned: it continues the prompt's last column.
        fed = [ref[:-1] if ref is not None else [] for ref in references]
        starts = [p.num_tokens for p in self.prompts]
        ids, positions, block_valid = padded_block(fed, starts, self.pad_id, right_aligned=False)
        key_valid = torch.cat([self.key_valid[:, : self.width], block_valid.to(self.device)], dim=1)
        if read:  # left-aligned: chunk row i is each reference's token i (rows past a shorter one are not read)
            self.probe.score_rows(list(range(width)), answer=True)
        logits = self.forward(ids.to(self.device), positions.to(self.device), key_valid, keep=width)
        self.probe.score_rows([])
        if mix is not None:
            logits = mix(logits)
        scores = torch.log_softmax(logits.float(), dim=-1)
        top = scores.topk(2, dim=-1).values
        gaps = top[..., 0] - top[..., 1]
        for b, ref in enumerate(prompt_refs):
            if ref is not None and len(ref) > 1:
                rows = torch.arange(len(ref) - 1, device=scores.device)
                logprobs[b] += scores[b, rows, torch.tensor(ref[1:], device=scores.device)].tolist()
                margins[b] += gaps[b, : len(ref) - 1].tolist()
        _crop(self.cache, self.width)
        return logprobs, margins
