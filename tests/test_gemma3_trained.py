"""Gemma 3 270M's shipped artefacts: `finetuned` (mudaf(alpha=0)) and the channel-scaling search are listed by
`midlens methods` and answer through their verified artefacts, which are not the stock model."""

from __future__ import annotations

import pytest

from midlens.core.passage import Passage
from midlens.generators import Generator
from midlens.generators.loading import load_model

pytestmark = pytest.mark.model


def test_midlens_methods_lists_the_shipped_finetune_and_it_answers(capsys):
    from midlens.cli import main

    assert main(["methods", "--model", "gemma3-270m", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "finetuned          runs (mudaf(alpha=0), its shipped artefact)" in out
    assert "channel-scaling    runs" in out

    loaded = load_model("gemma3-270m", "cpu", "float32")
    tuned = Generator(loaded, method="finetuned")
    weights = [p for name, p in tuned.parts.delta.named_parameters() if name.endswith("_B")]
    assert weights and max(float(w.abs().max()) for w in weights) > 0  # trained: B left zero would be the baseline
    passages = [Passage(text="The secret code word is pelican.", title="code"), Passage(text="Paris is in France.")]
    prompt = tuned.prompt("What is the secret code word?", passages)
    plain = Generator(loaded, method="baseline").generate(prompt, max_new_tokens=4, reference="pelican")
    answer = tuned.generate(prompt, max_new_tokens=4, reference="pelican")
    assert abs(answer.reference_logprob - plain.reference_logprob) > 1e-3  # the delta changes what the model reads
    assert answer.text and len(answer.passages) == 2


def test_the_shipped_channel_search_runs_on_gemma3_and_moves_the_last_token_only():
    loaded = load_model("gemma3-270m", "cpu", "float32")
    gen = Generator(loaded, method="channel-scaling")
    choice = gen.parts.delta.choice
    assert (choice.channel, choice.layers, choice.scale) == (21, tuple(range(6, 15)), -1.0)
    passages = [Passage(text="The secret code word is pelican.", title="code"), Passage(text="Paris is in France.")]
    prompt = gen.prompt("What is the secret code word?", passages)
    plain = Generator(loaded, method="baseline").generate(prompt, max_new_tokens=4, reference="pelican")
    answer = gen.generate(prompt, max_new_tokens=4, reference="pelican")
    assert abs(answer.reference_logprob - plain.reference_logprob) > 1e-3
    assert answer.text and len(answer.passages) == 2
