"""Ms-PoE on the real model: identity case, cache correctness, head assignment, GQA invariance, bad options."""

from __future__ import annotations

import pytest
import torch

from midlens.core.errors import MethodConfigError
from midlens.generators import Generator
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.rope import RotaryScheme, apply_rotary, rotary_tables
from midlens.generators.methods.ms_poe import MsPoEScheme, position_awareness, ranks_descending, ratio_ladder
from tests.conftest import planted_passages

LOGIT_TOL = 1e-4  # fp32; the bound for "identical"
QUESTION = "What is the secret code word of the Zorbland expedition?"


@pytest.fixture(scope="module")
def prompt(generator):
    return generator.prompt(QUESTION, planted_passages(5, 3), max_new_tokens=8)


def full_logits(gen: Generator, ids: list[int], keep: int) -> torch.Tensor:
    with gen.running(None):
        return gen.forward(ids, new_cache(), keep=keep)


def test_unit_ratios_reproduce_the_baseline(generator, loaded, prompt):
    ms = Generator(loaded, method="ms-poe", ratio_min=1.0, ratio_max=1.0)
    base = full_logits(generator, prompt.input_ids, keep=prompt.num_tokens)
    ours = full_logits(ms, prompt.input_ids, keep=prompt.num_tokens)
    assert (base - ours).abs().max().item() < LOGIT_TOL
    # ...and real ratios do change the model (else the test above proves nothing).
    default = full_logits(Generator(loaded, method="ms-poe"), prompt.input_ids, keep=1)
    assert (default - base[-1:]).abs().max().item() > 1e-2


@pytest.mark.parametrize("gqa", ["group", "per_query_head"])
def test_cached_decoding_equals_uncached_recomputation(loaded, prompt, gqa):
    gen = Generator(loaded, method="ms-poe", gqa=gqa)
    steps = 4
    with gen.running(None):
        cache = new_cache()
        logits = [gen.forward(prompt.input_ids, cache)[-1]]
        tokens = []
        for _ in range(steps):
            tokens.append(int(logits[-1].argmax()))
            logits.append(gen.forward([tokens[-1]], cache)[-1])
        if gqa == "per_query_head":  # keys are cached per query head, not per kv head
            assert cache.layers[5].keys.shape[1] == loaded.model.config.num_attention_heads
    cached = torch.stack(logits)
    # Recompute the whole sequence in one uncached pass with the head order frozen from the prefill.
    for s in gen.parts.schemes:
        s.start_sequence = lambda q, k, key_mask=None: None
    uncached = full_logits(gen, prompt.input_ids + tokens, keep=steps + 1)
    assert (cached - uncached).abs().max().item() < LOGIT_TOL


def test_ratios_go_to_heads_by_rank_not_by_argsort():
    scores = torch.tensor([[0.1, 0.9, 0.5]])
    ladder = ratio_ladder(3, 1.2, 1.8)
    assert ladder.tolist() == pytest.approx([1.2, 1.5, 1.8])  # Eq. 2 includes both ends
    ratios = ladder[ranks_descending(scores)][0]
    assert ratios.tolist() == pytest.approx([1.8, 1.2, 1.5])  # highest score -> smallest ratio
    buggy = ladder[torch.argsort(scores, descending=True)][0]  # the official code's gather
    assert buggy.tolist() != pytest.approx(ratios.tolist())


@pytest.mark.parametrize("gqa", ["group", "per_query_head"])
def test_assignment_on_the_model_is_the_inverse_permutation(loaded, prompt, gqa):
    gen = Generator(loaded, method="ms-poe", gqa=gqa)
    gen.score(prompt, calibrate=False)
    patched = [s for s in gen.parts.schemes if isinstance(s, MsPoEScheme)]
    assert len(patched) == loaded.model.config.num_hidden_layers - 2  # layers 2.. by default
    assert all(type(s) is RotaryScheme for s in gen.parts.schemes[:2])
    for s in patched:
        scores, ratios = s.last_scores[0], s.ratios[0]
        order = torch.argsort(scores, descending=True, stable=True)
        assert torch.equal(ratios[order], s.ladder)  # sorted by score, the ratios climb the ladder
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        assert torch.equal(ratios, s.ladder[inverse])


def test_position_awareness_matches_a_full_softmax_row():
    torch.manual_seed(0)
    q, k = torch.randn(1, 6, 40, 16), torch.randn(1, 2, 40, 16)
    ours = position_awareness(q, k, alpha=3.0)
    full = torch.softmax(q @ k.repeat_interleave(3, dim=1).transpose(-1, -2) / 4.0, dim=-1)[:, :, -1]
    assert torch.equal(ours, (full >= 3.0 / 40).float().mean(-1))


def _scores(scheme: MsPoEScheme, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """q.k of every query head for a query at position m and a key at position n."""
    pos_q, pos_k = torch.tensor([[m]]), torch.tensor([[n]])
    q_rot = scheme.rotate(q, k[:, :, :1].expand(-1, -1, 1, -1), pos_q, None)[0][0]
    k_rot = scheme.rotate(q, k, pos_k, None)[1][0]
    k_rot = k_rot.repeat_interleave(q.shape[1] // k_rot.shape[1], dim=1)
    return (q_rot * k_rot).sum(-1)[0, :, 0]


@pytest.mark.parametrize("gqa", ["group", "per_query_head"])
def test_gqa_keeps_relative_position_invariance(gqa):
    torch.manual_seed(0)
    heads, kv, d = 9, 3, 64
    inv_freq = 1.0 / (1e5 ** (torch.arange(0, d, 2).float() / d))
    scheme = MsPoEScheme(inv_freq, heads, kv, gqa=gqa, head_order="sequential")
    scheme.start_sequence(torch.randn(1, heads, 4, d), torch.randn(1, kv, 4, d))
    q, k = torch.randn(1, heads, 1, d), torch.randn(1, kv, 1, d)
    a = _scores(scheme, q, k, 700, 200)
    b = _scores(scheme, q, k, 1900, 1400)  # same distance, shifted by 1200
    assert torch.allclose(a, b, atol=1e-3), (a - b).abs().max()
    # q.k is plain RoPE at the fractional distance (m - n) / r_h, for every query head.
    ratios = scheme.head_ratios()[0]
    ref_q = torch.stack(
        [
            apply_rotary(
                q[0, h, 0], *[t[0, 0, 0] for t in rotary_tables(torch.tensor([[500.0 / ratios[h]]]), inv_freq[None])]
            )
            for h in range(heads)
        ]
    )
    ref = (ref_q * k[0, :, 0].repeat_interleave(3, dim=0)).sum(-1)
    assert torch.allclose(a, ref, atol=1e-3)


def test_the_official_gqa_shortcut_would_break_invariance():
    """Rotating a group's keys with its first query head's ratio (the official code) is not shift-invariant."""
    torch.manual_seed(0)
    heads, kv, d = 9, 3, 64
    inv_freq = 1.0 / (1e5 ** (torch.arange(0, d, 2).float() / d))
    ratios = ratio_ladder(heads, 1.2, 1.8)
    q, k = torch.randn(heads, d), torch.randn(kv, d)

    def score(m: int, n: int) -> torch.Tensor:
        cq, sq = rotary_tables(torch.tensor([[float(m)]]), inv_freq / ratios[:, None])
        k_ratio = ratios[::3].repeat_interleave(3)  # first query head's ratio for the whole group
        ck, sk = rotary_tables(torch.tensor([[float(n)]]), inv_freq / k_ratio[:, None])
        qr = apply_rotary(q, cq[0, :, 0], sq[0, :, 0])
        kr = apply_rotary(k.repeat_interleave(3, dim=0), ck[0, :, 0], sk[0, :, 0])
        return (qr * kr).sum(-1)

    assert (score(700, 200) - score(1900, 1400)).abs().max() > 0.1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ratio_min": 0.0}, "must be positive"),
        ({"ratio_max": -1.5}, "must be positive"),
        ({"ratio_min": 2.0, "ratio_max": 1.5}, "ratio_min=2.0 is larger than ratio_max=1.5"),
        ({"layers": [2, 30]}, r"layers \[30\] out of range: this model has layers 0..29"),
        ({"head_order": "random"}, "expected awareness, sequential or fixed"),
        ({"head_order": "fixed"}, "needs head_ranks"),
        ({"head_order": "fixed", "head_ranks": [0, 0, 1]}, "must be a permutation of 0..2"),
        ({"gqa": "mean"}, "expected group or per_query_head"),
        ({"ratio": 1.5}, r"unknown ms-poe option\(s\) \['ratio'\]"),
    ],
)
def test_bad_options_are_refused_clearly(loaded, options, message):
    with pytest.raises(MethodConfigError, match=message):
        Generator(loaded, method="ms-poe", **options)


def test_generate_reports_evidence_like_the_baseline(loaded, prompt):
    answer = Generator(loaded, method="ms-poe").generate(prompt, max_new_tokens=6)
    assert answer.method["name"] == "ms-poe" and answer.method["ratio_min"] == 1.2
    assert sorted(p.rank for p in answer.passages) == list(range(1, 6))
    assert all(p.calibrated is not None for p in answer.passages)
    assert answer.passages[2].rank == 1  # the planted fact, as under the baseline


def test_method_specs_name_ablation_variants():
    from midlens.generators.methods.registry import parse_method_spec, split_top_level

    assert parse_method_spec("baseline") == ("baseline", {})
    assert parse_method_spec("ms-poe(ratio_min=1.0, ratio_max=1.2, head_order=sequential, layers=[2, 3])") == (
        "ms-poe",
        {"ratio_min": 1.0, "ratio_max": 1.2, "head_order": "sequential", "layers": [2, 3]},
    )
    assert split_top_level("baseline, ms-poe(ratio_min=1.0, layers=[2,3]),lcr") == [
        "baseline",
        "ms-poe(ratio_min=1.0, layers=[2,3])",
        "lcr",
    ]
    for bad in ("ms-poe(ratio_min)", "ms-poe(=1)", "ms poe", "ms-poe(ratio_min=1.0"):
        with pytest.raises(MethodConfigError, match="method spec"):
            parse_method_spec(bad)


def test_eval_runs_a_variant_and_refuses_a_mistyped_option(loaded, tmp_path, capsys):
    import json

    from midlens.cli import main

    base = ["eval", "sweep", "--dataset", "kv", "--k", "3", "--n", "1", "--positions", "2", "--no-progress"]
    base += ["--max-new-tokens", "2", "--no-logprob"]
    spec = "ms-poe(ratio_min=1.0, ratio_max=1.0)"
    assert main(base + ["--methods", f"baseline,{spec}", "--out", str(tmp_path / "ok")]) == 0
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    assert config["methods"][spec]["ratio_max"] == 1.0 and config["methods"][spec]["ordering"] is None
    rows = [json.loads(line) for line in (tmp_path / "ok" / "results.jsonl").read_text().splitlines()]
    by = {r["method"]: r for r in rows}
    # Unit ratios are the identity case: the variant must answer exactly like the baseline.
    assert by[spec]["prediction"] == by["baseline"]["prediction"]
    assert by[spec]["gold_share"] == pytest.approx(by["baseline"]["gold_share"], abs=1e-4)
    capsys.readouterr()
    assert main(base + ["--methods", "ms-poe(ratio_mn=1.0)", "--out", str(tmp_path / "bad")]) == 2
    assert "unknown ms-poe option(s) ['ratio_mn']" in capsys.readouterr().err
