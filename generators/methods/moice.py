"""MoICE (Lin et al. 2024): per token and head, a router mixes the attention of several RoPE bases.

    Generator("smollm2-135m", method="moice")              # the routers shipped for this model
    Generator(m, method="moice(top_k=1)")                  # fewer experts per token (cheaper, not retrained)
    Generator(m, method="moice(artefact='runs/moice-smollm2')")

Experts are RoPE bases: the model's native base first, then complementary bases chosen for this model's
head_dim and base by the Attention-Buckets waveform criterion (`rope_bases.complementary_bases`; the published set was
searched for Llama-2's head_dim 128 and base 1e4 and is never reused for another model). A router per layer
(option: per head) reads the PRE-RoPE query q of each head and scores the experts with
W3(SiLU(W1 q) * W2 q); the top-K scores are softmaxed into weights p_j and the layer's output is
sum_j p_j * SDPA_j (each expert its own softmax over keys rotated with its base). Keys sit in the KV cache
once per expert, already rotated. Evidence mixes the experts' attention rows with the same p_j (the probe
does this for any scheme with mixing weights). Training (routers only, the model frozen) is in
`training.moice`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from midlens.core.errors import MethodConfigError
from midlens.core.saved_parts import Artefact, SavedPart, Section
from midlens.generators.attention.anatomy import layer_ropes, plain_rope_problem, rope_scope
from midlens.generators.attention.arithmetic import Scoring, attend
from midlens.generators.attention.masks import mask_rows
from midlens.generators.attention.rope import LayerRope, RotaryScheme, apply_rotary, layer_inv_freq, scaled_tables
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method
from midlens.generators.methods.rope_bases import head_dim_of, rope_base

DEFAULTS = {"top_k": None, "artefact": None}  # top_k None: the K the routers were trained with
# `midlens bench`: the specs timed against the baseline (an expert runs only on the queries routed to it).
BENCH_VARIANTS = ("moice(top_k=1)", "moice(top_k=3)", "moice(top_k=7)")
# Where `midlens train moice` finds its recipe (the training layer, above this one).
TRAINER = "midlens.training.moice"


# ---- the scheme -----------------------------------------------------------------------------------------------


class Router(nn.Module):
    """W3(SiLU(W1 q) * W2 q) per layer (one set of weights for every head) or per head; no biases."""

    def __init__(self, head_dim: int, experts: int, heads: int = 1):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(heads, head_dim, experts))
        self.w2 = nn.Parameter(torch.empty(heads, head_dim, experts))
        self.w3 = nn.Parameter(torch.empty(heads, experts, experts))
        for w, fan_in in ((self.w1, head_dim), (self.w2, head_dim), (self.w3, experts)):
            nn.init.uniform_(w, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))  # nn.Linear's default range

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """q [B, H, L, d] -> expert logits [B, H, L, N] (fp32)."""
        q = q.float()
        gate = F.silu(torch.einsum("bhld,hdn->bhln", q, self.w1)) * torch.einsum("bhld,hdn->bhln", q, self.w2)
        return torch.einsum("bhln,hnm->bhlm", gate, self.w3)


class MoiceScheme(RotaryScheme):
    """N RoPE bases mixed per token and head by a router (or by fixed weights, for tests and ablations)."""

    def __init__(
        self,
        inv_freq: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        bases: list[float],
        top_k: int,
        per_head: bool = False,
        fixed_weights: torch.Tensor | None = None,
        rope: LayerRope | None = None,
        head_dim: int | None = None,
    ):
        """`bases`: this layer's, its native base first; `head_dim`: the router's input width, the whole head (None:
        the rotated channels, which are the whole head unless the rotary is partial)."""
        super().__init__(inv_freq, num_heads, num_kv_heads, rope)
        rotary_dim = 2 * inv_freq.shape[-1]
        if not 1 <= top_k <= len(bases):
            raise MethodConfigError(f"moice top_k={top_k}: must be between 1 and the {len(bases)} experts.")
        self.bases, self.top_k = [float(b) for b in bases], top_k
        self.num_experts = len(bases)
        steps = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
        others = None
        if len(bases) > 1:  # made where inv_freq lives (CUDA on a GPU), or the concatenation below fails
            others = torch.stack([b ** (-steps) for b in self.bases[1:]]).float().to(inv_freq.device)
        # Expert 0 is the model's own inv_freq (bit-identical to stock RoPE), the others are computed.
        table = inv_freq.float()[None] if others is None else torch.cat([inv_freq.float()[None], others])
        self.register_buffer("expert_inv_freq", table, persistent=False)
        # A scaled schedule (llama3, YaRN, LongRoPE...) may change per forward: its experts are rebased at rotate time.
        self.scaled = rope is not None and not rope.plain
        self.router = Router(head_dim or rotary_dim, self.num_experts, num_heads if per_head else 1)
        self.fixed_weights = fixed_weights
        self._aux: torch.Tensor | None = None
        self.last_usage: torch.Tensor | None = None  # [N] share of (token, head) routes per expert, last forward

    def rotate(self, q, k, positions, position_embeddings):
        q_out, k_out = [], []
        if self.scaled:  # the layer's current frequencies with each expert's base change, and its attention scaling
            inv_freq, scaling = self.frequencies()
            table = torch.cat([inv_freq.float()[None], self.rope.rebased(self.bases[1:])])
        else:
            table, scaling = self.expert_inv_freq, 1.0
        for e in range(self.num_experts):
            if e == 0 and position_embeddings is not None:
                cos, sin = position_embeddings
                cos, sin = cos[:, None], sin[:, None]
            else:
                cos, sin = scaled_tables(positions, table[e][None], scaling, q.dtype)
            q_out.append(apply_rotary(q, cos, sin))
            k_out.append(apply_rotary(k, cos, sin))
        return torch.stack(q_out), torch.stack(k_out)

    def mixing_weights(self, q: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, B, H, L, 1]: the top-K experts' softmaxed router scores, zero for the others."""
        if self.fixed_weights is not None:
            w = self.fixed_weights.to(q.device, torch.float32)
            self._aux, self.last_usage = None, (w > 0).float() / (w > 0).sum()
            return w.view(-1, 1, 1, 1, 1).expand(-1, *q.shape[:3], 1).to(q.dtype)
        logits = self.router(q)  # [B, H, L, N]
        top, index = logits.topk(self.top_k, dim=-1)
        weights = torch.zeros_like(logits).scatter(-1, index, torch.softmax(top, dim=-1))
        chosen = torch.zeros_like(logits).scatter(-1, index, 1.0).flatten(0, 2).mean(0) / self.top_k  # F_j
        probs = torch.softmax(logits, dim=-1).flatten(0, 2).mean(0)  # P_j: differentiable even where F_j is not
        # Switch-style balance N * sum_j F_j P_j (1 when balanced). With K = N, F_j = 1/N for every j and the
        # loss is the constant 1 with zero gradient (the official default's trap), hence K < N.
        self._aux = self.num_experts * (chosen * probs).sum()
        self.last_usage = chosen.detach()
        return weights.permute(3, 0, 1, 2)[..., None].to(q.dtype)

    def aux_loss(self) -> torch.Tensor | None:
        return self._aux

    def attend(self, q_rot, keys, values, weights, mask, past, scoring):
        """sum_j p_j * attention_j over the experts any query or head was routed to (one host sync per layer,
        not one per expert); at prefill an expert runs on its routed queries only where that is cheaper."""
        active = weights.flatten(1).ne(0).any(1).tolist()
        out = None
        for e, used in enumerate(active):
            if not used:
                continue
            o = routed_attention(q_rot[e], keys[:, e], values, weights[e], mask, past, scoring)
            if o is None:
                o = weights[e] * attend(q_rot[e], keys[:, e], values, mask, scoring)
            out = o if out is None else out + o
        return out


ROUTED_SHARE = 0.75  # an expert runs on its routed queries only when no head routes more than this share to it


def routed_attention(
    q: torch.Tensor,  # [B, H, L, d], rotated for this expert
    keys: torch.Tensor,  # [B, Hk, T, d]
    values: torch.Tensor,  # [B, Hk, T, d]
    weight: torch.Tensor,  # [B, H, L, 1], zero where a query was not routed to this expert
    mask: torch.Tensor | None,  # from `generators.attention.masks.score_mask`
    past: int,
    scoring: Scoring,
) -> torch.Tensor | None:
    """weight * attention of one expert, computed for the queries routed to it only (top-K of N routing leaves
    each expert ~K/N of them); None when that would not be cheaper than running every query.

    Per (batch, head) the routed queries are gathered in prompt order and padded to the longest list with
    unrouted ones, whose weight is 0; each gathered row keeps its own mask row (`mask_rows`), so the result,
    scattered back, equals the dense computation row for row."""
    length, dim = q.shape[2], q.shape[3]
    if length == 1:
        return None
    chosen = weight[..., 0] != 0  # [B, H, L]
    rows = int(chosen.sum(-1).max())
    if rows > ROUTED_SHARE * length:
        return None
    order = torch.sort(chosen.to(torch.int8), dim=-1, descending=True, stable=True).indices[..., :rows]  # [B, H, m]
    q_sel = q.gather(2, order[..., None].expand(-1, -1, -1, dim))
    o = attend(q_sel, keys, values, mask_rows(mask, order, past, keys.shape[2]), scoring)
    o = o * weight.gather(2, order[..., None])
    return torch.zeros_like(q).scatter_add(2, order[..., None].expand(-1, -1, -1, dim), o.to(q.dtype))


# ---- the registry entry ---------------------------------------------------------------------------------------


def check_options(opts: dict) -> None:
    k = opts["top_k"]
    if k is not None and (not isinstance(k, int) or k < 1):
        raise MethodConfigError(f"moice top_k={k!r}: a positive whole number of experts per token (or None).")
    if opts["artefact"] is not None and not isinstance(opts["artefact"], str):
        raise MethodConfigError(f"moice artefact={opts['artefact']!r}: expected a folder path.")


def new_schemes(model, bases: list[float], top_k: int, per_head: bool = False, seed: int = 0) -> list[RotaryScheme]:
    """Freshly initialised (untrained) routers, seeded: a MoICE scheme per RoPE layer, a plain scheme (no router) on
    a NoPE layer, which has no base to change. `bases` are the model's (its reference base first,
    `rope_bases.rope_base`); each layer gets them carried to its own native base by their ratio (Gemma 3's local
    layers: 1e4 * b / 1e6), so expert 0 is always the layer's own RoPE."""
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    reference, head_dim = rope_base(cfg), head_dim_of(cfg)
    torch.manual_seed(seed)
    schemes: list[RotaryScheme] = []
    for i, rope in enumerate(layer_ropes(model)):
        inv_freq = layer_inv_freq(model, i)
        if rope is None:
            schemes.append(RotaryScheme(inv_freq, heads, kv_heads))
            continue
        layer_bases = rope.scaled_bases(bases, reference)
        schemes.append(
            MoiceScheme(inv_freq, heads, kv_heads, layer_bases, top_k, per_head, rope=rope, head_dim=head_dim)
        )
    return schemes


def routed_schemes(schemes: list[RotaryScheme]) -> dict[int, MoiceScheme]:
    """Layer index -> the MoICE scheme of each layer that has a router (every RoPE layer)."""
    return {i: s for i, s in enumerate(schemes) if isinstance(s, MoiceScheme)}


def router_state(schemes: list[RotaryScheme]) -> dict[str, torch.Tensor]:
    return {f"layers.{i}.{k}": v for i, s in routed_schemes(schemes).items() for k, v in s.router.state_dict().items()}


# ---- the trained part: routers as a verified artefact -------------------------------------------------------


@dataclass
class MoiceRouters(SavedPart):
    """One MoICE scheme per layer (each holding its router), and whether the routers are per head."""

    schemes: list[RotaryScheme]
    per_head: bool = False
    bases: list[float] | None = None  # the model's (reference base first); None: the first routed layer's

    SECTION = Section("experts", {"bases": list, "top_k": int, "per_head": bool})

    @classmethod
    def new(
        cls, model: nn.Module, bases: list[float], top_k: int, per_head: bool = False, seed: int = 0
    ) -> MoiceRouters:
        """Freshly initialised (untrained) routers for `model`, seeded."""
        return cls(new_schemes(model, bases, top_k, per_head, seed=seed), per_head, [float(b) for b in bases])

    def config(self) -> dict:
        """This artefact's "experts" section: the model's bases (reference base first), top_k and per_head."""
        first = next(iter(routed_schemes(self.schemes).values()))
        bases = self.bases if self.bases is not None else first.bases
        return {"bases": list(bases), "top_k": first.top_k, "per_head": self.per_head}

    def tensors(self) -> dict[str, torch.Tensor]:
        return router_state(self.schemes)

    @classmethod
    def from_config(cls, section: dict, artefact: Artefact, model: nn.Module, top_k: int | None = None) -> MoiceRouters:
        """Fresh routers for `model` over the "experts" section's bases, mixing `top_k` experts per token (default:
        as trained); refused when the bases are not this model's."""
        bases = section["bases"]
        top_k = top_k or section["top_k"]
        if top_k > len(bases):
            raise MethodConfigError(
                f"moice top_k={top_k}: the routers in {artefact.path} choose among {len(bases)} experts."
            )
        native = rope_base(model.config)
        if abs(bases[0] - native) > 1e-6 * native:
            raise MethodConfigError(
                f"moice artefact {artefact.path}: its first expert base is {bases[0]:g}, but this model's RoPE base "
                f"is {native:g}; the routers were trained for another model."
            )
        return cls.new(model, bases, top_k, section["per_head"])

    def with_tensors(self, tensors: dict[str, torch.Tensor], artefact: Artefact) -> MoiceRouters:
        """Each layer's router takes its saved state (`layers.{i}.` names, as `router_state` writes them)."""
        for i, scheme in routed_schemes(self.schemes).items():
            prefix = f"layers.{i}."
            scheme.router.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
            scheme.requires_grad_(False)
        return self


def build(loaded, opts: dict) -> MethodParts:
    from midlens.generators.models.shipped import resolve_artefact

    path = resolve_artefact(opts["artefact"], "moice", loaded.name)
    # Verified (base model, hash) before its "experts" section is read; the routers read their own section.
    routers, _ = MoiceRouters.load(path, "moice", loaded.sha256, model=loaded.model, top_k=opts["top_k"])
    return MethodParts(routers.schemes)


def inspect_routers(gen, prompts: list, out: Path | None = None) -> list[str]:
    """`midlens methods moice`: the bases' waveforms and router usage (generators.methods.moice_inspect, imported
    only when asked: it draws with matplotlib)."""
    from midlens.generators.methods.moice_inspect import inspect_routers as inspect

    return inspect(gen, list(routed_schemes(gen.parts.schemes).values()), prompts, out)


METHOD = Method(
    "moice",
    "trained routers mix attention over several RoPE bases per token and head (Lin et al. 2024)",
    build=build,
    unsupported=plain_rope_problem,
    scope=rope_scope,
    defaults=DEFAULTS,
    check=check_options,
    bench_variants=BENCH_VARIANTS,
    inspect=inspect_routers,
    trainer=TRAINER,
)
