"""Positional-channel scaling: only the last token's attention changes, through the scaled channel's query and
keys; scale 1 is the stock model; the searched choice ships as a verified artefact; the search finds a planted
positional channel."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from midlens.core.errors import ArtefactError, MethodConfigError
from midlens.generators import Generator
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.methods.channel_scaling import ChannelChoice, channel_parts
from midlens.generators.methods.install import method_context
from midlens.generators.methods.registry import build_parts, method_config
from midlens.generators.models.shipped import shipped_path
from midlens.training.channel_scaling import paper_layers, parse_layer_ranges, positional_candidates
from tests.conftest import planted_passages
from tests.damage import overwrite, tensor_offset

LAYERS = [9, 10, 11, 12]
TEXT = "The capital of France is Paris. The Eiffel Tower stands in Paris. Where is the Eiffel Tower? It is in"


def _prefill(loaded, parts, ids: torch.Tensor, pre_hook=None):
    """Logits, every layer's hidden states and the KV cache of one prefill under `parts` (None: the stock model)."""
    handle = None
    if pre_hook is not None:
        layer, hook = pre_hook
        handle = loaded.model.model.layers[layer].self_attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.inference_mode(), method_context(loaded, parts):
            cache = new_cache()
            out = loaded.model(input_ids=ids, past_key_values=cache, output_hidden_states=True)
    finally:
        if handle is not None:
            handle.remove()
    return out.logits, out.hidden_states, cache


def _ids(loaded) -> torch.Tensor:
    return loaded.tokenizer(TEXT, return_tensors="pt", add_special_tokens=False)["input_ids"]


def test_scale_one_is_the_stock_model_exactly(loaded):
    """scale=1 installs nothing; the scheme itself at scale 1 (built anyway) agrees with the stock model too."""
    prompt_passages = planted_passages(4, 2)
    base = Generator(loaded, method="baseline")
    same = Generator(loaded, method=f"channel-scaling(channel=5, layers={LAYERS}, scale=1.0)")
    assert same.parts.delta is None
    prompt = base.prompt("What is the secret code word of the Zorbland expedition?", prompt_passages)
    a = base.generate(prompt, max_new_tokens=6, reference="pelican")
    b = same.generate(prompt, max_new_tokens=6, reference="pelican")
    assert (a.text, a.reference_logprob) == (b.text, b.reference_logprob)
    assert [p.evidence for p in a.passages] == [p.evidence for p in b.passages]

    ids = _ids(loaded)
    logits, _, _ = _prefill(loaded, None, ids)
    scaled, _, _ = _prefill(loaded, channel_parts(loaded.model, ChannelChoice(5, tuple(LAYERS), 1.0)), ids)
    torch.testing.assert_close(scaled, logits, atol=1e-4, rtol=0)  # logits of size ~20: float32 noise


def test_only_the_last_token_attends_through_the_scaled_channel(loaded):
    """Every earlier position is the stock model's, bit for bit, at every layer; the last token changes; the
    chosen layers cache the plain keys and the keys of the scaled channel (the paper's K~), which decoding uses."""
    ids = _ids(loaded)
    channel, scale = 7, -1.0
    _, base_states, base_cache = _prefill(loaded, None, ids)
    parts = build_parts(method_config(f"channel-scaling(channel={channel}, layers={LAYERS}, scale={scale})"), loaded)
    logits, states, cache = _prefill(loaded, parts, ids)
    for layer, (a, b) in enumerate(zip(states, base_states, strict=True)):
        assert torch.equal(a[:, :-1], b[:, :-1]), f"hidden states before the last token changed at layer {layer}"
    assert not torch.equal(states[-1][:, -1], base_states[-1][:, -1])

    first = LAYERS[0]
    heads = loaded.model.config.num_key_value_heads
    keys = cache.layers[first].keys  # [B, 2 * Hk, T, d]: plain keys, then scaled keys
    assert keys.shape[1] == 2 * heads and cache.layers[first - 1].keys.shape[1] == heads
    assert torch.equal(keys[:, :heads], base_cache.layers[first].keys)  # this layer's input is still the stock one

    def scale_channel(_module, args, kwargs):  # the stock layer fed the scaled channel at every position
        hidden = kwargs["hidden_states"].clone()
        hidden[..., channel] *= scale
        return args, {**kwargs, "hidden_states": hidden}

    _, _, scaled_cache = _prefill(loaded, None, ids, pre_hook=(first, scale_channel))
    torch.testing.assert_close(keys[:, heads:], scaled_cache.layers[first].keys, atol=1e-5, rtol=1e-5)


def test_decoding_reads_the_scaled_attention_the_prefill_gave_the_last_token(loaded):
    """Reading the last prompt token again after the cache (as decoding does) gives the prefill's last logits: a
    token appended after the cache attends through the scaled channel, as the last prompt token did."""
    ids = _ids(loaded)
    parts = build_parts(method_config(f"channel-scaling(channel=7, layers={LAYERS}, scale=0.0)"), loaded)
    with torch.inference_mode(), method_context(loaded, parts):
        cache = new_cache()
        full = loaded.model(input_ids=ids, past_key_values=cache).logits[0, -1]
        cache.crop(-1)  # the last prompt token dropped, to be read again
        again = loaded.model(input_ids=ids[:, -1:], past_key_values=cache).logits[0, -1]
    torch.testing.assert_close(again, full, atol=1e-4, rtol=0)


def test_the_shipped_choice_loads_by_default_and_a_damaged_one_is_refused(loaded, tmp_path):
    shipped = shipped_path("channel-scaling", "smollm2-135m")
    meta = json.loads((shipped / "meta.json").read_text())
    choice, _ = ChannelChoice.load(shipped, "channel-scaling", loaded.sha256)
    assert choice.config() == meta["scaling"]
    assert meta["training"]["command"].startswith("midlens train channel-scaling")
    assert meta["data"]["hotpotqa"]["split"].startswith("train")
    gen = Generator(loaded, method="channel-scaling")
    assert gen.parts.delta.choice == choice
    override = Generator(loaded, method="channel-scaling(scale=0.25)")
    assert override.parts.delta.choice == ChannelChoice(choice.channel, choice.layers, 0.25)

    edited = tmp_path / "edited"
    shutil.copytree(shipped, edited)
    meta["scaling"]["channel"] = (choice.channel + 1) % loaded.model.config.hidden_size
    (edited / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtefactError, match="meta.json was edited"):
        Generator(loaded, method=f"channel-scaling(artefact='{edited}')")

    damaged = tmp_path / "damaged"
    shutil.copytree(shipped, damaged)
    weights = damaged / "weights.safetensors"
    overwrite(weights, tensor_offset(weights, "channel"), b"\x01\x02")
    with pytest.raises(ArtefactError, match="does not match"):
        Generator(loaded, method=f"channel-scaling(artefact='{damaged}')")
    with pytest.raises(ArtefactError, match="not on the model loaded now"):
        ChannelChoice.load(shipped, "channel-scaling", "0" * 64)
    with pytest.raises(ArtefactError, match="no such folder"):
        Generator(loaded, method=f"channel-scaling(artefact='{tmp_path / 'missing'}')")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("channel-scaling(channel=-1)", "channel=-1: a hidden-state channel index"),
        ("channel-scaling(channel=2.5)", "channel=2.5: a hidden-state channel index"),
        ("channel-scaling(layers=[])", r"layers=\[\]: a non-empty list"),
        ("channel-scaling(layers=[3, 3])", "distinct layer indices"),
        ("channel-scaling(layers=5)", "layers=5: a non-empty list"),
        ("channel-scaling(scale='big')", "scale='big': a finite number"),
        ("channel-scaling(scale=True)", "scale=True: a finite number"),
        ("channel-scaling(artefact=3)", "artefact=3: expected a folder path"),
    ],
)
def test_bad_options_are_refused_before_loading(spec, message):
    with pytest.raises(MethodConfigError, match=message):
        method_config(spec)


def test_options_the_model_lacks_are_refused_with_its_sizes(loaded):
    with pytest.raises(MethodConfigError, match="hidden states have 576 channels"):
        Generator(loaded, method="channel-scaling(channel=576, layers=[9], scale=0.0)")
    with pytest.raises(MethodConfigError, match=r"this model has 30 layers \(0-29\), so \[30, 31\] do not exist"):
        Generator(loaded, method="channel-scaling(channel=1, layers=[29, 30, 31], scale=0.0)")


def test_the_statistics_find_a_planted_positional_channel():
    """Random curves, one channel rising smoothly with position in every layer, one rising with noise."""
    rng = np.random.default_rng(0)
    layers, positions, channels = 12, 400, 16
    states = rng.normal(size=(layers, positions, channels)).astype(np.float32)
    ramp = np.log1p(np.arange(positions, dtype=np.float32))
    states[:, :, 3] = ramp[None] * 2.0
    states[:, :, 9] = ramp[None] + 0.3 * rng.normal(size=(layers, positions))
    found = positional_candidates(states, count=3)
    assert found[0]["channel"] == 3 and found[0]["monotonic_layers"] == layers - 3  # layers 0, 1, last left out
    assert {r["channel"] for r in found} <= {3, 9}


def test_layer_ranges_follow_the_paper_in_proportion():
    assert paper_layers(32) == tuple(range(10, 26))
    assert paper_layers(30) == tuple(range(9, 24))
    assert paper_layers(24) == tuple(range(8, 20))
    assert parse_layer_ranges("paper, 2-4", 30) == [tuple(range(9, 24)), (2, 3, 4)]
    with pytest.raises(Exception, match="layers 0-29"):
        parse_layer_ranges("5-30", 30)
    with pytest.raises(Exception, match="'paper' or FIRST-LAST"):
        parse_layer_ranges("middle", 30)


@pytest.mark.slow
def test_the_search_writes_an_artefact_the_method_reads(loaded, tmp_path, capsys):
    """`midlens train channel-scaling` on a small budget: a choice is written with its record and loads by spec."""
    from midlens.cli import main

    out = tmp_path / "chs"
    args = ["train", "channel-scaling", "--strings", "2", "--length", "200", "--candidates", "2", "--scales", "0,-1"]
    args += ["--examples", "2", "--kv-pairs", "2", "--max-words", "8", "--no-progress", "--device", "cpu"]
    assert main([*args, "--out", str(out)]) == 0
    assert "answer NLL" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    record = meta["training"]
    assert record["chosen_nll"] == min(record["scale_nll"].values())
    assert 1 <= len(record["candidate_channels"]) <= 2 and record["options"]["candidates"] == 2
    assert record["command"].startswith("midlens train channel-scaling")
    gen = Generator(loaded, method=f"channel-scaling(artefact='{out}')")
    assert gen.parts.delta is None or gen.parts.delta.choice.config() == meta["scaling"]
    assert main(["train", "channel-scaling", "--scales", "x", "--out", str(out)]) == 2
    assert "scales 'x': comma-separated numbers" in capsys.readouterr().err
