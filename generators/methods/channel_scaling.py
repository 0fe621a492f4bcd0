"""Positional-channel scaling (Yu et al., Findings of ACL 2025, "Mitigate Position Bias in LLMs via Scaling a
Single Hidden States Channel", arXiv 2406.02536): training-free, one number per model changes.

    Generator("smollm2-135m", method="channel-scaling")             # the channel searched for this model
    Generator(m, method="channel-scaling(scale=0.5)")                 # the shipped channel and layers, another scale
    Generator(m, method="channel-scaling(artefact='runs/chs-smollm2')")   # a search of your own

The recipe, as the paper (Sec. 3.3) and its official code apply it:
  - one hidden-state channel c whose value rises or falls monotonically with the token's position (a
    "positional channel"), found by a search (`midlens train channel-scaling`, training.channel_scaling);
  - in the chosen middle layers, channel c of the attention's input x (after the layer's input norm) is
    multiplied by `scale` before the QUERY and KEY projections: q~ = W_q f(x), k~ = W_k f(x), f(x)_c = scale * x_c;
    values are unchanged;
  - only the LAST prompt token's attention uses q~ against the keys k~ of every token; each other prompt token
    attends as in the stock model, so its output (and every later layer's state at its position) is untouched.
    Decoding goes on from the keys k~ (the official code caches them) with each new token's query q~.

How it runs here: a `ChannelTap` (a WeightDelta that adds nothing) hands each chosen layer the input x its q and
k are projected from, and the layer's `ChannelScheme` builds the plain and the scaled q/k as two "experts" that
share the values (the seam MoICE mixes its RoPE bases through), with 0/1 mixing weights. The scaled q/k are the
layer's own (`ScaledProjection`): where q and k are linear in x up to the rotation (Llama, Qwen2, Phi-3's fused
qkv, GLM-4's interleaved pairs, a norm applied after RoPE), W f(x) = W x + (scale - 1) x_c W[:, c], the column
taken from the q / k projection (or the fused projection's q / k rows) and put in the layer's pair order; where q
and k are normalised before RoPE (Qwen3, OLMo 2, Gemma 3), f(x) is projected and normalised as the layer does it,
since a norm is not linear. Each expert is then rotated by the layer's own RoPE (its base, scaled schedule,
partial rotary). A NoPE layer among the chosen ones is left as it is (`channel_parts`). Which queries read which:
  - a prefill (a forward with nothing cached): the last column reads expert 1 (scaled), the others expert 0;
  - a forward after a cache (a decode step, the last prompt token read again, a reference answer scored
    teacher-forced): every query reads expert 1, because every appended token is an answer token, as in the
    official code's validation loss, which recomputes the last prompt token and the answer's tokens. (The
    official code defines no other appended chunk; here the content-free question "N/A" that calibrates evidence
    is appended too and read the same way, so calibrated evidence ranks under this method compare plain question
    rows with scaled null-question rows. Answers and their log-probabilities do not depend on it.)
The probe reads evidence through the same weights, so evidence is the attention applied. Cost: the chosen layers
cache their keys twice (plain and scaled) and the prefill runs one extra attention row per chosen layer (a layer
that normalises q/k also projects k, and the last row's q, once more).
scale = 1 is the stock model, and nothing is installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from midlens.core.errors import ArtefactError, MethodConfigError
from midlens.core.saved_parts import Artefact, SavedPart, Section, train_step
from midlens.generators.attention.anatomy import (
    LayerAnatomy,
    decoder_of,
    index_ranges,
    interleaved_to_half,
    model_anatomy,
)
from midlens.generators.attention.arithmetic import attend
from midlens.generators.attention.delta import WeightDelta
from midlens.generators.attention.masks import mask_rows
from midlens.generators.attention.rope import RotaryScheme, baseline_schemes
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method
from midlens.generators.models.shipped import resolve_artefact

NAME = "channel-scaling"
# None: the value of the artefact shipped for the model (or of `artefact`); a value given overrides it.
DEFAULTS = {"channel": None, "layers": None, "scale": None, "artefact": None}
# Where `midlens train channel-scaling` finds its search (the training layer, above this one).
TRAINER = "midlens.training.channel_scaling"
BENCH_VARIANTS = ("channel-scaling",)


# ---- the choice a search ships --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelChoice(SavedPart):
    """What is scaled: hidden-state channel `channel`, in `layers`, by `scale`."""

    channel: int
    layers: tuple[int, ...]
    scale: float

    # meta.json's "scaling" section; the same three values are the artefact's tensors, so the hash that verifies
    # weights.safetensors verifies the choice itself, and a meta.json edited to disagree is refused.
    SECTION = Section("scaling", {"channel": int, "layers": list, "scale": (int, float)})

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "channel": torch.tensor([self.channel], dtype=torch.int64),
            "layers": torch.tensor(list(self.layers), dtype=torch.int64),
            "scale": torch.tensor([self.scale], dtype=torch.float64),
        }

    @classmethod
    def from_config(cls, section: dict, artefact: Artefact) -> ChannelChoice:
        """The choice the "scaling" section describes; `with_tensors` then holds it to the verified tensors."""
        layers = section["layers"]
        if not layers or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ArtefactError(
                f"artefact {artefact.meta_file}: scaling.layers must be a non-empty list of layer indices; rerun the "
                "search.",
                [train_step(NAME)],
            )
        return cls(section["channel"], tuple(layers), float(section["scale"]))

    def with_tensors(self, tensors: dict[str, torch.Tensor], artefact: Artefact) -> ChannelChoice:
        """The choice the verified tensors hold, which the section (not covered by the hash) must repeat."""
        stored = ChannelChoice(
            int(tensors["channel"][0]), tuple(int(i) for i in tensors["layers"]), float(tensors["scale"][0])
        )
        if stored != self:
            raise ArtefactError(
                f"artefact {artefact.meta_file}: its scaling section says {self.config()}, but the verified "
                f"{artefact.path.name}/weights.safetensors holds {stored.config()}: meta.json was edited. Restore it "
                "from the repository or rerun the search.",
                [train_step(NAME)],
            )
        return stored


# ---- the per-call parts ---------------------------------------------------------------------------------------


class ChannelTap(WeightDelta):
    """Adds nothing to any projection: hands each chosen layer's scheme the input x its q and k are projected from,
    for the forward in progress (the q projection is asked first, fused or not)."""

    def __init__(self, choice: ChannelChoice, source: str = "", layers: tuple[int, ...] | None = None):
        super().__init__()
        self.choice = choice
        self.source = source  # where the choice came from, for `midlens methods channel-scaling`
        self._layers = set(choice.layers if layers is None else layers)
        self._pending: dict[int, torch.Tensor] = {}

    def project(self, layer: int, name: str, x: torch.Tensor) -> torch.Tensor | None:
        if name == "q" and layer in self._layers:
            self._pending[layer] = x
        return None

    def take(self, layer: int) -> torch.Tensor:
        if layer not in self._pending:
            raise RuntimeError(
                f"channel-scaling layer {layer}: no hidden state was handed over; the method's ChannelTap must be "
                "installed as its delta (build the parts with build_parts / method_context, not the schemes alone)."
            )
        return self._pending.pop(layer)


class ScaledProjection(nn.Module):
    """q~ = W_q f(x) and k~ = W_k f(x) of one layer, f scaling channel c of x, in the form the layer hands its
    rotation: after its q/k norm and in its pair order (an interleaved layer's channels permuted to half-split).

    A layer without q/k norm is linear in x, so f's share is one column of W_q / W_k (of the fused projection's
    q and k slices where there is one) times (scale - 1) x_c, added to the plain q and k: exact and costs an outer
    product. A layer that normalises q or k is not, so the scaled input is projected and normalised as the layer
    does it (its own weights, slices and norm modules): k for every token, q only for the rows that read it."""

    def __init__(self, attn: nn.Module, anatomy: LayerAnatomy, channel: int, scale: float, heads: int, kv_heads: int):
        super().__init__()
        self.channel, self.scale, self.heads, self.kv_heads = channel, scale, heads, kv_heads
        self.head_dim = attn.head_dim
        # None, "head" or "projection". A norm applied after RoPE (HunYuan) is the attention module's to apply to
        # every expert alike, so up to the rotation such a layer is linear in x.
        self.norm = None if getattr(anatomy, "qk_norm_after_rope", False) else anatomy.qk_norm
        order = interleaved_to_half(anatomy.rotary_dim, self.head_dim) if anatomy.interleaved else None
        self.register_buffer("order", order, persistent=False)
        q_size, k_size = heads * self.head_dim, kv_heads * self.head_dim
        if anatomy.fused_qkv:  # [q | k | v] rows of one weight
            weight, bias = attn.qkv_proj.weight, attn.qkv_proj.bias
            q_w, k_w = weight[:q_size], weight[q_size : q_size + k_size]
            q_b, k_b = (None, None) if bias is None else (bias[:q_size], bias[q_size : q_size + k_size])
        else:
            q_w, k_w, q_b, k_b = attn.q_proj.weight, attn.k_proj.weight, attn.q_proj.bias, attn.k_proj.bias
        # Views of the loaded weights (no copy): the norm path projects with them, the linear path reads column c.
        self.weights = {"q": (q_w, q_b), "k": (k_w, k_b)}
        q_norm, k_norm = getattr(anatomy, "norm_names", ("q_norm", "k_norm"))  # the stock layer's names
        # the layer's own norm modules (the installed attention holds them as q_norm / k_norm)
        self.norms = {"q": getattr(attn, "q_norm", getattr(attn, q_norm, None)),
                      "k": getattr(attn, "k_norm", getattr(attn, k_norm, None))}  # fmt: skip

    def _heads(self, t: torch.Tensor, count: int) -> torch.Tensor:
        return t.view(*t.shape[:2], count, self.head_dim).transpose(1, 2)  # [B, L, n*d] -> [B, n, L, d]

    def _ordered(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.order is None else t[..., self.order]

    def _column(self, name: str, count: int) -> torch.Tensor:
        """Column c of the projection as [n, d] in the layer's pair order."""
        return self._ordered(self.weights[name][0][:, self.channel].view(count, self.head_dim))

    def _project(self, name: str, x: torch.Tensor, count: int) -> torch.Tensor:
        """The layer's own q or k of the channel-scaled input x [B, L, hidden]: [B, n, L, d]."""
        scaled = x.clone()
        scaled[..., self.channel] *= self.scale
        weight, bias = self.weights[name]
        out = nn.functional.linear(scaled, weight, bias)
        norm = self.norms[name]
        if self.norm == "projection":
            out = norm(out)
        out = self._heads(out, count)
        if self.norm == "head":
            out = norm(out)
        return self._ordered(out)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, last_only: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The scaled q and k beside the plain ones (q [B, H, L, d], k [B, Hk, L, d]); with `last_only`, rows of
        q~ other than the last are the plain ones (nothing reads them)."""
        if self.norm is None:
            extra = (self.scale - 1.0) * x[..., self.channel].float()[:, None, :, None]  # [B, 1, L, 1]
            q_col, k_col = self._column("q", self.heads), self._column("k", self.kv_heads)
            q_new = q + (extra * q_col[None, :, None, :].float()).to(q.dtype)
            return q_new, k + (extra * k_col[None, :, None, :].float()).to(k.dtype)
        k_new = self._project("k", x, self.kv_heads).to(k.dtype)
        if last_only:
            q_last = self._project("q", x[:, -1:], self.heads).to(q.dtype)
            return torch.cat([q[:, :, :-1], q_last], dim=2), k_new
        return self._project("q", x, self.heads).to(q.dtype), k_new


class ChannelScheme(RotaryScheme):
    """The layer's own RoPE over its plain q/k (expert 0) and over the channel-scaled q/k (expert 1); see the
    module doc for which queries read which."""

    num_experts = 2

    def __init__(self, inv_freq: torch.Tensor, num_heads: int, num_kv_heads: int, layer: int, tap: ChannelTap,
                 scaled: ScaledProjection):  # fmt: skip
        super().__init__(inv_freq, num_heads, num_kv_heads)
        self.layer = layer
        self.tap = tap
        self.scaled = scaled
        self._prefill_next = False
        self._last_only = False  # this forward scales its last query only (a prefill) or every query

    def start_sequence(self, q, k, key_mask=None) -> None:
        # Called only when nothing is cached yet, before `rotate` of the same forward.
        self._prefill_next = True

    def rotate(self, q, k, positions, position_embeddings):
        self._last_only, self._prefill_next = self._prefill_next, False
        q_scaled, k_scaled = self.scaled(q, k, self.tap.take(self.layer), self._last_only)
        q_plain, k_plain = super().rotate(q, k, positions, position_embeddings)
        q_new, k_new = super().rotate(q_scaled, k_scaled, positions, position_embeddings)
        return torch.cat([q_plain, q_new]), torch.cat([k_plain, k_new])

    def mixing_weights(self, q: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """[2, B, H, L, 1]: which queries read the plain attention (expert 0) and which the scaled (expert 1)."""
        scaled = torch.ones(*q.shape[:3], 1, dtype=q.dtype, device=q.device)
        if self._last_only:
            scaled[:, :, :-1] = 0
        return torch.stack([1 - scaled, scaled])

    def attend(self, q_rot, keys, values, weights, mask, past, scoring):
        if not self._last_only:
            return attend(q_rot[1], keys[:, 1], values, mask, scoring)
        # The plain attention for every row (the stock computation, bit for bit), then the last row again with the
        # scaled query and keys: one extra row, not a second attention over the prompt.
        out = attend(q_rot[0], keys[:, 0], values, mask, scoring)
        batch, length = q_rot.shape[1], q_rot.shape[3]
        last = torch.full((batch, 1), length - 1, dtype=torch.long, device=q_rot.device)
        row = attend(q_rot[1][:, :, -1:], keys[:, 1], values, mask_rows(mask, last, past, keys.shape[3]), scoring)
        return torch.cat([out[:, :, :-1], row.to(out.dtype)], dim=2)


def channel_parts(model: torch.nn.Module, choice: ChannelChoice, source: str = "") -> MethodParts:
    """The parts that scale `choice` on `model` (built even for scale 1, which `build` skips: tests use it).

    A NoPE layer among the chosen ones is left as it is: the attention module hands a scheme the q and k of the
    layers it rotates only, so there is no seam to read the scaled ones through (`midlens methods` says which)."""
    cfg = model.config
    check_fits(choice, cfg.hidden_size, cfg.num_hidden_layers)
    anatomy = model_anatomy(model)
    rotated = tuple(i for i in choice.layers if anatomy[i].rotary)
    tap = ChannelTap(choice, source, rotated)
    schemes = baseline_schemes(model)
    layers = decoder_of(model).layers
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    for i in rotated:
        scaled = ScaledProjection(layers[i].self_attn, anatomy[i], choice.channel, choice.scale, heads, kv_heads)
        schemes[i] = ChannelScheme(schemes[i].inv_freq, heads, kv_heads, i, tap, scaled)
    return MethodParts(schemes, delta=tap)


# ---- the registry entry ---------------------------------------------------------------------------------------


def channel_problem(model: torch.nn.Module) -> str | None:
    """Why no layer of `model` can scale the channel: every layer is a NoPE one (see `channel_parts`)."""
    if not any(a.rotary for a in model_anatomy(model)):
        return "none of its layers rotates q and k (all NoPE), and the method reads the scaled q/k at the rotation"
    return None


def nope_note(model: torch.nn.Module, layers: tuple[int, ...]) -> str | None:
    """Which of the chosen `layers` are NoPE layers, left as they are, or None."""
    anatomy = model_anatomy(model)
    nope = [i for i in layers if not anatomy[i].rotary]
    if not nope:
        return None
    which = f"layers {index_ranges(nope)} have" if len(nope) > 1 else f"layer {nope[0]} has"
    return f"{which} no RoPE and {'are' if len(nope) > 1 else 'is'} left unscaled"


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_options(opts: dict) -> None:
    channel, layers, scale = opts["channel"], opts["layers"], opts["scale"]
    if channel is not None and not (_whole(channel) and channel >= 0):
        raise MethodConfigError(
            f"channel-scaling channel={channel!r}: a hidden-state channel index, a whole number >= 0; leave it out "
            "for the channel searched for the model."
        )
    if layers is not None and not (
        isinstance(layers, list | tuple)
        and layers
        and all(_whole(i) and i >= 0 for i in layers)
        and len(set(layers)) == len(layers)
    ):
        raise MethodConfigError(
            f"channel-scaling layers={layers!r}: a non-empty list of distinct layer indices (e.g. layers=[9, 10, 11]); "
            "leave it out for the layers searched for the model."
        )
    if scale is not None and not (
        isinstance(scale, int | float) and not isinstance(scale, bool) and math.isfinite(scale)
    ):
        raise MethodConfigError(
            f"channel-scaling scale={scale!r}: a finite number the channel is multiplied by (1 = the stock model, "
            "0 = the channel removed, negative = flipped); leave it out for the scale searched for the model."
        )
    if opts["artefact"] is not None and not isinstance(opts["artefact"], str):
        raise MethodConfigError(f"channel-scaling artefact={opts['artefact']!r}: expected a folder path.")


def check_fits(choice: ChannelChoice, hidden_size: int, num_layers: int) -> None:
    """Refuse a channel or layer the model does not have, naming the option and the model's sizes."""
    if not 0 <= choice.channel < hidden_size:
        raise MethodConfigError(
            f"channel-scaling channel={choice.channel}: this model's hidden states have {hidden_size} channels "
            f"(0-{hidden_size - 1}); pass a channel in that range, or leave it out for the searched one."
        )
    beyond = [i for i in choice.layers if not 0 <= i < num_layers]
    if beyond:
        raise MethodConfigError(
            f"channel-scaling layers={list(choice.layers)}: this model has {num_layers} layers (0-{num_layers - 1}), "
            f"so {beyond} do not exist; pass layers in that range, or leave them out for the searched ones."
        )


CHOICE = ("channel", "layers", "scale")


def reads_artefact(opts: dict) -> bool:
    """Whether these options read an artefact: unless one was given, only when the choice is not all given."""
    return opts["artefact"] is not None or any(opts[k] is None for k in CHOICE)


def resolve_choice(loaded, opts: dict) -> tuple[ChannelChoice, str]:
    """The choice for `loaded`: the options given, the rest from the artefact (the shipped one by default); and
    where it came from. All three given and no artefact: nothing is read."""
    given = {k: opts[k] for k in CHOICE}
    if not reads_artefact(opts):
        return ChannelChoice(given["channel"], tuple(given["layers"]), float(given["scale"])), "options"
    path = resolve_artefact(opts["artefact"], NAME, loaded.name)
    stored, _ = ChannelChoice.load(path, NAME, loaded.sha256)
    choice = ChannelChoice(
        stored.channel if given["channel"] is None else given["channel"],
        stored.layers if given["layers"] is None else tuple(given["layers"]),
        stored.scale if given["scale"] is None else float(given["scale"]),
    )
    overridden = [k for k, v in given.items() if v is not None]
    return choice, str(path) + (f" ({', '.join(overridden)} overridden)" if overridden else "")


def build(loaded, opts: dict) -> MethodParts:
    choice, source = resolve_choice(loaded, opts)
    cfg = loaded.model.config
    check_fits(choice, cfg.hidden_size, cfg.num_hidden_layers)
    if choice.scale == 1.0:  # the stock model: nothing to install
        return MethodParts(baseline_schemes(loaded.model))
    return channel_parts(loaded.model, choice, source)


def inspect_choice(gen, prompts: list, out: Path | None = None) -> list[str]:
    """`midlens methods channel-scaling`: what is scaled, where it came from, and how far the channel's value at
    each prompt's last token sits from its value across the prompt (what the scale moves)."""
    tap = gen.parts.delta
    if not isinstance(tap, ChannelTap):
        return ["scale 1: the stock model, nothing is installed."]
    c = tap.choice
    lines = [
        f"channel {c.channel}, layers {list(c.layers)}, scale {c.scale:g} (from {tap.source})",
    ]
    note = nope_note(gen.model, c.layers)
    if note:
        lines.append(note)
    if prompts:
        lines.append(_channel_profile(gen, prompts, c))
    return lines


def _channel_profile(gen, prompts: list, choice: ChannelChoice) -> str:
    """Mean over prompts of x_c (the first chosen layer's attention input) at the last token and over the prompt."""
    model = gen.model
    attn = decoder_of(model).layers[choice.layers[0]].self_attn
    seen: list[torch.Tensor] = []

    def read(_module, args, kwargs) -> None:  # the attention's input: after the input norm where the layer has one
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        seen.append(hidden[0, :, choice.channel].float())

    handle = attn.register_forward_pre_hook(read, with_kwargs=True)
    try:
        with torch.inference_mode():
            for prompt in prompts:
                model(input_ids=torch.tensor([prompt.input_ids], device=gen.device), use_cache=False)
    finally:
        handle.remove()
    last = sum(float(s[-1]) for s in seen) / len(seen)
    mean = sum(float(s.mean()) for s in seen) / len(seen)
    return f"x_c at layer {choice.layers[0]} over {len(seen)} prompts: last token {last:+.3f}, prompt mean {mean:+.3f}"


METHOD = Method(
    NAME,
    "training-free: one positional hidden-state channel scaled for the last token's attention (Yu et al. 2025)",
    build=build,
    unsupported=channel_problem,
    defaults=DEFAULTS,
    check=check_options,
    reads_artefact=reads_artefact,
    artefact_free="channel, layers and scale all given",
    bench_variants=BENCH_VARIANTS,
    inspect=inspect_choice,
    trainer=TRAINER,
)
