"""What the anatomy reader reads from each family's layers, from the skeleton alone, and OLMo 2 in bfloat16.

tests/test_families.py checks that these readings give transformers' logits; here each reading is pinned where a
family departs from what its attributes suggest: EXAONE 4 and Cohere 2 hold rotary tables and a window on every
layer but their global layer uses neither; HunYuan normalises q and k after RoPE, under other names; StableLM
rotates half of each head and normalises each head with its own weights; Cohere pairs channels interleaved and
hands the layer tables that repeat each angle twice.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from midlens.generators import Generator
from midlens.generators.attention.anatomy import model_anatomy
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.models.loading import load_model
from tests.tiny import VOCAB_SIZE, WINDOW, save_tiny, tiny_config


def skeleton_anatomy(family: str):
    with torch.device("meta"):
        return model_anatomy(AutoModelForCausalLM.from_config(tiny_config(family)))


@pytest.mark.parametrize("family", ["exaone4", "cohere2"])
def test_the_global_layer_has_neither_window_nor_rope_though_its_module_holds_both(family):
    layers = skeleton_anatomy(family)
    assert [a.window for a in layers] == [WINDOW, WINDOW, WINDOW, None]
    assert [a.rotary for a in layers] == [True, True, True, False]


def test_hunyuan_norms_are_found_under_their_names_and_after_rope():
    layers = skeleton_anatomy("hunyuan")
    assert {(a.qk_norm, a.qk_norm_after_rope, a.norm_names) for a in layers} == {
        ("head", True, ("query_layernorm", "key_layernorm"))
    }
    assert "q/k norm per head after RoPE" in layers[0].describe()


def test_stablelm_rotates_half_of_each_head_after_its_per_head_norms():
    layers = skeleton_anatomy("stablelm")
    assert {(a.rotary_dim, a.qk_norm, a.qk_norm_after_rope, a.norm_names) for a in layers} == {
        (8, "head", False, ("q_layernorm", "k_layernorm"))
    }


def test_cohere_pairs_and_tables_are_both_interleaved():
    layers = skeleton_anatomy("cohere2")
    assert all(a.interleaved and a.interleaved_table for a in layers[:3])
    glm = skeleton_anatomy("glm4")  # interleaved pairs, but tables laid out in halves
    assert all(a.interleaved and not a.interleaved_table for a in glm)


# bfloat16 tolerance on logits: on these folders (logits up to ~0.6) transformers' own bfloat16 paths differ by up
# to 7.5e-3 from each other (eager vs SDPA) and 7e-3 from its float32 forward (3 prompts measured); our module runs
# the same bfloat16 products as transformers' SDPA path (measured difference 0). 2e-2 leaves room for another
# kernel choice and is an order below what a skipped norm or a wrong rotation gives here (0.16-0.25 in float32).
BF16_TOL = 2e-2


def test_olmo2_answers_in_bfloat16_within_the_bf16_tolerance_of_transformers(tmp_path):
    """OLMo 2 rotates in float32 (its tables are float32 whatever the layer's dtype) and returns to bfloat16."""
    folder = save_tiny("olmo2", tmp_path / "olmo2")
    loaded = load_model(str(folder), "cpu", "bfloat16")
    assert loaded.dtype == torch.bfloat16
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    ids = torch.randint(3, VOCAB_SIZE, (1, 50), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = stock(input_ids=ids).logits[0].float()
    gen = Generator(loaded)
    with gen.running(None):
        ours = gen.forward(ids[0].tolist(), new_cache(), keep=50).float()
    assert (ours - ref).abs().max().item() < BF16_TOL
    from midlens.core.passage import Passage

    passages = [Passage(text=f"the code word of city {i} is {i * 7}", title=f"city {i}") for i in range(3)]
    answer = gen.generate(gen.prompt("what is the code word of city 2 ?", passages), max_new_tokens=4)
    assert answer.text is not None and len(answer.passages) == 3
    assert all(torch.isfinite(torch.tensor(p.evidence)) for p in answer.passages)
