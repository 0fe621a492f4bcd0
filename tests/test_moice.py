"""MoICE on the real SmolLM2-135M: expert bases, routing, the routed (top-K only) attention, the KV cache,
router-only training and its artefact, and the shipped routers."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F

from midlens.core.errors import ArtefactError, MethodConfigError
from midlens.generators import Generator
from midlens.generators.methods.install import MethodParts, method_context
from midlens.generators.methods.moice import MoiceScheme, new_schemes, routed_attention
from midlens.generators.methods.registry import build_parts, method_config
from midlens.generators.methods.rope_bases import complementary_bases, waveform
from midlens.training.data import data_record
from midlens.training.loop import LoopConfig
from midlens.training.moice import MoiceConfig, MoiceObjective, train_moice
from tests.conftest import planted_passages

SMOL_BASES = complementary_bases(1e5, 64, 7)
LLAMA2_PUBLISHED = [10000, 17500, 18000, 19000, 20000, 22500, 25000]


def one_hot(index: int, n: int = 7) -> torch.Tensor:
    w = torch.zeros(n)
    w[index] = 1.0
    return w


def test_expert_bases_are_derived_for_the_model_and_fill_the_native_troughs():
    assert SMOL_BASES[0] == 1e5 and len(set(SMOL_BASES)) == 7
    assert all(1e5 < b <= 2.5e5 for b in SMOL_BASES[1:])
    assert not set(SMOL_BASES) & set(LLAMA2_PUBLISHED)  # never the Llama-2 set for another base
    # The criterion, checked against chance: the chosen set's upper envelope sits higher (shallower troughs)
    # than that of any of 30 random sets of the same size drawn from the same 1x-2.5x range.
    distances = torch.arange(1, 4097)

    def envelope_mean(bases):
        return float(torch.stack([waveform(distances, b, 64) for b in bases]).max(0).values.mean())

    chosen = envelope_mean(SMOL_BASES)
    rng = random.Random(0)
    for _ in range(30):
        others = [1e5] + [1e5 * 2.5 ** rng.random() for _ in range(6)]
        assert chosen >= envelope_mean(others)
    # For Llama-2's head_dim and base the criterion lands in the range of the published search (1.75x-2.5x).
    llama = complementary_bases(1e4, 128, 7)
    assert llama[0] == 1e4 and min(llama[1:]) >= 17500 and max(llama) == 25000


def _logits(loaded, ids, parts):
    with torch.no_grad(), method_context(loaded, parts):
        return loaded.model(input_ids=ids).logits


def _prompt_ids(loaded, n_passages: int = 4) -> torch.Tensor:
    from midlens.generators.models.prompt import render

    prompt = render(loaded.tokenizer, planted_passages(n_passages, 2), "What is the secret code word?")
    return torch.tensor([prompt.input_ids])


def test_a_router_forced_onto_the_native_base_reproduces_the_baseline_logits(loaded):
    ids = _prompt_ids(loaded)
    schemes = new_schemes(loaded.model, SMOL_BASES, top_k=3)
    for s in schemes:
        s.fixed_weights = one_hot(0)
    base = _logits(loaded, ids, None)
    forced = _logits(loaded, ids, MethodParts(schemes))
    assert torch.equal(forced, base)  # expert 0 uses the model's own RoPE tables and the others are skipped
    for s in schemes:
        s.fixed_weights = one_hot(3)  # another base alone changes the answer distribution: the experts are real
    assert (_logits(loaded, ids, MethodParts(schemes)) - base).abs().max() > 0.1


def test_equal_weights_over_all_experts_match_a_direct_reference(loaded):
    """K = N with equal weights: the layer's output is the mean over bases of eager softmax attention."""
    from midlens.generators.attention.positional_attention import install_positional_attention
    from midlens.generators.attention.rope import apply_rotary, rotary_tables

    attn = install_positional_attention(loaded.model)[5]
    scheme = MoiceScheme(loaded.model.model.rotary_emb.inv_freq, attn.num_heads, attn.num_kv_heads, SMOL_BASES, 7)
    scheme.fixed_weights = torch.full((7,), 1 / 7)
    torch.manual_seed(0)
    hidden = torch.randn(1, 12, loaded.model.config.hidden_size)
    positions = torch.arange(12)[None]
    attn.use(scheme)
    try:
        with torch.no_grad():
            got = attn(hidden, position_embeddings=None, position_ids=positions)[0]
    finally:
        attn.use()
    with torch.no_grad():
        q = attn.q_proj(hidden).view(1, 12, -1, 64).transpose(1, 2)
        k = attn.k_proj(hidden).view(1, 12, -1, 64).transpose(1, 2).repeat_interleave(attn.num_key_value_groups, 1)
        v = attn.v_proj(hidden).view(1, 12, -1, 64).transpose(1, 2).repeat_interleave(attn.num_key_value_groups, 1)
        causal = torch.ones(12, 12, dtype=torch.bool).tril()
        mixed = 0
        for base in SMOL_BASES:
            inv_freq = base ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
            cos, sin = rotary_tables(positions, inv_freq.float()[None])
            qe, ke = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            scores = (qe @ ke.transpose(-1, -2) * attn.scaling).masked_fill(~causal, float("-inf"))
            mixed = mixed + torch.softmax(scores, -1) @ v / 7
        want = attn.o_proj(mixed.transpose(1, 2).reshape(1, 12, -1))
    # fp32, different summation order (SDPA vs eager) over 12 keys: agreement to 1e-5 of outputs of size ~1.
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_routed_attention_equals_the_dense_weighted_attention():
    """Top-K routing leaves each expert a subset of queries; computing only those rows gives the same output."""
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 6, 40, 16), torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)
    weight = torch.rand(2, 6, 40, 1) * (torch.rand(2, 6, 40, 1) < 0.3)  # ~30 % of queries routed here
    dense = weight * F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
    routed = routed_attention(q, k, v, weight, None, 0, 0.25)
    assert routed is not None
    torch.testing.assert_close(routed, dense, atol=1e-6, rtol=1e-5)
    # A chunk after a cached prefix (explicit mask, offset positions) takes the same path.
    kk, vv = torch.randn(2, 2, 50, 16), torch.randn(2, 2, 50, 16)
    mask = torch.ones(40, 50, dtype=torch.bool).tril(10)[None, None]
    dense = weight * F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(routed_attention(q, kk, vv, weight, mask, 10, 0.25), dense, atol=1e-6, rtol=1e-5)
    # Every query routed here: no saving, the caller runs the dense path.
    assert routed_attention(q, k, v, torch.ones(2, 6, 40, 1), None, 0, 0.25) is None


def test_decoding_with_the_cache_equals_recomputation(loaded):
    ids = _prompt_ids(loaded, 3)
    parts = MethodParts(new_schemes(loaded.model, SMOL_BASES, top_k=3, seed=3))
    extra = torch.tensor([[504, 1173, 314]])  # three more tokens, fed one at a time through the cache
    with torch.no_grad(), method_context(loaded, parts):
        out = loaded.model(input_ids=ids, use_cache=True)
        cache, steps = out.past_key_values, []
        for t in range(extra.shape[1]):
            step = loaded.model(input_ids=extra[:, t : t + 1], past_key_values=cache, use_cache=True)
            steps.append(step.logits[0, -1])
            cache = step.past_key_values
        full = loaded.model(input_ids=torch.cat([ids, extra], 1), use_cache=False).logits[0, -3:]
    # Same math, different kernels (one query row vs the routed prefill path): fp32 logits agree to 1e-3.
    torch.testing.assert_close(torch.stack(steps), full, atol=1e-3, rtol=1e-4)


def test_the_balance_loss_has_a_gradient_only_when_k_is_below_n(loaded):
    q = torch.randn(1, 9, 30, 64)
    grads, losses = {}, {}
    for k in (3, 7):
        torch.manual_seed(0)
        scheme = MoiceScheme(loaded.model.model.rotary_emb.inv_freq, 9, 3, SMOL_BASES, k)
        scheme.mixing_weights(q, None)
        loss = scheme.aux_loss()
        loss.backward()
        grads[k] = float(sum(p.grad.abs().sum() for p in scheme.router.parameters()))
        losses[k] = loss.item()
    assert grads[3] > 1e-3
    # K = N (the official default): the loss is the constant 1; what is left of its gradient is fp32 rounding.
    assert losses[7] == pytest.approx(1.0, abs=1e-6)
    assert grads[7] < 1e-4 * grads[3]


@pytest.fixture(scope="module")
def tiny_slice(loaded):
    """Two short training examples (3 passages, the planted fact first or last): ~300 tokens each, so a few
    forward+backward passes through 7 experts x 30 layers stay within seconds on a CPU."""
    from midlens.generators.models.prompt import render
    from midlens.training.data import TrainExample

    tok = loaded.tokenizer
    answer = tok(" pelican", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    question = "What is the secret code word of the Zorbland expedition?"
    return [
        TrainExample(f"planted-{at}", render(tok, planted_passages(3, at), question), answer, [at - 1]) for at in (1, 3)
    ]


def test_a_few_router_steps_lower_the_loss_on_a_fixed_batch(loaded, tiny_slice):
    schemes = new_schemes(loaded.model, SMOL_BASES, top_k=3, seed=0)
    objective = MoiceObjective(loaded, schemes, MoiceConfig(tuple(SMOL_BASES)))
    params = [p for s in schemes for p in s.router.parameters()]
    before = [p.detach().clone() for p in loaded.model.parameters()][:5]
    opt = torch.optim.Adam(params, lr=1e-2)
    losses = []
    for _ in range(4):  # one example: a fixed batch is what the test needs, and each step costs 7 experts' passes
        opt.zero_grad()
        total = objective(tiny_slice[-1])[0]
        total.backward()
        opt.step()
        losses.append(total.item())
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(torch.equal(a, b) for a, b in zip(before, list(loaded.model.parameters())[:5], strict=True))
    assert all(p.grad is None for p in loaded.model.parameters())  # router-only: the shared model gets none


def test_trained_routers_save_as_a_verified_artefact_and_load_by_spec(loaded, tiny_slice, tmp_path):
    out = tmp_path / "routers"
    config = MoiceConfig(tuple(SMOL_BASES))
    loop = LoopConfig(examples=2, batch=2, lr=1e-3)
    result = train_moice(loaded, tiny_slice, config, loop, str(out), data_record(tiny_slice, 0, None), progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["experts"] == {"bases": SMOL_BASES, "top_k": 3, "per_head": False}
    assert meta["parameters"] == 30 * (2 * 64 * 7 + 7 * 7) == result["meta"]["parameters"]
    parts = build_parts(method_config(f"moice(artefact='{out}')"), loaded)
    assert [s.top_k for s in parts.schemes[:1]] == [3] and all(not p.requires_grad for p in parts.trainable())
    gen = Generator(loaded, method=f"moice(artefact='{out}', top_k=1)")
    answer = gen.generate(gen.prompt("What is the secret code word?", planted_passages(4, 2)), max_new_tokens=4)
    evidence = [p.evidence for p in answer.passages]
    assert len(evidence) == 4 and all(e > 0 for e in evidence)
    assert sum(evidence) <= 1.0 + 1e-4  # expert-mixed attention rows are still distributions over the keys

    # Router usage: every (token, head) picks top_k=3 experts, so per layer the shares sum to 1.
    from midlens.cli import main

    assert main(["methods", f"moice(artefact='{out}')", "--model", "smollm2-135m", "--n", "2", "--max-words", "12",
                 "--out", str(tmp_path / "inspect"), "--device", "cpu"]) == 0  # fmt: skip
    usage = json.loads((tmp_path / "inspect" / "moice-usage.json").read_text())
    assert (tmp_path / "inspect" / "moice-bases.png").stat().st_size > 0
    assert usage["bases"] == SMOL_BASES and len(usage["per_layer"]) == 30
    assert all(abs(sum(row) - 1.0) < 1e-5 for row in usage["per_layer"])

    with pytest.raises(ArtefactError, match="no such folder"):
        build_parts(method_config("moice(artefact='/nonexistent/routers')"), loaded)
    with pytest.raises(MethodConfigError, match="choose among 7 experts"):
        build_parts(method_config(f"moice(artefact='{out}', top_k=8)"), loaded)
    meta["experts"]["bases"][0] = 1e4  # routers made for another RoPE base
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(MethodConfigError, match="RoPE base is 100000"):
        build_parts(method_config(f"moice(artefact='{out}')"), loaded)


def test_bad_moice_options_are_refused_before_loading():
    for spec, match in (("moice(top_k=0)", "top_k"), ("moice(top_k=1.5)", "top_k"), ("moice(artefact=3)", "folder")):
        with pytest.raises(MethodConfigError, match=match):
            method_config(spec)


def test_shipped_routers_load_by_default(loaded):
    from midlens.generators.models.shipped import shipped_path

    meta = json.loads((shipped_path("moice", "smollm2-135m") / "meta.json").read_text())
    assert meta["experts"]["bases"] == SMOL_BASES  # shipped with the bases this code derives for the model
    assert meta["data"]["split"].startswith("train")
    gen = Generator(loaded, method="moice")
    assert [s.top_k for s in gen.parts.schemes] == [3] * 30
    answer = gen.generate(gen.prompt("What is the secret code word?", planted_passages(4, 2)), max_new_tokens=4)
    assert answer.generated_tokens > 0 and len(answer.passages) == 4


def test_the_expert_table_is_built_on_the_device_of_the_models_inv_freq():
    # Training on a GPU once failed here: the extra bases were made on the CPU and concatenated with the
    # model's CUDA inv_freq. The meta device stands in for CUDA (no GPU in the test suite): mixing it with a CPU
    # tensor fails the same way.
    inv_freq = (1e5 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)).float().to("meta")
    scheme = MoiceScheme(inv_freq, 9, 3, SMOL_BASES, top_k=3)
    assert scheme.expert_inv_freq.device.type == "meta"
    assert tuple(scheme.expert_inv_freq.shape) == (7, 32)
