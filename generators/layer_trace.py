"""What a stock attention layer's forward applies, and in which order, observed on a one-token input.

Attributes say what a layer holds; only its forward says what it applies. EXAONE 4 and Cohere 2 hold the rotary
tables on every layer but rotate only on their windowed ones; HunYuan normalises q and k after RoPE where Qwen3
does before; Gemma 3n normalises v too. `trace_attention` runs the stock module once (on the meta device for a
skeleton, so no weight is read) and records which of its submodules ran, on what shape, and whether their input had
been through the rotary tables: every tensor computed from cos or sin is marked, through a `TorchFunctionMode` that
sees each torch operation the forward makes (a mode is local to this thread: nothing global is patched).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    try:
        with torch.no_grad(), mode:
            attn(
                hidden_states=hidden,
                position_embeddings=(cos, sin),
                attention_mask=None,
                past_key_values=None,
                position_ids=positions,
            )
    finally:
        for handle in handles:
            handle.remove()
    return AttentionTrace(rotates=mode.used, calls=tuple(calls))
