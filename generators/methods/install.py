"""The public way to run a loaded model with a method: install its per-layer parts for one block of code.

    parts = build_parts(method_config("ms-poe"), loaded)        # generators.methods.registry
    with method_context(loaded, parts, probe=probe) as run:
        logits = loaded.model(input_ids=ids).logits              # grads flow: no inference_mode here
        loss = nll + run.aux_loss()                              # training terms the schemes collected

Training loops, benchmarks and `Generator` all go through this context; on exit every layer is back to
the identity (plain RoPE, no delta, no probe), so the shared model is the stock model between calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from midlens.generators.attention.delta import WeightDelta
from midlens.generators.attention.evidence import EvidenceMaps, RowMaps
from midlens.generators.attention.positional_attention import PositionalAttention, install_positional_attention
from midlens.generators.attention.rope import RotaryScheme
from midlens.generators.models.prompt import StackedPrompt


@dataclass(frozen=True)
class AnsweringView:
    """What an answering hook sees of the batch it adapts: the prompts and where their passages sit, the
    prefill's evidence maps, per-row scratch state of its own, and the extra passes it may run.

    `column_spans[b]` are row b's passage key columns in the left-padded batch (`width` columns of prompt);
    `scratch[b]` is the hook's own state for row b (returned with the answer as `Answer.method_state`);
    `content_free_maps()` fills every row's `null_last` / `null_question` (once per batch; later calls are free);
    `prompt_maps(prompts)` reads the (last, question) maps of other prompts, one per row, in a pass of their own.
    """

    prompts: list[StackedPrompt]
    column_spans: list[list[tuple[int, int]]]
    width: int
    device: torch.device
    tokenizer: Any
    maps: list[EvidenceMaps]
    scratch: list[dict[str, Any]]
    timings: dict[str, float]
    content_free_maps: Callable[[], None]
    prompt_maps: Callable[[list[StackedPrompt]], list[RowMaps]]


class AnsweringHook(Protocol):
    """What a method does around answering beyond its per-layer schemes: the one seam for a method that adapts
    attention to the prompt's own evidence (attn-calibration), as transformers' AttentionInterface is for kernels.

    `layers` are the layers whose evidence maps the hook reads (the probe keeps them). Called with the batch's
    `AnsweringView` after the prefill has filled its maps, it returns a context the generator holds while the
    last prompt token is read again and the answer is decoded."""

    layers: tuple[int, ...]

    def __call__(self, view: AnsweringView) -> AbstractContextManager: ...


@dataclass(frozen=True)
class Instances:
    """Each prompt answered by `count` instances of the model at once, their next-token logits mixed per step
    (Attention Buckets). The instances are consecutive batch rows: row b * count + i is instance i of prompt b,
    so a scheme tells them apart by row index (`row % count`). `mix` takes the rows' logits [B, count, ..., V]
    to one prompt's logits [B, ..., V] and the instances' weights [B, count, ...] (summing to 1 over count),
    which the evidence of the mixture is read with."""

    count: int
    mix: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class MethodParts:
    """What a method puts into the one attention module: a scheme per layer, an optional weight delta, an
    optional hook around answering, and optionally several instances per prompt whose logits are mixed."""

    schemes: list[RotaryScheme]
    delta: WeightDelta | None = None
    answering: AnsweringHook | None = None
    instances: Instances | None = None

    @property
    def rows_per_prompt(self) -> int:
        """How many batch rows each prompt takes: its instances, or one."""
        return 1 if self.instances is None else self.instances.count

    def trainable(self) -> list[nn.Parameter]:
        """The parameters a method may learn (routers, delta factors); the model's own are not among them."""
        params = [p for s in self.schemes for p in s.parameters()]
        if self.delta is not None:
            params += list(self.delta.parameters())
        return params


@dataclass
class MethodRun:
    modules: list[PositionalAttention]
    parts: MethodParts

    def aux_loss(self) -> torch.Tensor | None:
        """Sum over layers of the schemes' auxiliary losses from the last forward (None when none has one)."""
        losses = [loss for s in self.parts.schemes if (loss := s.aux_loss()) is not None]
        return torch.stack(losses).sum() if losses else None

    @contextmanager
    def probe(self, probe) -> Iterator[None]:
        """Another probe on every layer for a block (a pass over other prompts), the current one restored after."""
        previous = [attn.probe for attn in self.modules]
        for attn in self.modules:
            attn.__dict__["probe"] = probe
        try:
            yield
        finally:
            for attn, old in zip(self.modules, previous, strict=True):
                attn.__dict__["probe"] = old


@contextmanager
def method_context(model, parts: MethodParts | None = None, probe=None) -> Iterator[MethodRun]:
    """Install `parts` (None = baseline) and `probe` on every layer of `model` (an nn.Module or a LoadedModel,
    whose lock is held so methods sharing it take turns)."""
    lock = getattr(model, "lock", None)
    module = getattr(model, "model", model) if lock is not None else model
    # Normal tensors even when the first call comes under inference_mode (an answer before training, as mudaf's head
    # scoring is): the modules keep their buffers (an interleaved layer's channel order), and a buffer made as an
    # inference tensor cannot take part in a later forward that autograd records.
    with torch.inference_mode(False):
        modules = install_positional_attention(module)
    if parts is not None and len(parts.schemes) != len(modules):
        raise ValueError(f"method parts have {len(parts.schemes)} schemes for a model with {len(modules)} layers.")
    if lock is not None:
        lock.acquire()
    try:
        for i, attn in enumerate(modules):
            attn.use(None if parts is None else parts.schemes[i], None if parts is None else parts.delta, probe)
        yield MethodRun(modules, parts or MethodParts([m.base_scheme for m in modules]))
    finally:
        for attn in modules:
            attn.use()
        if lock is not None:
            lock.release()
