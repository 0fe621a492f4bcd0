"""Tiny randomly initialised Llama / Qwen2 models with a word-level tokenizer: the fast test tier.

They load through the same path as any `--model PATH` folder and need no packaged model, so device, dtype,
registry, delta and artefact plumbing are tested in seconds; behaviour on real weights is tested with
SmolLM2-135M elsewhere. The tokenizer is a byte-level BPE trained on the words below: transformers 5 loads
a Qwen2 folder's tokenizer as `Qwen2Tokenizer` (byte-level) whatever tokenizer.json says, so a word-level
tokenizer would lose every word there.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from midlens.generators.models.random_models import random_config, save_random_weights

WORDS = (
    "the a of and in to is was by for on with as at from his her it document title question answer "
    "secret code word zorbland expedition pelican film directed year city river who what which when "
).split()
SPECIAL = ["<unk>", "<s>", "</s>"]
VOCAB_SIZE = 512


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [" ".join(WORDS), " ".join(str(i) for i in range(100)), "N/A . , : ; ? ! ( ) [ ] ' \" -"]
    tok.train_from_iterator(corpus * 4, trainer)
    return tok


# The shape every tiny model shares; tests/test_architectures.py builds its models from the same configs.
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
# The fields each architecture adds to the shape.
ARCHITECTURES = {
    "llama": dict(rope_theta=10000.0),
    "qwen2": dict(rope_theta=1e6, use_sliding_window=False),
    "mistral": dict(rope_theta=1e6, sliding_window=None),
}
# A window shorter than the test prompts, so the windowed layers really hide keys.
WINDOW = 16
# The model families of tests/test_families.py: each a transformers model_type at the tiny shape, keeping what its
# attention does differently (the quirk named in the comment). Keys are the names the family table uses.
FAMILIES = {
    "llama": dict(model_type="llama", rope_theta=10000.0),
    "llama3-rope-scaling": dict(  # Llama 3.1's frequency-dependent RoPE scaling
        model_type="llama",
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=5e5,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "qwen2": dict(model_type="qwen2", rope_theta=1e6, use_sliding_window=False),  # q/k/v biases
    "qwen2-sliding": dict(  # windows on the layers from max_window_layers up
        model_type="qwen2", rope_theta=1e6, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2
    ),
    "qwen3": dict(model_type="qwen3", head_dim=16, rope_theta=1e6),  # q/k RMS norm per head before RoPE
    "mistral": dict(model_type="mistral", rope_theta=1e6, sliding_window=WINDOW),  # one window, every layer
    "ministral": dict(  # Ministral: alternating windowed and full layers
        model_type="ministral",
        head_dim=16,
        rope_parameters=dict(rope_type="default", rope_theta=1e6),
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"] * 2,
    ),
    "gemma2": dict(  # logit soft-cap, alternating windows, query_pre_attn_scalar, scaled embeddings
        model_type="gemma2",
        head_dim=16,
        sliding_window=WINDOW,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=24,
    ),
    "gemma3": dict(  # q/k norm, local (windowed, own RoPE base) and global layers
        model_type="gemma3_text",
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
            "full_attention": dict(rope_type="linear", rope_theta=1e6, factor=8.0),
        },
    ),
    "phi3": dict(  # fused qkv_proj, partial rotary (Phi-4-mini's 0.75), LongRoPE factors
        model_type="phi3",
        partial_rotary_factor=0.75,
        rope_parameters=dict(
            rope_type="longrope",
            rope_theta=1e4,
            short_factor=[1.0] * 6,
            long_factor=[1.5] * 6,
            original_max_position_embeddings=32,
        ),
        original_max_position_embeddings=32,  # Phi3Config writes this one (default 4096) into rope_parameters
        pad_token_id=0,
    ),
    "olmo2": dict(model_type="olmo2", rope_theta=5e5),  # q/k RMS norm over the whole projection
    "smollm3": dict(  # NoPE layers: every fourth layer has no RoPE
        model_type="smollm3",
        rope_theta=2e6,
        no_rope_layers=[1, 1, 1, 0],
        use_sliding_window=False,
        pad_token_id=0,
    ),
    "granite": dict(  # attention multiplier as the scale; embedding, residual and logits multipliers
        model_type="granite",
        attention_multiplier=0.05,
        embedding_multiplier=6.0,
        residual_multiplier=0.3,
        logits_scaling=4.0,
    ),
    "glm4": dict(  # interleaved, half-rotary RoPE
        model_type="glm4", head_dim=16, partial_rotary_factor=0.5, pad_token_id=0
    ),
    "exaone4": dict(  # windowed RoPE layers and a global layer without RoPE (its module holds a window and the tables)
        model_type="exaone4",
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    ),
    "hunyuan": dict(  # q/k RMS norms named query_layernorm / key_layernorm, applied after RoPE
        model_type="hunyuan_v1_dense", head_dim=16, rope_theta=1e4
    ),
    "stablelm": dict(  # partial rotary (0.5) and a LayerNorm per head, with each head's own weights
        model_type="stablelm", partial_rotary_factor=0.5, qk_layernorm=True
    ),
    "cohere2": dict(  # interleaved pairs with interleaved cos/sin tables; windowed RoPE layers, a global NoPE layer
        model_type="cohere2",
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    ),
}


def tiny_config(kind: str, vocab_size: int = VOCAB_SIZE, **overrides):
    """The tiny config of architecture `kind` (llama, qwen2, mistral, or a FAMILIES name); `overrides` replace any
    field."""
    if kind in FAMILIES:
        spec = dict(FAMILIES[kind])
        return random_config(spec.pop("model_type"), **{**SHAPE, **spec, "vocab_size": vocab_size, **overrides})
    return random_config(kind, **{**SHAPE, **ARCHITECTURES[kind], "vocab_size": vocab_size, **overrides})


def save_tiny(kind: str, folder: Path, seed: int = 0, **overrides) -> Path:
    fast = PreTrainedTokenizerFast(tokenizer_object=_tokenizer(), unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    return save_random_weights(tiny_config(kind, bos_token_id=1, eos_token_id=2, **overrides), fast, folder, seed)
