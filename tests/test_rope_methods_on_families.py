"""The RoPE-rewriting methods (Ms-PoE, MoICE, Attention Buckets, RoPE scaling) on families whose RoPE is not one
plain table: llama3 scaling, Gemma 3's per-type bases (its global layers linear-scaled here), Phi-3's LongRoPE in
both regimes with partial rotary and an attention factor, SmolLM3's NoPE layers, GLM-4's interleaved half rotary.

Three kinds of check:
  - identity cases equal the baseline EXACTLY (torch.equal) at prefill and over cached decode steps: they must use
    the model's own tables, so any difference is a bug, not rounding;
  - methods whose result transformers can compute on its own are compared with transformers' forward of the same
    weights under the equivalent config (Ms-PoE with one ratio r everywhere = every frequency divided by r; one
    Attention-Buckets base b' = every layer's rope_theta carried by the ratio b'/b): the reference never touches
    our rebasing code. LOGIT_TOL = 1e-4 as in tests/test_families.py (fp32, SDPA vs our kernels; a wrong
    frequency, factor regime or scaling moves them by more than 10x that, which each check asserts of its own case);
  - batched = alone, and `midlens methods --model` refuses none of them for a reason of shape.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from midlens.core.passage import Passage
from midlens.generators import Generator, load_model
from midlens.generators.attention.anatomy import layer_ropes, model_anatomy
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.rope import rebase
from midlens.generators.methods.install import MethodParts, method_context
from midlens.generators.methods.moice import new_schemes, routed_schemes
from midlens.generators.methods.ms_poe import MsPoEScheme, position_awareness
from midlens.generators.methods.registry import build_parts, method_config
from midlens.generators.methods.rope_bases import complementary_bases, rope_base, rotary_dim_of
from tests.test_batch import assert_rows_equal
from tests.tiny import FAMILIES, VOCAB_SIZE, WINDOW, save_tiny

LOGIT_TOL = 1e-4
STEPS = 4
# name -> (tiny family, overrides, prompt length). Phi-3 with original_max_position_embeddings 32: a 20-token
# prompt (+ STEPS) stays in LongRoPE's short regime, a 40-token one is in the long regime from its prefill.
CASES = {
    "llama3-rope-scaling": ("llama3-rope-scaling", {}, 40),
    "gemma3": ("gemma3", {}, 40),
    "phi3-short": ("phi3", {"original_max_position_embeddings": 32}, 20),
    "phi3-long": ("phi3", {"original_max_position_embeddings": 32}, 40),
    "smollm3": ("smollm3", {}, 40),
    "glm4": ("glm4", {}, 40),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    family, overrides, prompt = CASES[request.param]
    folder = save_tiny(family, tmp_path_factory.mktemp(request.param), **overrides)
    return request.param, folder, load_model(str(folder), "cpu", "float32"), prompt


def _ids(length: int) -> torch.Tensor:
    return torch.randint(3, VOCAB_SIZE, (1, length), generator=torch.Generator().manual_seed(0))


def _steps(loaded, parts: MethodParts | None, ids: torch.Tensor, prompt: int) -> list[torch.Tensor]:
    """Logits of the prefill of `prompt` tokens, then of each cached decode step."""
    cache = new_cache()
    with torch.inference_mode(), method_context(loaded, parts):
        out = [loaded.model(input_ids=ids[:, :prompt], past_key_values=cache).logits[0]]
        for t in range(prompt, ids.shape[1]):
            out.append(loaded.model(input_ids=ids[:, t : t + 1], past_key_values=cache).logits[0])
    return out


def test_identity_cases_equal_the_baseline_exactly(case):
    name, _, loaded, prompt = case
    ids = _ids(prompt + STEPS)
    baseline = _steps(loaded, None, ids, prompt)
    layers = list(range(loaded.model.config.num_hidden_layers))
    reference = rope_base(loaded.model.config)
    specs = [
        f"ms-poe(ratio_min=1.0, ratio_max=1.0, layers={layers})",
        f"ms-poe(ratio_min=1.0, ratio_max=1.0, layers={layers}, gqa='per_query_head')",
        f"attention-buckets(bases=[{reference}])",
        "rope-scaling(factor=1.0)",
        "rope-scaling(kind='ntk', factor=1.0)",
    ]
    for spec in specs:
        got = _steps(loaded, build_parts(method_config(spec), loaded), ids, prompt)
        assert all(torch.equal(a, b) for a, b in zip(baseline, got, strict=True)), f"{name}: {spec}"
    # MoICE routed to each layer's native base only (expert 0 of every routed layer).
    bases = complementary_bases(reference, rotary_dim_of(loaded.model), 3)
    schemes = new_schemes(loaded.model, bases, top_k=2)
    for s in routed_schemes(schemes).values():
        s.fixed_weights = torch.tensor([1.0, 0.0, 0.0])
    got = _steps(loaded, MethodParts(schemes), ids, prompt)
    assert all(torch.equal(a, b) for a, b in zip(baseline, got, strict=True)), f"{name}: moice on the native base"
    # ... and routed to another base, the answer moves (little on a 40-token prompt of a 5e5-base model, whose
    # changed low frequencies barely turn): the other experts are real rotations on every family.
    for s in routed_schemes(schemes).values():
        s.fixed_weights = torch.tensor([0.0, 0.0, 1.0])
    assert (_steps(loaded, MethodParts(schemes), ids, prompt)[0] - baseline[0]).abs().max() > 1e-5


def _stock(folder, change) -> torch.nn.Module:
    """transformers' own model of `folder` with its rope_parameters changed by `change(params, rope_type) -> dict`
    (per layer type where the config keeps one set per type)."""
    config = AutoConfig.from_pretrained(folder)
    params = config.rope_parameters
    if all(isinstance(v, dict) for v in params.values()):
        config.rope_parameters = {t: change(dict(p)) for t, p in params.items()}
    else:
        config.rope_parameters = change(dict(params))
    return AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()


def _divide_frequencies(ratio: float):
    """Every frequency divided by `ratio`, in transformers' own terms: a linear factor (times the existing one), or
    LongRoPE's per-channel factors times the ratio (its attention factor does not depend on them)."""

    def change(p: dict) -> dict:
        kind = p.get("rope_type", "default")
        if kind == "longrope":
            return p | {key: [f * ratio for f in p[key]] for key in ("short_factor", "long_factor")}
        if kind in ("default", "linear"):
            return p | {"rope_type": "linear", "factor": p.get("factor", 1.0) * ratio}
        raise AssertionError(f"no transformers equivalent written for {kind}")

    return change


def _compare_with_stock(loaded, folder, spec, change, ids) -> None:
    stock = _stock(folder, change)
    with torch.inference_mode():
        want = stock(input_ids=ids).logits[0]
        native = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(input_ids=ids).logits[0]
    got = _steps(loaded, build_parts(method_config(spec), loaded), ids, ids.shape[1])[0]
    diff = (got - want).abs().max().item()
    assert diff < LOGIT_TOL, f"{spec}: {diff:.2e} from transformers' forward with the equivalent RoPE"
    # Random tiny weights on short prompts move little with RoPE: at least 10x the tolerance, or the check is empty.
    assert (native - want).abs().max().item() > 10 * LOGIT_TOL, "the equivalent RoPE changed nothing"


@pytest.mark.parametrize("case", [c for c in sorted(CASES) if c != "llama3-rope-scaling"], indirect=True)
def test_ms_poe_with_one_ratio_is_transformers_with_every_frequency_divided(case):
    """Ms-PoE compresses positions on the layer's own (scaled, per-type, current-regime) frequencies, keeps its
    attention factor and leaves NoPE layers alone: with one ratio on every layer and head it is transformers'
    forward with each layer's frequencies divided by that ratio. (llama3 has no transformers spelling of "divided".)"""
    _, folder, loaded, prompt = case
    layers = list(range(loaded.model.config.num_hidden_layers))
    spec = f"ms-poe(ratio_min=1.5, ratio_max=1.5, layers={layers})"
    _compare_with_stock(loaded, folder, spec, _divide_frequencies(1.5), _ids(prompt))


@pytest.mark.parametrize("case", [c for c in sorted(CASES) if c != "llama3-rope-scaling"], indirect=True)
def test_one_bucket_base_is_transformers_with_each_layers_base_carried_by_the_ratio(case):
    """A base change b -> b' on a plain, linear or LongRoPE schedule is that schedule computed from b' (the factors
    do not depend on the base), and Gemma 3's local layers move by the same ratio as its global ones."""
    _, folder, loaded, prompt = case
    ratio = 0.2  # a lower base turns the low frequencies faster: a visible change within a 20-40 token prompt
    reference = rope_base(loaded.model.config)

    def change(p: dict) -> dict:
        return p | {"rope_theta": p["rope_theta"] * ratio}

    _compare_with_stock(loaded, folder, f"attention-buckets(bases=[{reference * ratio}])", change, _ids(prompt))


def test_a_base_change_is_a_per_channel_ratio_on_the_layers_own_schedule(tmp_path):
    """llama3 scaling: each channel moves by (b / b')^(2i/d) from the llama3 frequency, so the channels llama3 left
    alone move as a plain schedule would and the interpolated ones keep their factor; a plain schedule is computed
    from the new base itself, bit for bit what the methods computed before they composed with scaled schedules."""
    loaded = load_model(str(save_tiny("llama3-rope-scaling", tmp_path / "l3")), "cpu", "float32")
    rope = layer_ropes(loaded.model)[0]
    inv_freq, _ = rope.frequencies()
    d = rope.rotary_dim
    steps = torch.arange(0, d, 2, dtype=torch.float64) / d
    new = 2.0 * rope.native_base
    got = rope.rebased([new])[0].double()
    torch.testing.assert_close(got / inv_freq.double(), (rope.native_base / new) ** steps, rtol=1e-6, atol=0)
    plain_native = rope.native_base**-steps
    factor = (inv_freq.double() / plain_native).float()
    assert factor.min() < 0.2 and factor.max() == pytest.approx(1.0)  # it is scaled: factor 8 on the low frequencies
    torch.testing.assert_close((got / new**-steps).float(), factor, rtol=1e-6, atol=0)
    plain = rebase(inv_freq, rope.native_base, [new], plain=True)[0]
    assert torch.equal(plain, (new**-steps).float())


def _passages(n: int) -> list[Passage]:
    return [Passage(text=f"the code word of city {i} is {i * 7}", title=f"city {i}") for i in range(n)]


@pytest.mark.parametrize("case", ["gemma3", "phi3-long", "smollm3", "llama3-rope-scaling"], indirect=True)
def test_batched_rows_equal_each_prompt_alone(case):
    """Rows of one batch run the method as each prompt alone (all in one LongRoPE regime: grouping rows by regime
    is the batching layer's)."""
    _, _, loaded, _ = case
    for spec in ["attention-buckets(buckets=2)", "rope-scaling(kind='ntk', factor=2.0)", "ms-poe"]:
        gen = Generator(loaded, method=spec)
        prompts = [gen.prompt("what is the code word of city 2 ?", _passages(3)), gen.prompt("who ?", _passages(2))]
        assert min(p.num_tokens for p in prompts) > 32  # beyond phi3-long's original length in both rows
        singles = [gen.generate(p, max_new_tokens=STEPS) for p in prompts]
        assert_rows_equal(singles, gen.generate_batch(prompts, max_new_tokens=STEPS))


WINDOWED = [n for n, c in FAMILIES.items() if c.get("sliding_window") and c.get("use_sliding_window", True)]


@pytest.mark.parametrize("family", [n for n in WINDOWED if n != "gemma3"])  # Gemma 3 runs in the test above
def test_ms_poe_batched_rows_equal_each_prompt_alone_on_windowed_families(family, tmp_path):
    """Ms-PoE's head ranking sees the same keys in a left-padded batch as alone on every windowed family (one
    window on every layer, alternating, from a layer index up, windows beside NoPE layers)."""
    loaded = load_model(str(save_tiny(family, tmp_path / family)), "cpu", "float32")
    # alpha 1 (keys above the mean attention): a random tiny model's attention inside a 16-key window is too flat
    # for alpha 3, every S_P would be 0 and every ranking the same whatever keys were read.
    gen = Generator(loaded, method="ms-poe(alpha=1.0)")
    prompts = [gen.prompt("what is the code word of city 2 ?", _passages(3)), gen.prompt("who ?", _passages(1))]
    assert prompts[0].num_tokens > 2 * WINDOW and prompts[0].num_tokens - prompts[1].num_tokens > WINDOW
    ranked = [s for s in gen.parts.schemes if isinstance(s, MsPoEScheme)]
    singles, alone = [], []
    for p in prompts:
        singles.append(gen.generate(p, max_new_tokens=STEPS, calibrate=False))
        alone.append([s.last_scores for s in ranked])
    assert_rows_equal(singles, gen.generate_batch(prompts, max_new_tokens=STEPS, calibrate=False))
    # The texts could agree by luck (a tiny model's few kv groups rank alike); the S_P scores each row's ranking
    # came from must agree too. 1e-6: S_P counts keys over a threshold; only the group mean's rounding may differ.
    for row, scores in enumerate(alone):
        for s, own in zip(ranked, scores, strict=True):
            torch.testing.assert_close(s.last_scores[row : row + 1], own, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", ["gemma3"], indirect=True)
def test_ms_poe_ranks_a_windowed_layers_heads_by_the_keys_its_last_query_sees(case, monkeypatch):
    """Alone (no mask given), a windowed layer's S_P is computed over the window's keys, as the stock layer's last
    query sees them, and a full layer's over every key; scores equal S_P of the window's keys on their own."""
    _, _, loaded, _ = case
    gen = Generator(loaded, method="ms-poe(alpha=1.0)")  # alpha 3 leaves every S_P of a flat window at 0
    seen: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
    for i, scheme in enumerate(gen.parts.schemes):
        if isinstance(scheme, MsPoEScheme):
            start = scheme.start_sequence

            def record(q, k, key_mask=None, i=i, start=start):
                seen[i] = (q, k, key_mask)
                start(q, k, key_mask)

            monkeypatch.setattr(scheme, "start_sequence", record)
    prompt = gen.prompt("what is the code word of city 2 ?", _passages(3))
    assert prompt.num_tokens > 2 * WINDOW
    gen.generate(prompt, max_new_tokens=1)
    windows = [a.window for a in model_anatomy(loaded.model)]
    assert any(windows[i] for i in seen) and not all(windows[i] for i in seen)  # both kinds of layer checked
    for i, (q, k, key_mask) in seen.items():
        scheme = gen.parts.schemes[i]
        if windows[i] is None:
            assert key_mask is None
            continue
        assert key_mask.expand(1, -1)[0].tolist() == [False] * (q.shape[2] - WINDOW) + [True] * WINDOW
        own = position_awareness(q[:, :, -WINDOW:], k[:, :, -WINDOW:], scheme.alpha)
        own = own.view(1, scheme.num_kv_heads, -1).mean(-1)
        # S_P is a share of WINDOW keys (steps of 1/16): 1e-6 covers only the rounding of the group mean
        torch.testing.assert_close(scheme.last_scores, own, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["llama3-rope-scaling", "gemma3", "phi3", "smollm3"])
def test_methods_command_refuses_no_rope_method_for_the_models_shape(family, tmp_path, capsys):
    from midlens.cli import main

    folder = save_tiny(family, tmp_path / family)
    assert main(["methods", "--model", str(folder), "--device", "cpu"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line and line[0] != " "}
    for method in ("ms-poe", "attention-buckets", "rope-scaling"):
        assert " runs" in lines[method], lines[method]
        if family == "smollm3":
            assert "on the RoPE layers only: layer 3 has no RoPE and is left as it is" in lines[method]
    assert "needs an artefact trained for this model" in lines["moice"]  # trained routers, not the shape
    loaded = load_model(str(folder), "cpu", "float32")
    with pytest.raises(Exception, match="artefact"):
        Generator(loaded, method="moice(artefact=None)")


def test_moice_routers_skip_nope_layers_and_round_trip_as_an_artefact(tmp_path):
    """SmolLM3: routers on the RoPE layers only; saved and loaded back, the routers answer."""
    from midlens.generators.methods.moice import MoiceRouters

    loaded = load_model(str(save_tiny("smollm3", tmp_path / "s3")), "cpu", "float32")
    bases = complementary_bases(rope_base(loaded.model.config), rotary_dim_of(loaded.model), 3)
    routers = MoiceRouters.new(loaded.model, bases, 2)
    assert sorted(routed_schemes(routers.schemes)) == [0, 1, 2]
    meta = {"method": "moice", "base_model": loaded.name, "base_model_sha256": loaded.sha256}
    folder = routers.save(tmp_path / "routers", meta | {"options": {}, "training": {}, "data": {}})
    gen = Generator(loaded, method=f"moice(artefact='{folder}')")
    answer = gen.generate(gen.prompt("who ?", _passages(2)), max_new_tokens=STEPS)
    assert len(answer.passages) == 2
