"""Ms-PoE (Zhang et al., ICML 2024): per-head position rescaling, chosen by position awareness.

Each head of a patched layer reads positions divided by a ratio r_h in [ratio_min, ratio_max]
(paper Eq. 2: a linear ladder that includes both ends). Heads that are most position-aware at the
last prompt query (Eq. 1: share of keys with attention >= alpha / L) get the smallest ratios. The order
is computed once per prompt at prefill, from pre-RoPE q and K, and frozen for decoding.

Differences from the official code, on purpose (each fixes a bug there):
  - ratios go to heads by the RANK of their score (inverse permutation), not by gathering with the
    argsort, which hands heads the wrong ratio;
  - GQA: `gqa="group"` (default) gives one ratio per kv group, groups ranked by their mean score, so
    q and k of a group share a ratio; `gqa="per_query_head"` rotates keys per query head instead
    (keys are cached expanded to every query head). Both keep q.k a function of (m - n) / r.
"""

from __future__ import annotations

from typing import Literal

import torch

from midlens.core.errors import MethodConfigError
from midlens.generators.attention.anatomy import layer_ropes, rope_scope, shared_rope_problem
from midlens.generators.attention.arithmetic import attention_probs, expand_heads
from midlens.generators.attention.rope import LayerRope, RotaryScheme, apply_rotary, layer_inv_freq, scaled_tables
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method

HeadOrder = Literal["awareness", "sequential", "fixed"]
GQAMode = Literal["group", "per_query_head"]

DEFAULTS = {
    "ratio_min": 1.2,
    "ratio_max": 1.8,
    "layers": None,  # None = layer 2 to the last, as the official `apply_layers`
    "head_order": "awareness",
    "gqa": "group",
    "alpha": 3.0,
    "head_ranks": None,
}
# `midlens bench`: the specs timed against the baseline.
BENCH_VARIANTS = ("ms-poe",)
BENCH_TOKENS = (2048, 4096)  # its cost grows with the prompt


def ratio_ladder(n: int, ratio_min: float, ratio_max: float) -> torch.Tensor:
    """Paper Eq. 2: n ratios from ratio_min to ratio_max inclusive."""
    if n == 1:
        return torch.tensor([ratio_min])
    return torch.linspace(ratio_min, ratio_max, n)


def position_awareness(
    q: torch.Tensor, k: torch.Tensor, alpha: float = 3.0, key_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Eq. 1 per query head, from the last query row only: [B, H, L, d], [B, G, L, d] -> [B, H].

    The last query sees every key of its row, so only one row of the attention is built; `key_mask` [B, L]
    (False = padding of a left-padded batch) leaves a row's padding out of the softmax and out of its length L.
    """
    last = q[:, :, -1:]  # [B, H, 1, d]
    visible = None if key_mask is None else key_mask[:, None, None, :]
    probs = attention_probs(last, k, visible, q.shape[-1] ** -0.5)[:, :, 0]  # [B, H, L]
    if key_mask is None:
        return (probs >= alpha / k.shape[2]).float().mean(-1)
    length = key_mask.sum(-1, keepdim=True).float()  # [B, 1]
    return ((probs >= alpha / length[..., None]) & key_mask[:, None, :]).float().sum(-1) / length


def ranks_descending(scores: torch.Tensor) -> torch.Tensor:
    """Rank of each entry along the last axis, 0 = highest score (the inverse permutation of argsort)."""
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    return torch.argsort(order, dim=-1)


class MsPoEScheme(RotaryScheme):
    def __init__(
        self,
        inv_freq: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        ratio_min: float = 1.2,
        ratio_max: float = 1.8,
        head_order: HeadOrder = "awareness",
        gqa: GQAMode = "group",
        alpha: float = 3.0,
        head_ranks: list[int] | None = None,
        rope: LayerRope | None = None,
    ):
        super().__init__(inv_freq, num_heads, num_kv_heads, rope)
        self.gqa = gqa
        self.head_order = head_order
        self.alpha = alpha
        units = num_kv_heads if gqa == "group" else num_heads
        self.register_buffer("ladder", ratio_ladder(units, ratio_min, ratio_max).to(inv_freq.device), persistent=False)
        if head_order == "fixed":
            self.fixed_ranks = torch.tensor(head_ranks, dtype=torch.long, device=inv_freq.device)
        elif head_order == "sequential":
            self.fixed_ranks = torch.arange(units, device=inv_freq.device)
        else:
            self.fixed_ranks = None
        self.last_scores: torch.Tensor | None = None
        self._set_ratios(self.ladder[None] if self.fixed_ranks is None else self.ladder[self.fixed_ranks][None])

    def _set_ratios(self, ratios: torch.Tensor) -> None:
        """Ratios of the current sequence per unit, [B, units]. Unit ratios everywhere are the identity case,
        known once per sequence so `rotate` then uses the model's own tables."""
        self.ratios = ratios
        self._unit = bool((ratios == 1).all())

    @property
    def key_heads(self) -> int:
        return self.num_kv_heads if self.gqa == "group" else self.num_heads

    def start_sequence(self, q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None = None) -> None:
        if self.fixed_ranks is not None:
            self._set_ratios(self.ladder[self.fixed_ranks][None].expand(q.shape[0], -1))
            return
        scores = position_awareness(q, k, self.alpha, key_mask)  # [B, H]
        if self.gqa == "group":
            scores = scores.view(q.shape[0], self.num_kv_heads, -1).mean(-1)
        self.last_scores = scores
        self._set_ratios(self.ladder[ranks_descending(scores)])

    def head_ratios(self) -> torch.Tensor:
        """Ratio seen by each query head, [B, H]."""
        if self.gqa == "group":
            return self.ratios.repeat_interleave(self.num_heads // self.num_kv_heads, dim=-1)
        return self.ratios

    def rotate(self, q, k, positions, position_embeddings):
        if self._unit and position_embeddings is not None:  # every ratio 1: the model's own tables, bit for bit
            q_rot, k_rot = super().rotate(q, k, positions, position_embeddings)
            return q_rot, (expand_heads(k_rot[0], self.num_heads)[None] if self.gqa == "per_query_head" else k_rot)
        # Dividing positions by r is dividing the layer's own (possibly scaled) frequencies by r; the layer's
        # attention scaling (YaRN, LongRoPE) multiplies the tables as in the model's rotary embedding.
        inv_freq, scaling = self.frequencies()
        freqs = inv_freq.to(q.device) / self.ratios.to(q.device)[..., None]  # [B, units, d/2]
        cos, sin = scaled_tables(positions, freqs, scaling, q.dtype)  # [B, units, L, d]
        if self.gqa == "per_query_head":  # every query head gets its own rotated copy of its group's keys
            return apply_rotary(q, cos, sin)[None], apply_rotary(expand_heads(k, self.num_heads), cos, sin)[None]
        # One ratio per kv group: view q as [B, G, heads per group, L, d] so the group's table broadcasts.
        b, heads, length, d = q.shape
        groups = self.num_kv_heads
        q_rot = apply_rotary(q.view(b, groups, heads // groups, length, d), cos[:, :, None], sin[:, :, None])
        return q_rot.view(b, heads, length, d)[None], apply_rotary(k, cos, sin)[None]


def check_options(opts: dict) -> None:
    """Option checks that need no model (run before anything loads)."""
    lo, hi = opts["ratio_min"], opts["ratio_max"]
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float))) or lo <= 0 or hi <= 0:
        raise MethodConfigError(f"ms-poe ratios must be positive numbers, got ratio_min={lo}, ratio_max={hi}.")
    if lo > hi:
        raise MethodConfigError(f"ms-poe ratio_min={lo} is larger than ratio_max={hi}; swap them.")
    if opts["head_order"] not in ("awareness", "sequential", "fixed"):
        raise MethodConfigError(f"ms-poe head_order={opts['head_order']!r}: expected awareness, sequential or fixed.")
    if opts["gqa"] not in ("group", "per_query_head"):
        raise MethodConfigError(f"ms-poe gqa={opts['gqa']!r}: expected group or per_query_head.")
    if opts["head_order"] == "fixed" and opts["head_ranks"] is None:
        raise MethodConfigError(
            "ms-poe head_order='fixed' needs head_ranks: the rank (0 = smallest ratio) of each head."
        )
    layers = opts["layers"]
    if layers is not None and not (isinstance(layers, (list, tuple)) and all(isinstance(i, int) for i in layers)):
        raise MethodConfigError(f"ms-poe layers={layers!r}: expected a list of layer indices, e.g. [2, 3, 4].")


def build(loaded, opts: dict) -> MethodParts:
    """Ms-PoE schemes on the chosen layers, plain RoPE elsewhere (checks that need the model's shape)."""
    cfg = loaded.model.config
    num_layers, heads, kv_heads = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    layers = opts["layers"] if opts["layers"] is not None else list(range(2, num_layers))
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise MethodConfigError(f"ms-poe layers {bad} out of range: this model has layers 0..{num_layers - 1}.")
    ranks = opts["head_ranks"]
    if ranks is not None:
        units = kv_heads if opts["gqa"] == "group" else heads
        if sorted(ranks) != list(range(units)):
            raise MethodConfigError(
                f"ms-poe head_ranks={ranks} must be a permutation of 0..{units - 1} "
                f"(one rank per {'kv group' if opts['gqa'] == 'group' else 'query head'})."
            )
    ropes = layer_ropes(loaded.model)
    schemes: list[RotaryScheme] = []
    for i, rope in enumerate(ropes):
        inv_freq = layer_inv_freq(loaded.model, i)
        if i in layers and rope is not None:  # a NoPE layer is left as it is
            schemes.append(
                MsPoEScheme(
                    inv_freq,
                    heads,
                    kv_heads,
                    ratio_min=float(opts["ratio_min"]),
                    ratio_max=float(opts["ratio_max"]),
                    head_order=opts["head_order"],
                    gqa=opts["gqa"],
                    alpha=float(opts["alpha"]),
                    head_ranks=ranks,
                    rope=rope,
                )
            )
        else:
            schemes.append(RotaryScheme(inv_freq, heads, kv_heads, rope))
    return MethodParts(schemes)


METHOD = Method(
    "ms-poe",
    "training-free per-head position rescaling (Zhang et al. 2024)",
    build=build,
    unsupported=shared_rope_problem,
    scope=rope_scope,
    defaults=DEFAULTS,
    check=check_options,
    bench_variants=BENCH_VARIANTS,
    bench_tokens=BENCH_TOKENS,
)
