"""Every training command (`midlens train mudaf | moice | pos2distill | channel-scaling`) on every tiny family
(tests/tiny.py FAMILIES), as a user brings their own model: `--model FOLDER`, tiny settings, then the artefact it
wrote answers through `Generator`. A method whose idea does not exist for the family's layers is refused by the
command with the method's own reason (the one `midlens methods --model FOLDER` gives), never a traceback.

The families are built with 8 layers here (their per-layer lists repeated): the channel search reads layers 2 to
L-2 and keeps a channel monotonic in more than L/4 of the layers, which 4 layers can never give (only layer 2 is
read). The HotpotQA prompts run to ~1k tokens through the tiny byte-level tokenizer, so positions go to 4096.
Parsing HotpotQA's 46 MB file took most of a family's time, four commands a family: the rows are parsed once here
and handed to every command (they read them, never change them).
"""

from __future__ import annotations

import functools

import pytest

import midlens.training.data
from midlens.core.passage import Passage
from midlens.generators import Generator
from midlens.generators.methods.registry import unsupported_reason
from midlens.generators.models.loading import load_model
from midlens.retrievers.hotpotqa import load_rows
from tests.tiny import FAMILIES, save_tiny

LAYERS = 8
# The smallest settings that still run each command's whole path (data, preparation, a step, the artefact).
TINY = ["--examples", "2", "--batch", "2", "--max-words", "6", "--no-progress", "--device", "cpu"]
COMMANDS = {
    "mudaf": ["--heads-n", "1", "--num-heads", "2", "--rank", "2"],
    "moice": ["--experts", "2", "--top-k", "1"],
    "pos2distill": ["--placements", "2", "--max-answer-tokens", "2", "--rank", "2", "--advantage", "first"],
    "channel-scaling": ["--strings", "2", "--length", "50", "--candidates", "1", "--scales", "0", "--kv-pairs", "2"],
}


def _deeper(name: str) -> dict:
    """Overrides giving family `name` LAYERS layers, its per-layer lists (layer types, NoPE flags) repeated."""
    lists = {k: v * (LAYERS // len(v)) for k, v in FAMILIES[name].items() if isinstance(v, list) and len(v) == 4}
    return {"num_hidden_layers": LAYERS, "max_position_embeddings": 4096, **lists}


@functools.cache
def _rows(split: str) -> list[dict]:
    return load_rows(split)


@pytest.fixture(autouse=True)
def _rows_parsed_once(monkeypatch):
    monkeypatch.setattr(midlens.training.data, "load_rows", lambda split: list(_rows(split)))


def test_the_channel_search_refuses_a_model_too_shallow_for_it_by_its_layer_count(tmp_path, capsys):
    """Four layers leave one layer to read (2 .. L-2) where a candidate must be monotonic in two: the search says so
    before reading any string (it said "no channel ... try more or longer strings", which could never help)."""
    from midlens.cli import main

    folder = save_tiny("llama", tmp_path / "llama")  # tests/tiny.py's 4 layers
    extra = COMMANDS["channel-scaling"]
    assert main(["train", "channel-scaling", "--model", str(folder), *extra, *TINY, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "has 4 layers: the channel search reads layers 2 to 2" in err and "5 layers or more" in err, err
    assert "Traceback" not in err and "hidden states of random strings" not in err


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_training_command_runs_on_the_family_and_its_artefact_answers(name, tmp_path, capsys):
    from midlens.cli import main

    folder = save_tiny(name, tmp_path / name, **_deeper(name))
    loaded = load_model(str(folder), "cpu", "float32")
    passages = [Passage(text=f"the code word of city {i} is {i + 20} .", title=f"city {i}") for i in range(2)]
    for method, extra in COMMANDS.items():
        out = tmp_path / method
        reason = unsupported_reason(method, loaded.model)
        code = main(["train", method, "--model", str(folder), *extra, *TINY, "--out", str(out)])
        err = capsys.readouterr().err
        if reason is not None:  # refused before training, with the reason `midlens methods` gives
            assert code == 2 and reason in err and "Traceback" not in err, f"{name} {method}: {err}"
            continue
        assert code == 0, f"{name} {method}: {err}"
        gen = Generator(loaded, method=f"{method}(artefact='{out}')")
        answer = gen.generate(gen.prompt("what is the code word of city 1 ?", passages), max_new_tokens=2)
        assert len(answer.passages) == 2, f"{name} {method}"
