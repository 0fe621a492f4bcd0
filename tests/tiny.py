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

from midlens.generators.random_models import random_config, save_random_weights

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


def tiny_config(kind: str, vocab_size: int = VOCAB_SIZE, **overrides):
    """The tiny config of architecture `kind` (llama, qwen2, mistral); `overrides` replace any field."""
    return random_config(kind, **{**SHAPE, **ARCHITECTURES[kind], "vocab_size": vocab_size, **overrides})


def save_tiny(kind: str, folder: Path, seed: int = 0) -> Path:
    fast = PreTrainedTokenizerFast(tokenizer_object=_tokenizer(), unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    return save_random_weights(tiny_config(kind, bos_token_id=1, eos_token_id=2), fast, folder, seed)
