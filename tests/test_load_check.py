"""The load-time comparison of midlens' attention with transformers' own forward
(generators/models/transformers_parity.py).

A tiny family is checked once per weights, config and dtype: later loads, of the same folder or of a copy, read the
record and run no forward. A layer the module computes wrongly (here its scale, as a misread config field would
leave it) is refused naming the folder, the difference, the step and the first layer whose hidden state departs,
in float32 and in bfloat16. The tolerances are the module's own (its doc and docs/results/load-check/).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from midlens.core.errors import ModelError
from midlens.generators.attention import positional_attention
from midlens.generators.attention.positional_attention import PositionalAttention
from midlens.generators.models import loading, transformers_parity
from midlens.generators.models.loading import load_model, release_model
from tests.tiny import save_tiny


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """A fresh cache and process model memory; the list of the models `transformers_parity.measure` ran on."""
    monkeypatch.setenv("MIDLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "_LOADED", {})
    seen: list[str] = []
    measure = transformers_parity.measure

    def counted(model, name, folder, vocab_size):
        seen.append(str(folder))
        return measure(model, name, folder, vocab_size)

    monkeypatch.setattr(transformers_parity, "measure", counted)
    return seen


def _wrong_scale(monkeypatch, layer: int, factor: float) -> None:
    """Layer `layer`'s attention runs with its scale times `factor`: what a config field the module ignores does."""
    read = positional_attention.read_anatomy

    def wrong(attn, rotary_emb):
        anatomy = read(attn, rotary_emb)
        if attn.layer_idx == layer:
            anatomy = type(anatomy)(**{**anatomy.__dict__, "scale": anatomy.scale * factor})
        return anatomy

    monkeypatch.setattr(positional_attention, "read_anatomy", wrong)


def test_a_family_passes_once_and_later_loads_read_the_record(runs, tmp_path):
    folder = save_tiny("qwen3", tmp_path / "qwen3")  # q/k norms per head
    loaded = load_model(str(folder), "cpu", "float32")
    check = loaded.verified
    assert check.passed and check.judged and check.dtype == "float32" and check.spread is None
    assert check.difference < transformers_parity.FP32_TOLERANCE and runs == [str(folder)]
    # The stock modules are back after the check: what load_model returns is the model transformers built.
    assert not any(isinstance(layer.self_attn, PositionalAttention) for layer in loaded.model.model.layers)
    assert len(list(transformers_parity.checks_dir().glob("*.json"))) == 1

    release_model(loaded)
    assert load_model(str(folder), "cpu", "float32").verified == check and runs == [str(folder)]
    copy = shutil.copytree(folder, tmp_path / "copy")  # keyed by the weights' hash, not the path
    assert load_model(str(copy), "cpu", "float32").verified.passed and runs == [str(folder)]
    load_model(str(folder), "cpu", "bfloat16")  # another dtype is checked on its own
    assert runs == [str(folder), str(folder)]


def test_a_changed_config_is_checked_again(runs, tmp_path):
    folder = save_tiny("llama", tmp_path / "llama")
    release_model(load_model(str(folder), "cpu", "float32"))
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"rope_theta": 10000.0', '"rope_theta": 500.0'))
    assert '"rope_theta": 500.0' in config.read_text()
    assert load_model(str(folder), "cpu", "float32").verified.passed and len(runs) == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_layer_computed_wrongly_is_refused_naming_folder_difference_and_layer(runs, tmp_path, monkeypatch, dtype):
    folder = save_tiny("llama", tmp_path / "llama")
    # Random weights give near-uniform attention, which a small scale error hardly moves: 20x makes it peaked.
    _wrong_scale(monkeypatch, layer=2, factor=20.0)
    with pytest.raises(ModelError) as err:
        load_model(str(folder), "cpu", dtype)
    msg = str(err.value)
    assert msg.startswith(f"model '{folder}' (LlamaForCausalLM, {dtype}): ")
    assert "midlens' attention differs from transformers' " in msg and "at prefill; first at layer 2." in msg
    difference = float(msg.split(" by ")[1].split(" ")[0])
    tolerance = float(msg.split("(tolerance ")[1].split(")")[0])
    assert difference > tolerance
    if dtype == "bfloat16":  # judged in float32 on the same weights first, where the layer is computed wrongly too
        assert "with both in float32 (the parameters upcast)" in msg and "(tolerance 1.00e-04)" in msg
        assert 'dtype="float32"' not in msg  # float32 would not help
    # The refusal is recorded too: the next load says the same without running anything.
    with pytest.raises(ModelError, match="first at layer 2"):
        load_model(str(folder), "cpu", dtype)
    assert len(runs) == 1


def test_bf16_is_judged_by_transformers_own_bf16_spread_and_the_weights_come_back_unchanged(runs, tmp_path):
    folder = save_tiny("gemma3", tmp_path / "gemma3")  # windows, q/k norms, per-type RoPE bases
    stock = load_model(str(folder), "cpu", "bfloat16")
    check = stock.verified
    assert check.passed and check.dtype == "bfloat16" and check.spread > 0
    assert check.tolerance == pytest.approx(
        transformers_parity.SPREAD_MULTIPLE * check.spread + transformers_parity.SPREAD_FLOOR
    )
    # The check upcast the parameters to float32 and back (exact), and left the float32 RoPE buffers alone.
    assert {p.dtype for p in stock.model.parameters()} == {torch.bfloat16}
    fresh = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    for (name, a), b in zip(stock.model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    buffers = dict(fresh.named_buffers())
    assert any(b.dtype == torch.float32 for b in buffers.values())  # the rotary frequencies
    for name, a in stock.model.named_buffers():
        assert a.dtype == buffers[name].dtype and torch.equal(a, buffers[name]), name


def test_cache_verify_runs_the_check_again_and_says_what_it_measured(runs, tmp_path, capsys):
    from midlens.cli import main
    from midlens.core.files import models_dir
    from midlens.generators.models.packaged_models import record_conversion

    folder = save_tiny("mistral", models_dir() / "tiny")
    record_conversion(folder, "tiny", "ab" * 32)
    release_model(load_model(str(folder), "cpu", "float32"))
    assert main(["cache", "verify", "--model", "tiny", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert len(runs) == 2  # measured again, though a record existed
    assert "ok      model tiny: midlens' attention matches transformers' forward, float32 on cpu: " in out
    assert "largest difference" in out and "(tolerance 1.00e-04)" in out


def test_an_error_of_the_low_precision_path_alone_is_refused_by_the_spread_rule(runs, tmp_path, monkeypatch):
    """Right in float32, wrong in bfloat16 (as a lost upcast would be): judged by transformers' own bf16 spread."""
    folder = save_tiny("llama", tmp_path / "llama")
    forward = PositionalAttention.forward

    def off_in_bf16(self, hidden_states, *args, **kwargs):
        out, weights = forward(self, hidden_states, *args, **kwargs)
        if hidden_states.dtype == torch.bfloat16 and self.layer_idx == 1:
            out = out + 0.5
        return out, weights

    monkeypatch.setattr(PositionalAttention, "forward", off_in_bf16)
    assert load_model(str(folder), "cpu", "float32").verified.passed
    with pytest.raises(ModelError) as err:
        load_model(str(folder), "cpu", "bfloat16")
    msg = str(err.value)
    assert "differs from transformers' float32 forward of the same weights by " in msg
    assert f"{transformers_parity.SPREAD_MULTIPLE:g} x the " in msg and "first at layer 1." in msg
    assert 'pass dtype="float32" to run it in float32, where it matches' in msg


def test_a_bf16_model_whose_float32_reference_does_not_fit_loads_unjudged_and_unrecorded(
    runs, tmp_path, monkeypatch, capsys
):
    folder = save_tiny("llama", tmp_path / "llama")

    def no_room(model):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(transformers_parity, "_float32_parameters", no_room)
    loaded = load_model(str(folder), "cpu", "bfloat16")
    assert loaded.dtype == torch.bfloat16 and not loaded.verified.judged
    assert "its float32 reference does not fit in memory" in capsys.readouterr().err
    assert not list(transformers_parity.checks_dir().glob("*.json"))  # the next load tries again


def test_an_error_in_cached_decoding_alone_names_the_decode_step(runs, tmp_path, monkeypatch):
    """Prefill right, the first cached step wrong (as a cache or position bug would be): named as decode step 1."""
    folder = save_tiny("qwen2", tmp_path / "qwen2")
    forward = PositionalAttention.forward

    def off_in_decode(self, hidden_states, *args, **kwargs):
        out, weights = forward(self, hidden_states, *args, **kwargs)
        if hidden_states.shape[1] == 1 and self.layer_idx == 3:
            out = out + 0.1
        return out, weights

    monkeypatch.setattr(PositionalAttention, "forward", off_in_decode)
    with pytest.raises(ModelError, match=r"\(tolerance 1.00e-04\) at decode step 1; first at layer 3\."):
        load_model(str(folder), "cpu", "float32")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_softcap_field_the_forward_never_applies_is_not_read_as_one(runs, tmp_path, dtype):
    """Gemma 3's config may carry attn_logit_softcapping and its attention module copies it, but its forward never
    passes it on: read as an attribute, the field made midlens soft-cap logits transformers leaves alone, and the
    load check refused the model. Gemma 2's forward does pass it, and is still read as capped."""
    from midlens.generators.attention.anatomy import model_anatomy

    folder = save_tiny("gemma3", tmp_path / "gemma3", attn_logit_softcapping=50.0)
    loaded = load_model(str(folder), "cpu", dtype)
    assert loaded.verified.passed and loaded.verified.judged
    assert all(a.softcap is None for a in model_anatomy(loaded.model))
    capped = load_model(str(save_tiny("gemma2", tmp_path / "gemma2")), "cpu", dtype)
    assert capped.verified.passed and {a.softcap for a in model_anatomy(capped.model)} == {50.0}


def test_the_code_hash_covers_every_module_the_checked_forward_runs(tmp_path):
    """Every midlens file with code that ran during a check is hashed into its record's key: an edit to any of them
    (masks.py, layer_trace.py were left out before) must not reuse a record made by the old code."""
    import sys
    from pathlib import Path

    package = Path(transformers_parity.__file__).parent.parent  # generators/: its rooms
    folder = save_tiny("gemma3", tmp_path / "gemma3")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()  # no layer read yet
    ran: set[Path] = set()

    def profile(frame, event, arg):
        path = Path(frame.f_code.co_filename)
        if event == "call" and package in path.parents:
            ran.add(path)

    sys.setprofile(profile)
    try:
        assert transformers_parity.measure(model, str(folder), folder, model.config.vocab_size).passed
    finally:
        sys.setprofile(None)
    hashed = set(transformers_parity.checked_modules().values())
    room = package / "attention"
    assert {room / "masks.py", room / "layer_trace.py", room / "positional_attention.py"} <= ran
    assert ran <= hashed, sorted(p.name for p in ran - hashed)


@pytest.mark.parametrize("module", ["masks.py", "layer_trace.py"])
def test_an_edit_to_a_checked_module_runs_the_check_again(runs, tmp_path, monkeypatch, module):
    from pathlib import Path

    folder = save_tiny("llama", tmp_path / "llama")
    release_model(load_model(str(folder), "cpu", "float32"))
    before = transformers_parity._code_digest()
    read = Path.read_bytes

    def edited(path: Path) -> bytes:
        data = read(path)
        return data + b"\n# an edit\n" if path.name == module and path.parent.name == "attention" else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    assert transformers_parity._code_digest() != before
    assert load_model(str(folder), "cpu", "float32").verified.passed and len(runs) == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_check_runs_no_more_tokens_than_one_64_token_prefill_per_precision(tmp_path, dtype):
    """Each forward reads every weight and each token adds its compute, and a first load waits for all of them: per
    precision compared (float32; and the model's own below it), both paths together get at most 3 forwards each
    and 64 tokens, the cost of about one plain 64-token prefill (before: 5 forwards each and 136 tokens)."""
    folder = save_tiny("llama", tmp_path / "llama")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    tokens: list[int] = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: tokens.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    assert transformers_parity.measure(model, str(folder), folder, model.config.vocab_size).passed
    precisions = 1 if dtype == "float32" else 2
    assert len(tokens) <= 2 * 3 * precisions and sum(tokens) <= 64 * precisions, tokens
