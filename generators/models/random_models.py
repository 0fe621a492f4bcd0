"""Model folders with random weights: a packaged model's shape for benchmarks, or any config for tests.

Speed and memory depend on shapes only, so a benchmark can run on a machine the packaged weights cannot reach;
tests build tiny models the same way. A folder loads like any `--model PATH` one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

# Shapes of the packaged models; the tokenizer (and so the vocabulary) comes from the folder given.
RANDOM_SHAPES = {
    "smollm2-135m": dict(
        model_type="llama",
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=1e5,
        tie_word_embeddings=True,
    ),
    "qwen2.5-coder-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
    # Llama 3.2 1B: 16 layers, 2048 hidden, 32 / 8 heads (head_dim 64), its 128256-token vocabulary (whatever the
    # tokenizer given: ids beyond it are never fed), llama3 RoPE scaling, tied embeddings.
    "llama-3.2-1b": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        vocab_size=128256,
        tie_word_embeddings=True,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=5e5,
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    ),
}


def random_config(model_type: str, **fields) -> PreTrainedConfig:
    """The config of transformers' `model_type` (llama, qwen3, gemma3_text, ...) with `fields`, naming its
    causal-LM class."""
    return AutoConfig.for_model(model_type, **fields, architectures=[MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]])


def save_random_weights(
    config: PreTrainedConfig, tokenizer, folder: str | Path, seed: int = 0, dtype: torch.dtype = torch.float32
) -> Path:
    """A model folder: `config` with weights drawn from `seed` (stored in `dtype`), and `tokenizer`."""
    torch.manual_seed(seed)
    folder = Path(folder)
    AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_random_model(
    shape: str, folder: str | Path, tokenizer_dir: str | Path, dtype: torch.dtype = torch.float32
) -> Path:
    """A model folder with the architecture of `shape` (a RANDOM_SHAPES name), random weights stored in `dtype`, and
    the tokenizer (and chat template) of `tokenizer_dir`."""
    spec = dict(RANDOM_SHAPES[shape])
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    spec.setdefault("vocab_size", len(tokenizer))  # a shape with its own vocabulary keeps it
    config = random_config(spec.pop("model_type"), **spec)
    folder = save_random_weights(config, tokenizer, folder, dtype=dtype)
    template = Path(tokenizer_dir) / "chat_template.jinja"
    if template.exists():
        shutil.copy(template, folder / template.name)
    return folder
