"""Gemma 3 270M's shipped artefacts (the trained methods' and the channel-scaling search) are listed by `midlens
methods` as running, and answer through their verified artefacts, which are not the stock model."""

from __future__ import annotations

import pytest

from midlens.core.passage import Passage
from midlens.generators import Generator
from midlens.generators.models.loading import load_model

pytestmark = pytest.mark.model


# Each trained method shipped for Gemma 3 270M and how `midlens methods` lists it.
SHIPPED = {
    "finetuned": "finetuned          runs (mudaf(alpha=0), its shipped artefact)",
    "mudaf": "mudaf              runs",
    "moice": "moice              runs",
    "pos2distill": "pos2distill        runs",
}
LORA = {"finetuned", "mudaf", "pos2distill"}  # a LoRA delta; moice's routers steer the frozen model instead
PASSAGES = [Passage(text="The secret code word is pelican.", title="code"), Passage(text="Paris is in France.")]


def test_midlens_methods_lists_every_shipped_gemma3_artefact_as_running(capsys):
    from midlens.cli import main

    assert main(["methods", "--model", "gemma3-270m", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for line in [*SHIPPED.values(), "channel-scaling    runs"]:
        assert line in out


@pytest.mark.parametrize("method", sorted(SHIPPED))
def test_each_shipped_gemma3_artefact_answers_and_is_not_the_stock_model(method):
    loaded = load_model("gemma3-270m", "cpu", "float32")
    tuned = Generator(loaded, method=method)
    if method in LORA:
        weights = [p for name, p in tuned.parts.delta.named_parameters() if name.endswith("_B")]
        assert weights and max(float(w.abs().max()) for w in weights) > 0  # B left zero would be the baseline
    prompt = tuned.prompt("What is the secret code word?", PASSAGES)
    plain = Generator(loaded, method="baseline").generate(prompt, max_new_tokens=4, reference="pelican")
    answer = tuned.generate(prompt, max_new_tokens=4, reference="pelican")
    assert abs(answer.reference_logprob - plain.reference_logprob) > 1e-3  # the delta changes what the model reads
    assert answer.text and len(answer.passages) == 2


def test_the_shipped_channel_search_runs_on_gemma3_and_moves_the_last_token_only():
    loaded = load_model("gemma3-270m", "cpu", "float32")
    gen = Generator(loaded, method="channel-scaling")
    choice = gen.parts.delta.choice
    assert (choice.channel, choice.layers, choice.scale) == (21, tuple(range(6, 15)), -1.0)
    prompt = gen.prompt("What is the secret code word?", PASSAGES)
    plain = Generator(loaded, method="baseline").generate(prompt, max_new_tokens=4, reference="pelican")
    answer = gen.generate(prompt, max_new_tokens=4, reference="pelican")
    assert abs(answer.reference_logprob - plain.reference_logprob) > 1e-3
    assert answer.text and len(answer.passages) == 2
