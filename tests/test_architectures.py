"""Ms-PoE's unit ratio and cache on tiny randomly initialised Llama, Qwen2 (q/k/v biases) and Mistral configs with
SmolLM2's vocabulary, loaded through the same path as any `--model PATH`. Every other family, and sliding windows,
are in tests/test_families.py."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from midlens.generators import Generator
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.models.loading import load_model
from midlens.generators.models.model_cache import resolve_model_dir
from tests.tiny import ARCHITECTURES, tiny_config

LOGIT_TOL = 1e-4

SMOL_VOCAB = 49152  # SmolLM2's tokenizer is reused


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(request.param, SMOL_VOCAB))
    model.save_pretrained(folder)
    smol = resolve_model_dir("smollm2-135m")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smol / name).exists():
            shutil.copy(smol / name, folder / name)
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    return load_model(str(folder)), stock


def test_baseline_and_unit_ratio_ms_poe_match_stock(tiny):
    loaded, stock = tiny
    ids = torch.randint(0, 49152, (1, 40))
    with torch.inference_mode():
        ref = stock(ids).logits
    for gen in (Generator(loaded), Generator(loaded, method="ms-poe", ratio_min=1.0, ratio_max=1.0, layers=[0, 3])):
        with gen.running(None):
            ours = gen.forward(ids[0].tolist(), new_cache(), keep=40)
        assert (ref[0] - ours).abs().max().item() < LOGIT_TOL


@pytest.mark.parametrize("gqa", ["group", "per_query_head"])
def test_ms_poe_cache_matches_recomputation(tiny, gqa):
    loaded, _ = tiny
    gen = Generator(loaded, method="ms-poe", gqa=gqa, layers=[1, 2, 3])
    ids = torch.randint(0, 49152, (30,)).tolist()
    with gen.running(None):
        cache = new_cache()
        cached = [gen.forward(ids[:27], cache)[-1]] + [gen.forward([t], cache)[-1] for t in ids[27:]]
    for s in gen.parts.schemes:  # keep the prefill's head order for the one-pass recomputation
        s.start_sequence = lambda q, k, key_mask=None: None
    with gen.running(None):
        full = gen.forward(ids, new_cache(), keep=4)
    assert (torch.stack(cached) - full).abs().max().item() < LOGIT_TOL
