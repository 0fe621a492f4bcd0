"""A method registered in-process (`registry.register`, no package, no entry point) is a method like any other:
the torch-free checks (AnswerOptions, the shells' parsers) accept its name and a Pipeline answers with it."""

from __future__ import annotations

import pytest
import torch

from midlens.core.errors import MethodConfigError
from midlens.core.passage import Passage
from midlens.generators import Generator
from midlens.generators.attention.rope import RotaryScheme, layer_inv_freq
from midlens.generators.methods import registry
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method
from midlens.generators.models.loading import load_model
from midlens.rag.options import AnswerOptions
from midlens.rag.pipeline import Pipeline
from tests.tiny import save_tiny


class _RecencyScheme(RotaryScheme):
    """Keys lose `slope` logits per token of distance (an ALiBi-like bias): visible in the logits, cheap."""

    def __init__(self, inv_freq: torch.Tensor, num_heads: int, num_kv_heads: int, slope: float):
        super().__init__(inv_freq, num_heads, num_kv_heads)
        self.slope = slope

    def key_bias(self, past: int, length: int, total: int) -> torch.Tensor:
        queries = torch.arange(past, past + length)[:, None]
        keys = torch.arange(total)[None, :]
        return (-self.slope * (queries - keys).clamp(min=0).float())[None, None]


def _build(loaded, options: dict) -> MethodParts:
    cfg = loaded.model.config
    return MethodParts(
        [
            _RecencyScheme(
                layer_inv_freq(loaded.model, i),
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                float(options["slope"]),
            )
            for i in range(cfg.num_hidden_layers)
        ]
    )


NAME = "in-process-recency"


@pytest.fixture(scope="module")
def registered():
    method = registry.register(Method(NAME, "keys lose slope logits per token", build=_build, defaults={"slope": 0.5}))
    yield method
    registry.REGISTRY.pop(NAME, None)


def test_an_unregistered_name_is_refused_and_a_registered_one_accepted(registered):
    with pytest.raises(MethodConfigError, match="unknown method 'not-registered-anywhere'"):
        AnswerOptions(method="not-registered-anywhere")
    assert AnswerOptions(method=f"{NAME}(slope=0.25)").method == f"{NAME}(slope=0.25)"


def test_a_pipeline_answers_with_an_in_process_method(registered, tmp_path):
    loaded = load_model(str(save_tiny("llama", tmp_path / "llama")), "cpu", "float32")
    passages = [Passage(text=f"the code word of city {i} is {i * 7}", title=f"city {i}") for i in range(3)]
    answers = {}
    for spec in ("baseline", f"{NAME}(slope=2.0)"):
        pipe = Pipeline(None, Generator(loaded, method=spec), AnswerOptions(method=spec, max_new_tokens=4))
        answers[spec] = pipe.answer("what is the code word of city 2 ?", passages)
    assert answers[f"{NAME}(slope=2.0)"].method["name"] == NAME, answers[f"{NAME}(slope=2.0)"].method
    # The bias really reached the attention: the evidence moves (a strong recency bias favours the last passage).
    base = [p.evidence for p in answers["baseline"].passages]
    biased = [p.evidence for p in answers[f"{NAME}(slope=2.0)"].passages]
    assert max(abs(a - b) for a, b in zip(base, biased, strict=True)) > 1e-3
