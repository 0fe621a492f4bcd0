"""Channel scaling on every tiny family (tests/tiny.py FAMILIES), against the layer's own projections.

The paper's q~ = W_q f(x), k~ = W_k f(x) (f scales channel c of the attention's input) is computed by the layer
itself here: hooks on its projection modules feed them f(x) for q and k (a fused qkv projection keeps its v slice
from x), so the stock attention, its q/k norm, its pair order and its RoPE make the reference. With one chosen
layer, the method's last position after that layer must equal the reference's; every earlier position must equal
the stock model's; scale 1 must equal the stock model.

Tolerances (fp32, CPU): hidden states of size ~1 agree to STATE_TOL = 1e-5: the method adds (scale - 1) x_c times
a column where the layer is linear, or projects one row of f(x) where it normalises q/k, and attends one row
again, while the reference projects and attends every row: the same sums in other orders. Scale 1 agrees to
LOGIT_TOL = 1e-5 on logits of size ~1-10 for the same reason. A wrong column, norm, slice or pair order moves
the last position by 1e-2 or more (checked: the flipped channel moves it by more than MOVED).
"""

from __future__ import annotations

import pytest
import torch

from midlens.generators.attention.anatomy import model_anatomy
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.methods.channel_scaling import ChannelChoice, channel_parts, channel_problem
from midlens.generators.methods.install import method_context
from midlens.generators.models.loading import load_model
from tests.tiny import FAMILIES, VOCAB_SIZE, save_tiny

STATE_TOL = 1e-5
LOGIT_TOL = 1e-5
MOVED = 10 * STATE_TOL
CHANNEL, SCALE = 5, 50.0
PROMPT = 24


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    folder = save_tiny(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, load_model(str(folder), "cpu", "float32")


def _ids() -> torch.Tensor:
    return torch.randint(3, VOCAB_SIZE, (1, PROMPT), generator=torch.Generator().manual_seed(0))


def _prefill(loaded, parts, hooks=()):
    """Logits and every layer's hidden states of one prefill under `parts` (None: the stock model), with forward
    hooks (module, hook) installed for its duration."""
    handles = [module.register_forward_hook(hook) for module, hook in hooks]
    try:
        with torch.inference_mode(), method_context(loaded, parts):
            out = loaded.model(input_ids=_ids(), past_key_values=new_cache(), output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    return out.logits, out.hidden_states


def _scaled_projection_hooks(attn, q_and_k: int | None):
    """Forward hooks that make the layer's q and k projections read f(x): on q_proj and k_proj, or, for a fused
    qkv_proj, on its first `q_and_k` outputs (v keeps the plain input, as the method leaves values alone)."""

    def scaled(module, args, out):
        x = args[0].clone()
        x[..., CHANNEL] *= SCALE
        new = torch.nn.functional.linear(x, module.weight, module.bias)
        if q_and_k is None:
            return new
        return torch.cat([new[..., :q_and_k], out[..., q_and_k:]], dim=-1)

    if hasattr(attn, "qkv_proj"):
        return [(attn.qkv_proj, scaled)]
    return [(attn.q_proj, scaled), (attn.k_proj, scaled)]


def _first_rotated_layer(loaded) -> int:
    return next(i for i, a in enumerate(model_anatomy(loaded.model)) if a.rotary and i > 0)


def test_channel_scaling_runs_on_every_family(family):
    _, loaded = family
    assert channel_problem(loaded.model) is None


def test_the_last_position_attends_with_the_layers_own_scaled_q_and_k(family):
    name, loaded = family
    layer = _first_rotated_layer(loaded)
    cfg = loaded.model.config
    attn = loaded.model.model.layers[layer].self_attn
    q_and_k = (cfg.num_attention_heads + cfg.num_key_value_heads) * attn.head_dim
    _, base = _prefill(loaded, None)
    _, ours = _prefill(loaded, channel_parts(loaded.model, ChannelChoice(CHANNEL, (layer,), SCALE)))
    _, ref = _prefill(loaded, None, _scaled_projection_hooks(attn, q_and_k if hasattr(attn, "qkv_proj") else None))
    after = layer + 1  # hidden_states[0] is the embeddings: [layer + 1] is this layer's output
    for i, (a, b) in enumerate(zip(ours, base, strict=True)):
        assert torch.equal(a[:, :-1], b[:, :-1]), f"{name}: a position before the last changed at layer {i}"
    assert torch.equal(ours[layer][:, -1], base[layer][:, -1])  # the chosen layer's input is the stock one
    moved = (ours[after][:, -1] - base[after][:, -1]).abs().max().item()
    assert moved > MOVED, f"{name}: scaling channel {CHANNEL} by {SCALE} moved nothing ({moved:.1e})"
    diff = (ours[after][:, -1] - ref[after][:, -1]).abs().max().item()
    assert diff < STATE_TOL, f"{name}: the last position differs from the layer's own scaled q/k by {diff:.2e}"


def test_scale_one_is_the_stock_model(family):
    name, loaded = family
    layers = tuple(range(loaded.model.config.num_hidden_layers))
    logits, _ = _prefill(loaded, None)
    same, _ = _prefill(loaded, channel_parts(loaded.model, ChannelChoice(CHANNEL, layers, 1.0)))
    diff = (same - logits).abs().max().item()
    assert diff < LOGIT_TOL, f"{name}: scale 1 moved the logits by {diff:.2e}"


def test_nope_layers_are_left_as_they_are(tmp_path):
    """SmolLM3's NoPE layer among the chosen ones: the method scales the RoPE layers and says which it left."""
    from midlens.generators.methods.channel_scaling import nope_note

    loaded = load_model(str(save_tiny("smollm3", tmp_path / "smollm3")), "cpu", "float32")
    nope = [i for i, a in enumerate(model_anatomy(loaded.model)) if not a.rotary]
    assert nope == [3]
    parts = channel_parts(loaded.model, ChannelChoice(CHANNEL, (2, 3), SCALE))
    assert type(parts.schemes[3]).__name__ == "RotaryScheme" and type(parts.schemes[2]).__name__ == "ChannelScheme"
    assert nope_note(loaded.model, (2, 3)) == "layer 3 has no RoPE and is left unscaled"
    logits, _ = _prefill(loaded, parts)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ["olmo2", "smollm3"])  # no input norm before attention; a NoPE layer
def test_midlens_methods_channel_scaling_reads_the_attention_input_and_names_nope_layers(name, tmp_path):
    from midlens.core.passage import Passage
    from midlens.generators import Generator
    from midlens.generators.methods.channel_scaling import inspect_choice

    loaded = load_model(str(save_tiny(name, tmp_path / name)), "cpu", "float32")
    gen = Generator(loaded, method=f"channel-scaling(channel={CHANNEL}, layers=[2, 3], scale=0.5)")
    prompt = gen.prompt("who ?", [Passage(text="the film was directed by his city", title="film")])
    lines = inspect_choice(gen, [prompt])
    assert lines[0] == f"channel {CHANNEL}, layers [2, 3], scale 0.5 (from options)"
    assert lines[-1].startswith("x_c at layer 2 over 1 prompts: last token ")
    assert ("layer 3 has no RoPE and is left unscaled" in lines) == (name == "smollm3")
