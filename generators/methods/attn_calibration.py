"""Calibrated attention (after Hsieh et al. 2024, "Found in the Middle", arXiv 2406.16008): while the answer is
written, each passage's share of attention is moved toward its relevance with the positional bias removed.

After the prefill the generator hands over the evidence maps (per layer, head and passage: the attention
mass of the question's tokens, and of a content-free question "N/A" over the same cached passages). Per
calibrated (layer, head):
    relevance_p = (m_p - n_p) / temperature              m: question mass, n: content-free mass
    target_p    = M * softmax(relevance)_p               M = sum_p m_p, the passages' total share
    b_p         = strength * log(target_p / m_p) + c     c keeps sum_p m_p e^{b_p} = M
and b_p is added to the attention logits of every key of passage p for the answer's queries (the last prompt
token's and every generated token's), through SDPA's mask. For the rows the maps were read from, passage
mass becomes target (strength 1) and the total on passages is unchanged; strength 0 is the baseline.

Two estimates of the positional bias n (option `calibration`):
    content-free  the content-free question "N/A" on the prompt's own passages (no extra prefill: it reuses
                  the cached passages); relevance = (m_p - n_p) / temperature, raw masses.
    dummy         the paper's estimate: the attention a dummy document gets in each slot. One extra prefill of
                  the prompt with every passage line replaced by filler of the same token length under a blank
                  title (every slot at once, where the paper moves one dummy through the slots), same
                  question; relevance = (m_p / M - n_p / N) / temperature, shares, since a prompt of filler
                  draws a different total onto its passages.
Relevance comes from the maps the evidence already reads.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

from midlens.core.errors import MethodConfigError
from midlens.core.passage import Passage
from midlens.generators.attention.evidence import EvidenceMaps
from midlens.generators.attention.rope import RotaryScheme, baseline_schemes
from midlens.generators.methods.install import AnsweringView, MethodParts
from midlens.generators.methods.method import Method
from midlens.generators.models.prompt import StackedPrompt, render, render_document

DEFAULTS = {
    # Half-way to the calibrated shares: chosen on train-split tuning slices, where it beat strength 1.0 in gold-answer
    # log-probability on both models; full strength starves a gold passage in the first slot (docs/results/README.md).
    "strength": 0.5,
    "temperature": 0.05,
    "layers": "upper",
    "query": "question",
    "heads": "all",
    "calibration": "content-free",
}
# `midlens bench`: the specs timed against the baseline.
BENCH_VARIANTS = ("attn-calibration", "attn-calibration(calibration='dummy')")
CALIBRATIONS = ("content-free", "dummy")
# Filler with no entity, number or answer in it; repeated to each passage's token length.
DUMMY_TEXT = "This document is intentionally left blank and says nothing about any subject."


def check_options(opts: dict) -> None:
    if not isinstance(opts["strength"], (int, float)) or opts["strength"] < 0:
        raise MethodConfigError(f"attn-calibration strength={opts['strength']!r}: a number >= 0 (0 = baseline).")
    if not isinstance(opts["temperature"], (int, float)) or opts["temperature"] <= 0:
        raise MethodConfigError(f"attn-calibration temperature={opts['temperature']!r}: a number > 0.")
    layers = opts["layers"]
    if layers not in ("all", "upper", "lower") and not (
        isinstance(layers, list | tuple) and layers and all(isinstance(i, int) for i in layers)
    ):
        raise MethodConfigError(f"attn-calibration layers={layers!r}: all, upper, lower or a list of layer indices.")
    if opts["query"] not in ("question", "last"):
        raise MethodConfigError(f"attn-calibration query={opts['query']!r}: question or last.")
    if opts["heads"] not in ("all", "retrieval"):
        raise MethodConfigError(f"attn-calibration heads={opts['heads']!r}: all or retrieval.")
    if opts["calibration"] not in CALIBRATIONS:
        raise MethodConfigError(
            f"attn-calibration calibration={opts['calibration']!r}: one of {', '.join(CALIBRATIONS)}."
        )


def dummy_prompt(tokenizer, prompt: StackedPrompt) -> StackedPrompt:
    """The prompt with each passage replaced by filler of the same token count under a blank title: what
    attention each slot draws by its position alone (the paper's dummy document, in every slot at once)."""
    # With its leading space, the unit tokenizes the same repeated as alone, so n ids stay n tokens.
    filler_ids = tokenizer(" " + DUMMY_TEXT, add_special_tokens=False)["input_ids"]
    dummies = []
    for i, (p, (start, end)) in enumerate(zip(prompt.passages, prompt.passage_spans, strict=True), start=1):
        # The slot's whole line (title included) is filled, so every later slot starts where it did.
        frame = len(tokenizer(render_document(i, Passage(text="", title="")), add_special_tokens=False)["input_ids"])
        n = max(end - start - frame, 1)
        ids = (filler_ids * (n // len(filler_ids) + 1))[:n]
        dummies.append(Passage(text=tokenizer.decode(ids).strip(), title="", id=p.id))
    return render(tokenizer, dummies, prompt.question, prompt.style)


def passage_offsets(
    mass: torch.Tensor, null: torch.Tensor, strength: float, temperature: float, shares: bool = False
) -> torch.Tensor:
    """[..., P] question and bias passage masses -> [..., P] logit offsets (see the module doc); `shares`
    compares each to its own total (the dummy-document estimate)."""
    mass = mass.double().clamp_min(1e-12)
    total = mass.sum(-1, keepdim=True)
    null = null.double()
    if shares:
        relevance = mass / total - null / null.sum(-1, keepdim=True).clamp_min(1e-12)
    else:
        relevance = mass - null
    target = total * torch.softmax(relevance / temperature, dim=-1)
    b = strength * (target.log() - mass.log())
    b = b + total.log() - torch.logsumexp(mass.log() + b, dim=-1, keepdim=True)  # total passage mass kept
    return b.float()


class CalibratedScheme(RotaryScheme):
    """Plain RoPE plus a per-(row, head, passage) key bias for the queries from column `start` on, while one is
    set."""

    def __init__(self, inv_freq: torch.Tensor, num_heads: int, num_kv_heads: int):
        super().__init__(inv_freq, num_heads, num_kv_heads)
        self.bias: torch.Tensor | None = None  # [B, H, T_prompt] logits over the prompt's key columns
        self.start = 0

    def set_bias(self, bias: torch.Tensor | None, start: int = 0) -> None:
        self.bias, self.start = bias, start

    def key_bias(self, past: int, length: int, total: int) -> torch.Tensor | None:
        if self.bias is None:
            return None
        batch, heads, width = self.bias.shape
        keys = torch.zeros(batch, heads, total, device=self.bias.device)
        keys[..., : min(total, width)] = self.bias[..., : min(total, width)]
        rows = (torch.arange(past, past + length, device=keys.device) >= self.start).float()  # answer queries only
        return rows[None, None, :, None] * keys[:, :, None, :]  # [B, H, length, total]


class Calibration:
    """The answering hook (generators.methods.install.AnsweringHook): reads the content-free (or dummy-prompt) maps
    through the batch run, then holds each calibrated layer's key bias while the answer is written."""

    def __init__(self, schemes, chosen, head_mask, strength, temperature, query, dummy):
        self.schemes, self.layers, self.head_mask = schemes, tuple(chosen), head_mask
        self.strength, self.temperature, self.query, self.dummy = strength, temperature, query, dummy

    def __call__(self, view: AnsweringView) -> AbstractContextManager:
        if self.dummy:
            prompts = [p for p in view.prompts if p.passages]
            if prompts:
                t0 = time.perf_counter()
                maps = iter(view.prompt_maps([dummy_prompt(view.tokenizer, p) for p in prompts]))
                for state, prompt in zip(view.scratch, view.prompts, strict=True):
                    if prompt.passages:
                        m = next(maps)
                        state["bias_last"], state["bias_question"] = m.last, m.question
                view.timings["bias_s"] = time.perf_counter() - t0
        else:
            view.content_free_maps()
        return self.applied(view.maps, view.column_spans, view.width, view.width - 1, view.device, view.scratch)

    @contextmanager
    def applied(
        self,
        maps: list[EvidenceMaps],
        spans: list[list[tuple[int, int]]],
        width: int,
        start: int,
        device: torch.device,
        scratch: list[dict] | None = None,
    ) -> Iterator[None]:
        """Each calibrated layer's bias [B, H, width] from every row's maps (and, with the dummy calibration, the
        bias maps in its `scratch`) and passage key columns, for the queries from column `start` on; cleared on
        exit. A row without passages or bias maps gets none."""
        biases = {i: torch.zeros(len(maps), self.head_mask.shape[1], width) for i in self.layers}
        scratch = scratch if scratch is not None else [{} for _ in maps]
        for b, (row, row_spans) in enumerate(zip(maps, spans, strict=True)):
            mass = row.question if self.query == "question" else row.last
            if self.dummy:
                null = scratch[b].get("bias_question" if self.query == "question" else "bias_last")
            else:
                null = row.null_question if self.query == "question" else row.null_last
            if null is None or not row_spans:
                continue
            offsets = passage_offsets(mass, null, self.strength, self.temperature, shares=self.dummy)  # [L, H, P]
            keys = torch.zeros(len(row_spans), width)  # passage -> its key columns
            for p, (s, e) in enumerate(row_spans):
                keys[p, s:e] = 1.0
            for i in self.layers:
                per_head = torch.where(self.head_mask[i][:, None], offsets[i], torch.zeros_like(offsets[i]))
                biases[i][b] = per_head @ keys
        try:
            for i in self.layers:
                self.schemes[i].set_bias(biases[i].to(device), start=start)
            yield
        finally:
            for i in self.layers:
                self.schemes[i].set_bias(None)


def build(loaded, opts: dict) -> MethodParts:
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.generators.methods.retrieval_heads import retrieval_heads

    model = loaded.model
    if float(opts["strength"]) == 0:  # exactly the baseline: no early calibration pass, no bias
        return MethodParts(baseline_schemes(model))
    cfg = model.config
    num_layers = cfg.num_hidden_layers
    layers = EvidenceConfig(layers=opts["layers"] if isinstance(opts["layers"], str) else list(opts["layers"]))
    try:
        chosen = layers.layer_indices(num_layers)
    except ValueError as err:
        raise MethodConfigError(f"attn-calibration layers: {err}") from None
    head_mask = torch.ones(num_layers, cfg.num_attention_heads, dtype=torch.bool)
    if opts["heads"] == "retrieval":
        head_mask[:] = False
        for layer, head in retrieval_heads(loaded):
            head_mask[layer, head] = True
        chosen = [i for i in chosen if head_mask[i].any()]
    schemes = baseline_schemes(model)
    for i in chosen:  # each layer keeps its own frequencies (Gemma 3's local and global bases)
        schemes[i] = CalibratedScheme(schemes[i].inv_freq, cfg.num_attention_heads, cfg.num_key_value_heads)
    hook = Calibration(
        schemes,
        chosen,
        head_mask,
        float(opts["strength"]),
        float(opts["temperature"]),
        opts["query"],
        opts["calibration"] == "dummy",
    )
    return MethodParts(schemes, answering=hook)


METHOD = Method(
    "attn-calibration",
    "training-free: answer-time attention moved toward position-calibrated relevance (Hsieh et al. 2024)",
    build=build,
    defaults=DEFAULTS,
    check=check_options,
    bench_variants=BENCH_VARIANTS,
)
