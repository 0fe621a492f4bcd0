"""What a stock attention layer's forward applies, and in which order, observed on a one-token input.

Attributes say what a layer holds; only its forward says what it applies. EXAONE 4 and Cohere 2 hold the rotary
tables on every layer but rotate only on their windowed ones; HunYuan normalises q and k after RoPE where Qwen3
does before; Gemma 3n normalises v too. `trace_attention` runs the stock module once (on the meta device for a
skeleton, so no weight is read) and records which of its submodules ran, on what shape, and whether their input had
been through the rotary tables: every tensor computed from cos or sin is marked, through a `TorchFunctionMode` that
sees each torch operation the forward makes (a mode is local to this thread: nothing global is patched). What the
forward hands transformers' attention function (a soft-cap Gemma 2 passes and Gemma 3 does not, though both configs
carry the field) is recorded by running it through a copy of the module whose config names a recording function.
"""

from __future__ import annotations

import copy
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class SubmoduleCall:
    name: str  # the attribute the attention module holds it under (q_proj, q_norm, query_layernorm, ...)
    input_shape: tuple[int, ...]
    after_rope: bool  # its input was computed from the rotary tables


@dataclass(frozen=True)
class AttentionTrace:
    rotates: bool  # some operation used the rotary tables (False: a NoPE layer, whatever it holds)
    calls: tuple[SubmoduleCall, ...]  # the module's direct children, in the order they ran
    # The keywords the forward passed transformers' attention function (softcap, scaling, sliding_window...); None
    # when it computed attention without calling one, so that nothing can be read from what it passed.
    attention_kwargs: dict[str, Any] | None = None


class _RopeTaint(TorchFunctionMode):
    """Marks every tensor an operation computed from a marked one; the rotary tables are marked first."""

    def __init__(self, sources: tuple[torch.Tensor, ...]):
        super().__init__()
        # References are kept so that a freed tensor's id cannot be reused by an unmarked one.
        self.kept = list(sources)
        self.marked = {id(t) for t in sources}
        self.used = False

    def is_marked(self, value) -> bool:
        return any(isinstance(t, torch.Tensor) and id(t) in self.marked for t in tree_flatten(value)[0])

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.is_marked((args, kwargs)):
            self.used = True
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and id(t) not in self.marked:
                    self.marked.add(id(t))
                    self.kept.append(t)
        return out


# What the trace gives a layer's forward: an attention whose forward needs more is refused by name before it runs.
TRACED_INPUTS = frozenset({"hidden_states", "position_embeddings", "attention_mask", "past_key_values", "position_ids"})


# The attention function the traced copy's config names; it records only inside `trace_attention` (a ContextVar,
# so a trace in one thread never records another's calls).
TRACE_IMPLEMENTATION = "midlens_trace"
_ATTENTION_CALLS: ContextVar[list[dict[str, Any]] | None] = ContextVar("midlens_attention_calls", default=None)


def _recording_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Records the keywords, then attends as eager attention would without a mask (the trace's one token sees only
    itself), so that marks from the rotary tables flow on to whatever the forward applies after attention."""
    calls = _ATTENTION_CALLS.get()
    if calls is not None:
        calls.append(dict(kwargs))
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=kwargs.get("scaling"))
    return out.transpose(1, 2).contiguous(), None


def _register_recording_attention() -> None:
    # A name added beside transformers' own implementations: no model picks it unless its config names it.
    from transformers import AttentionInterface

    AttentionInterface.register(TRACE_IMPLEMENTATION, _recording_attention)


def _recording_copy(attn: nn.Module) -> nn.Module:
    """`attn` sharing its parameters and submodules (their hooks fire), with a config of its own naming the
    recording function: the model's config, which its other layers and its mask building read, is not touched."""
    _register_recording_attention()
    clone = copy.copy(attn)
    config = copy.deepcopy(attn.config)
    config._attn_implementation = TRACE_IMPLEMENTATION
    clone.config = config
    return clone


def trace_attention(attn: nn.Module, rotary_dim: int) -> AttentionTrace:
    """Run `attn` (a stock decoder layer's self_attn) on one token with rotary tables over `rotary_dim` channels.

    Raises whatever the forward raises: the caller turns that into a refusal naming the module."""
    # A dynamically quantised layer (torch.ao int8 Linear) holds packed weights, no parameters: it computes in fp32.
    weight = next((t for t in (*attn.parameters(), *attn.buffers()) if t.is_floating_point()), None)
    device, dtype = (weight.device, weight.dtype) if weight is not None else (torch.device("cpu"), torch.float32)
    hidden = torch.zeros(1, 1, attn.config.hidden_size, device=device, dtype=dtype)
    cos = torch.ones(1, 1, rotary_dim, device=device, dtype=dtype)
    sin = torch.zeros(1, 1, rotary_dim, device=device, dtype=dtype)
    positions = torch.zeros(1, 1, dtype=torch.long, device=device)
    mode = _RopeTaint((cos, sin))
    calls: list[SubmoduleCall] = []

    def recorder(name: str):
        def hook(_module, args, kwargs):
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            shape = tuple(tensors[0].shape) if tensors else ()
            calls.append(SubmoduleCall(name, shape, mode.is_marked((args, kwargs))))

        return hook

    handles = [
        child.register_forward_pre_hook(recorder(name), with_kwargs=True) for name, child in attn.named_children()
    ]
    attention_calls: list[dict[str, Any]] = []
    token = _ATTENTION_CALLS.set(attention_calls)
    try:
        with torch.no_grad(), mode:
            _recording_copy(attn)(
                hidden_states=hidden,
                position_embeddings=(cos, sin),
                attention_mask=None,
                past_key_values=None,
                position_ids=positions,
            )
    finally:
        _ATTENTION_CALLS.reset(token)
        for handle in handles:
            handle.remove()
    kwargs = attention_calls[0] if attention_calls else None
    return AttentionTrace(rotates=mode.used, calls=tuple(calls), attention_kwargs=kwargs)
