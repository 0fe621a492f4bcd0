"""`midlens bench cpu`: each precision against fp32 on the same prompts, on a tiny model (the packaged models'
figures are in docs/results/cpu-bf16/). What is checked is the report's logic: fp32 against itself is identical
(same text 1.0, tau 1.0, log-prob difference 0), and the other precisions are measured, not copied."""

from __future__ import annotations

import pytest

from tests.tiny import save_tiny


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from midlens.eval.bench_cpu import compare_precisions

    # HotpotQA prompts through the tiny byte-level tokenizer run to thousands of tokens.
    folder = save_tiny("llama", tmp_path_factory.mktemp("tiny"), max_position_embeddings=8192)
    return compare_precisions(str(folder), n=2, precisions=("bfloat16", "int8"), max_words=20, memory_repeats=0)


def test_fp32_against_itself_is_identical(report):
    fp32 = report["precisions"]["float32"]
    assert fp32["same_text_share"] == 1.0 and fp32["evidence_kendall_tau_median"] == pytest.approx(1.0)
    assert fp32["gold_logprob_diff_mean"] == 0.0


def test_every_asked_precision_is_measured_and_rendered(report):
    from midlens.eval.bench_cpu import render

    assert list(report["precisions"]) == ["float32", "bfloat16", "int8"]
    for name in ("bfloat16", "int8"):
        r = report["precisions"][name]
        assert -1.0 <= r["evidence_kendall_tau_min"] <= 1.0 and r["prefill_speedup"] > 0
        assert r["gold_logprob_diff_mean"] != 0.0  # another precision's numbers, not fp32's copied
    text = render(report)
    assert "dtype='auto' picks" in text and text.count("\n| ") == 4


def test_the_cli_refuses_an_unknown_precision(capsys):
    from midlens.cli import main

    assert main(["bench", "cpu", "--precisions", "float32,fp8"]) == 2
    assert "--precisions fp8: choose from float32, bfloat16, int8" in capsys.readouterr().err
