"""Which prompts may share a batch on a model whose RoPE tables depend on how far the positions reach.

LongRoPE (Phi-3, Phi-4-mini) rotates with its short factors while a forward's largest position is below the
original context length and with its long factors from there on; dynamic NTK rescales its base once positions
pass it. transformers picks the table per forward from the largest position of the whole batch, so a short row
batched beside a long one is rotated with the long factors it would never use alone (a 167-token Phi-3 prompt
beside a 486-token one: log-probability 1.97 off). Alone, a row is rotated as transformers rotates it alone: each
forward picks from that row's own largest position, so a row that decodes across the switch keeps the keys it
cached with the short factors and rotates the later ones with the long factors.

A batch therefore holds only rows whose every forward (prefill, decode steps, the reference answer's and the
content-free question's passes) falls on the same side of every switch: rows that stay below it, or rows that
stay at or beyond it (LongRoPE only: dynamic NTK's base keeps growing with the length, so no two rows beyond it
share a table). A row whose forwards straddle a switch runs alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from midlens.generators.attention.anatomy import decoder_of

# A row's forwards, by where their largest positions lie against one switch.
BELOW, BEYOND, ACROSS = "below", "beyond", "across"


@dataclass(frozen=True)
class Switch:
    """Forwards whose largest position is `at` or more rotate with other tables than those below it; `shared`:
    every such forward uses one table (LongRoPE's long factors), not one per length (dynamic NTK)."""

    at: int
    shared: bool


def rope_switches(model: nn.Module) -> list[Switch]:
    """The length switches of `model`'s RoPE (one per layer type that has one); empty when its tables are fixed."""
    rotary_emb = getattr(decoder_of(model), "rotary_emb", None)
    if rotary_emb is None:
        return []
    kinds = getattr(rotary_emb, "rope_type", "default")
    params = getattr(model.config, "rope_parameters", None) or {}
    per_type = kinds if isinstance(kinds, dict) else {None: kinds}
    switches = set()
    for layer_type, kind in per_type.items():
        own = params.get(layer_type, {}) if layer_type is not None else params
        if kind == "longrope":
            switches.add(Switch(int(own["original_max_position_embeddings"]), shared=True))
        elif "dynamic" in str(kind):
            switches.add(Switch(int(rotary_emb.original_max_seq_len), shared=False))
    return sorted(switches, key=lambda s: s.at)


@dataclass(frozen=True)
class RowReach:
    """The largest positions of one row's forwards: the lowest and the highest of them."""

    lowest: int
    highest: int


def row_reach(
    prompt_tokens: int, max_new_tokens: int, reference_tokens: int = 0, null_prompt_tokens: int | None = None
) -> RowReach:
    """Where a row's forwards reach: the prefill's last position, decode steps' (each generated token but the last
    is fed back, one position further), the reference answer's pass (all its tokens but the last, after the
    prompt) and the content-free prompt's (`null_prompt_tokens`, None when it does not run)."""
    last = prompt_tokens - 1
    reaches = [last, last + max(0, max_new_tokens - 1), last + max(0, reference_tokens - 1)]
    lowest = last if null_prompt_tokens is None else min(last, null_prompt_tokens - 1)
    if null_prompt_tokens is not None:
        reaches.append(null_prompt_tokens - 1)
    return RowReach(lowest, max(reaches))


def side(reach: RowReach, switch: Switch) -> str:
    if reach.highest < switch.at:
        return BELOW
    if reach.lowest >= switch.at and switch.shared:
        return BEYOND
    return ACROSS


def regime_groups(reaches: Sequence[RowReach], switches: Sequence[Switch]) -> list[list[int]]:
    """Row indices in batches that each rotate as every row alone would: rows on the same side of every switch
    together (in their given order), each row that straddles one (or, for dynamic NTK, passes it) by itself."""
    if not switches:
        return [list(range(len(reaches)))] if reaches else []
    groups: dict[tuple[str, ...], list[int]] = {}
    alone: list[list[int]] = []
    for i, reach in enumerate(reaches):
        key = tuple(side(reach, s) for s in switches)
        if ACROSS in key:
            alone.append([i])
        else:
            groups.setdefault(key, []).append(i)
    return sorted([*groups.values(), *alone], key=lambda g: g[0])
