"""A RoPE whose tables switch with the length (LongRoPE): batched rows equal each row alone, and alone equals
transformers alone.

transformers picks LongRoPE's short or long factors per forward from the batch's largest position; midlens batches
only rows on the same side of the switch (generators.attention.rope_regimes). Tolerance: 1e-4 on log-probabilities and
evidence maps in fp32 (tests/test_batch.py's; a batch only reorders sums), greedy tokens identical. Rotating a short
row with the long factors moves its token log-probabilities by 1.2e-3 on the tiny random model (measured below: the
equality fails without the grouping); on Phi-3 itself by up to 1.97 (issue 69).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from midlens.core.passage import Passage
from midlens.generators import Generator
from midlens.generators.attention import rope_regimes
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.rope_regimes import RowReach, Switch, regime_groups, rope_switches, row_reach
from midlens.generators.models.loading import load_model
from tests.test_batch import TOL, assert_rows_equal
from tests.tiny import VOCAB_SIZE, save_tiny

ORIGINAL = 124  # tokens: the tiny chat template alone is ~90, so a short prompt fits below the switch
STEPS = 10


def _passages(n: int) -> list[Passage]:
    return [Passage(text=f"the code word of city {i} is {i * 7}", title=f"city {i}") for i in range(n)]


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    # Phi3Config writes its own top-level original_max_position_embeddings over the one in rope_parameters.
    folder = save_tiny("phi3", tmp_path_factory.mktemp("phi3"), original_max_position_embeddings=ORIGINAL)
    return load_model(str(folder), "cpu", "float32")


def test_rows_on_either_side_of_the_longrope_switch_batched_equal_each_alone(phi3):
    gen = Generator(phi3)
    prompts = [
        gen.prompt("who ?", []),  # below the switch for its whole answer
        gen.prompt("what is the code word of city 2 ?", _passages(4)),  # beyond it from the prefill on
        gen.prompt("who ?", _passages(1)),  # below at the prefill, decodes across it: alone
        gen.prompt("which ?", []),  # below, batched with the first
    ]
    reach = [p.num_tokens for p in prompts]
    assert reach[0] + STEPS < ORIGINAL < reach[1]
    assert reach[2] < ORIGINAL <= reach[2] + STEPS - 2
    assert rope_switches(phi3.model) == [Switch(ORIGINAL, shared=True)]
    references = ["the code word", "city 2", "is 7 and more words to score", None]
    singles = [gen.generate(p, max_new_tokens=STEPS, reference=r) for p, r in zip(prompts, references, strict=True)]
    batched = gen.generate_batch(prompts, max_new_tokens=STEPS, references=references)
    assert_rows_equal(singles, batched)


def test_without_the_grouping_the_short_row_would_take_the_long_factors(phi3, monkeypatch):
    """The test above can fail: one batch rotates the short row with the long factors, as transformers does."""
    gen = Generator(phi3)
    prompts = [gen.prompt("who ?", []), gen.prompt("what is the code word of city 2 ?", _passages(4))]
    alone = gen.generate(prompts[0], max_new_tokens=STEPS)
    monkeypatch.setattr("midlens.generators.answering.prefill.rope_switches", lambda model: [])
    together = gen.generate_batch(prompts, max_new_tokens=STEPS)[0]
    drift = max(abs(a - b) for a, b in zip(alone.token_logprobs, together.token_logprobs, strict=False))
    assert drift > 5 * TOL  # 1.2e-3 measured
    with pytest.raises(AssertionError):
        assert_rows_equal([alone], [together])


def test_a_row_decoding_across_the_switch_alone_equals_transformers_alone(tmp_path):
    """Alone means what transformers does alone: the prefill below the switch with the short factors, each decode
    step from the switch on with the long ones (the cached keys keep the short rotation). fp32, 1e-4 on logits."""
    folder = save_tiny("phi3", tmp_path / "phi3")  # tests/tiny.py's family: original length 32
    loaded = load_model(str(folder), "cpu", "float32")
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    prompt, steps = 24, 16  # positions 0..23 at the prefill, 24..39 decoding: the switch at 32 is crossed
    ids = torch.randint(3, VOCAB_SIZE, (1, prompt + steps), generator=torch.Generator().manual_seed(0))
    gen = Generator(loaded, method="baseline")
    with torch.inference_mode():
        cache = DynamicCache(config=stock.config)
        ref = [stock(input_ids=ids[:, :prompt], past_key_values=cache, use_cache=True).logits[0]]
        ref += [stock(input_ids=ids[:, t : t + 1], past_key_values=cache).logits[0] for t in range(prompt, len(ids[0]))]
    with gen.running(None):
        cache = new_cache()
        ours = [gen.forward(ids[0, :prompt].tolist(), cache, keep=prompt)]
        ours += [gen.forward([int(ids[0, t])], cache) for t in range(prompt, prompt + steps)]
    for step, (a, b) in enumerate(zip(ref, ours, strict=True)):
        assert (a - b).abs().max().item() < 1e-4, f"step {step}"


def test_rows_are_grouped_by_the_side_of_every_switch():
    longrope, dynamic = Switch(100, shared=True), Switch(100, shared=False)
    below, beyond, across = RowReach(10, 99), RowReach(100, 300), RowReach(90, 110)
    reaches = [beyond, below, across, below, beyond]
    assert regime_groups(reaches, [longrope]) == [[0, 4], [1, 3], [2]]
    assert regime_groups(reaches, [dynamic]) == [[0], [1, 3], [2], [4]]  # beyond a dynamic switch: a table per length
    assert regime_groups(reaches, []) == [[0, 1, 2, 3, 4]]
    # The prefill's last position is prompt - 1; a decode step feeds each generated token but the last.
    assert row_reach(100, 1) == RowReach(99, 99)
    assert row_reach(100, 3, reference_tokens=5, null_prompt_tokens=90) == RowReach(89, 103)
    assert rope_regimes.side(row_reach(100, 1), longrope) == rope_regimes.BELOW
