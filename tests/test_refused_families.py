"""Families the attention module cannot run are refused before any weight is read, with one line saying why.

Each folder here holds a config.json and a tokenizer and no weights at all: a refusal that needed the weights would
fail on the missing file instead. The configs are transformers' own config classes at the tiny test shape; what is
refused is what the config or the layers' modules say (layer types with a recurrent, convolution or no cache of
their own; a mixer outside self_attn; a submodule inside the attention that the module would skip), never a name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from midlens.core.errors import ModelError
from midlens.generators.attention.anatomy import UnsupportedAttention, non_attention_problem, read_anatomy
from midlens.generators.models.loading import load_model
from midlens.generators.models.random_models import random_config
from tests.tiny import SHAPE, WINDOW, _tokenizer

GEMMA3N = dict(  # two layers that store keys, two that reuse them; AltUp, laurel and per-layer inputs made tiny
    model_type="gemma3n_text",
    head_dim=16,
    sliding_window=WINDOW,
    layer_types=["sliding_attention", "full_attention"] * 2,
    num_kv_shared_layers=2,
    intermediate_size=128,
    activation_sparsity_pattern=[0.0] * 4,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=512,
    laurel_rank=4,
)
# family -> (config fields at the tiny shape, what the refusal must say)
REFUSED = {
    "falcon-h1": (dict(model_type="falcon_h1", head_dim=16), "'hybrid': attention beside a state-space mixer"),
    "jamba": (
        dict(model_type="jamba", attn_layer_period=2, attn_layer_offset=1, expert_layer_period=4, num_experts=1),
        "'linear_attention': state-space",
    ),
    "bamba": (dict(model_type="bamba", attn_layer_indices=[1, 3]), "'linear_attention': state-space"),
    "qwen3-next": (dict(model_type="qwen3_next", head_dim=16), "'linear_attention': state-space"),
    "lfm2": (dict(model_type="lfm2", full_attn_idxs=[1, 3]), "'conv': convolution layers"),
    "granite-moe-hybrid": (
        dict(model_type="granitemoehybrid", layer_types=["mamba", "attention"] * 2),
        "'linear_attention': state-space",
    ),
    "gemma3n": (GEMMA3N, "layers 2-3 reuse another layer's keys and values (KV sharing"),
    # without KV sharing Gemma 3n still normalises v, which the module would skip
    "gemma3n-no-sharing": ({**GEMMA3N, "num_kv_shared_layers": 0}, "applies v_norm (Gemma3nRMSNorm)"),
    # parts inside the attention that the module would skip, found in the forward's trace (both ran before, wrongly)
    "bitnet": (dict(model_type="bitnet"), "applies attn_sub_norm (BitNetRMSNorm)"),
    "diffllama": (dict(model_type="diffllama"), "applies groupnorm (RMSNorm)"),
    # a forward that needs another layer's keys and values (before: "could not be read (TypeError: ...)")
    "gemma4": (dict(model_type="gemma4_text", head_dim=16), "needs shared_kv_states (keys and values another layer"),
    # an elementwise clamp is no submodule: named by its config field
    "olmo-clip-qkv": (dict(model_type="olmo", clip_qkv=8.0), "q/k/v clipping (OLMo's clip_qkv)"),
}


def config_only_folder(name: str, root: Path) -> Path:
    spec = dict(REFUSED[name][0])
    config = random_config(spec.pop("model_type"), **{**SHAPE, **spec, "vocab_size": 512})
    folder = root / name
    config.save_pretrained(folder)
    fast = PreTrainedTokenizerFast(tokenizer_object=_tokenizer(), unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)
    assert not list(folder.glob("*.safetensors")) and not list(folder.glob("*.bin"))
    return folder


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_family_the_module_cannot_run_is_refused_before_its_weights_with_the_reason(name, tmp_path):
    folder = config_only_folder(name, tmp_path)
    with pytest.raises(ModelError) as err:
        load_model(str(folder), "cpu", "float32")
    message = str(err.value)
    assert str(folder / "config.json") in message
    assert REFUSED[name][1] in message
    assert "cannot run through midlens' attention module" in message


@pytest.mark.parametrize("name", ["falcon-h1", "gemma3n", "lfm2"])
@pytest.mark.parametrize("command", ["methods", "ask"])
def test_the_cli_refuses_with_one_line_and_exit_2(name, command, tmp_path, capsys):
    from midlens.cli import main

    folder = config_only_folder(name, tmp_path)
    # ask's corpus does not exist: the model is refused first, before seconds of indexing a corpus could take
    missing = str(tmp_path / "no-corpus")
    args = ["methods"] if command == "methods" else ["ask", "who directed the film?", "--corpus", missing]
    assert main([*args, "--model", str(folder), "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("midlens:")]
    assert len(lines) == 1 and REFUSED[name][1] in lines[0] and str(folder) in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_a_hybrid_whose_config_lists_no_layer_types_is_found_from_its_layers(monkeypatch):
    """Falcon-H1's mixer sits beside self_attn in every layer; with the config's layer types gone (older configs
    list none), the layers' modules (a causal Conv1d, a state-space A_log) still give it away."""
    config = random_config("falcon_h1", **{**SHAPE, "head_dim": 16, "vocab_size": 512})
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    monkeypatch.setattr(type(config), "layers_block_type", property(lambda self: None))
    assert skeleton.config.layer_types is None
    problem = non_attention_problem(skeleton)
    assert problem is not None and problem.startswith("layers 0-3 mix tokens outside attention")
    assert "mamba (FalconH1Mixer)" in problem


def test_reading_a_layer_never_raises_from_inside_torch_or_transformers():
    """A module whose forward fails on the reader's one-token probe is refused naming it and the failure, rather
    than surfacing as an IndexError from inside the module."""
    from transformers.models.llama.modeling_llama import LlamaAttention

    class Broken(LlamaAttention):
        def forward(self, hidden_states, **kwargs):
            return [][0]

    config = random_config("llama", **{**SHAPE, "vocab_size": 512})
    with torch.device("meta"):
        attn = Broken(config, 0)
    with pytest.raises(UnsupportedAttention, match=r"Broken could not be read \(IndexError: list index out of range\)"):
        read_anatomy(attn, None)


def _config_json(model_type: str, **fields) -> str:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **fields).to_json_string()


# Folders transformers' own text refused in several lines (783 bytes for an unknown model_type; 3,470 listing every
# config class for T5): folder kind -> (its config.json, what the one-line refusal must say).
UNREADABLE = {
    "unknown-model-type": (
        '{"model_type": "xyz", "hidden_size": 64}',
        "unknown model_type 'xyz' (transformers ",
    ),
    "encoder-decoder": (
        lambda: _config_json("t5", d_model=64, num_layers=2, num_heads=4, d_ff=128, d_kv=16, vocab_size=512),
        "model_type 't5' is an encoder-decoder; midlens runs decoder-only RoPE models",
    ),
    "encoder-only": (
        lambda: _config_json("distilbert", dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=512),
        "model_type 'distilbert' has no causal language model in transformers",
    ),
    "no-model-type": ('{"hidden_size": 64}', "config.json names no model_type"),
    "not-json": ('{"model_type": "llama",', "config.json is not valid JSON"),
    "not-an-object": ("[64, 128]", "config.json holds a JSON list"),
}


def config_json_folder(kind: str, root: Path) -> Path:
    """A folder holding nothing but its config.json: every refusal here comes before a tokenizer or weight is read."""
    text = UNREADABLE[kind][0]
    folder = root / kind
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(text() if callable(text) else text, encoding="utf-8")
    return folder


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
def test_a_folder_of_no_decoder_transformers_runs_is_refused_in_one_line_naming_it(kind, tmp_path):
    folder = config_json_folder(kind, tmp_path)
    with pytest.raises(ModelError) as err:
        load_model(str(folder), "cpu", "float32")
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message
    assert str(folder) in message and UNREADABLE[kind][1] in message


@pytest.mark.parametrize("kind", ["unknown-model-type", "encoder-decoder", "encoder-only"])
def test_the_cli_refuses_a_folder_transformers_cannot_run_in_one_line_before_the_corpus(kind, tmp_path, capsys):
    from midlens.cli import main

    folder = config_json_folder(kind, tmp_path)
    missing = str(tmp_path / "no-corpus")  # refused before the corpus is read (or indexed, which takes seconds)
    assert main(["ask", "who directed the film?", "--corpus", missing, "--model", str(folder), "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("midlens: error: ")
    assert str(folder) in lines[0] and UNREADABLE[kind][1] in lines[0]
    assert "Traceback" not in captured.err + captured.out
