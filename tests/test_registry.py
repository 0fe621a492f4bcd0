"""The method registry's answers for the names users type: aliases of packaged models included."""

from __future__ import annotations

import pytest

from midlens.core.defaults import DEFAULT_MODEL, MODEL_ALIASES
from midlens.generators.methods.registry import available, method_config, model_for


@pytest.mark.parametrize("alias", sorted(MODEL_ALIASES))
def test_a_documented_model_alias_runs_the_trained_methods_of_its_model(alias):
    current = MODEL_ALIASES[alias]
    with pytest.warns(DeprecationWarning):
        assert model_for(method_config("mudaf"), alias, DEFAULT_MODEL) == current  # what `ask --model ALIAS` asks
    assert available(alias) == available(current)
    assert {"mudaf", "moice"} <= set(available(alias))


CHANNEL_SPEC = "channel-scaling(channel=5, layers=[1, 2], scale=0.5)"


def test_an_explicit_channel_scaling_choice_runs_on_a_folder_from_the_cli_as_from_python(tmp_path, capsys, monkeypatch):
    """Given its channel, layers and scale, channel-scaling reads no artefact: Python ran it on any folder while the
    command line refused it ("no trained channel-scaling artefact ships") and `methods` offered no way out."""
    import json

    monkeypatch.setenv("MIDLENS_CACHE", str(tmp_path / "cache"))  # the folder's load check and the corpus's index

    from midlens.cli import main
    from midlens.generators import Generator, load_model
    from tests.tiny import save_tiny

    folder = save_tiny("llama", tmp_path / "llama")
    spec = method_config(CHANNEL_SPEC)
    assert model_for(spec, str(folder), DEFAULT_MODEL) == str(folder)
    python = Generator(load_model(str(folder), "cpu", "float32"), method=CHANNEL_SPEC)
    assert python.parts.delta is not None  # the choice is installed, not the stock model

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The film was directed by a pelican.", encoding="utf-8")
    (corpus / "b.txt").write_text("The river expedition was in zorbland.", encoding="utf-8")
    ask = ["ask", "who directed the film?", "--corpus", str(corpus), "--model", str(folder), "--method", CHANNEL_SPEC]
    assert main([*ask, "--device", "cpu", "--dtype", "float32", "--max-new-tokens", "4", "--json"]) == 0
    out = capsys.readouterr().out
    record = json.loads(out[out.index("{") :])
    assert record["method"] == spec.to_dict() == python.method.to_dict()

    assert main(["methods", "--model", str(folder), "--device", "cpu"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("channel-scaling"))
    assert line.endswith("or channel, layers and scale all given")


def test_finetuned_on_a_folder_names_that_folder_and_the_packaged_models_it_ships_for(tmp_path, monkeypatch):
    """`finetuned` read '<folder>-alpha0', a model that does not exist, into its refusal."""
    monkeypatch.setenv("MIDLENS_CACHE", str(tmp_path / "cache"))
    from midlens.core.errors import ArtefactError
    from midlens.generators import Generator, load_model
    from midlens.generators.methods.registry import shipped_models
    from midlens.generators.models.packaged_models import REGISTRY
    from tests.tiny import save_tiny

    folder = str(save_tiny("llama", tmp_path / "llama"))
    ships = shipped_models(method_config("finetuned"))
    assert ships and set(ships) <= set(REGISTRY)
    for model in (folder, load_model(folder, "cpu", "float32")):  # by name (before loading) and loaded
        with pytest.raises(ArtefactError) as err:
            Generator(model, method="finetuned")
        message = str(err.value)
        assert (
            "method 'finetuned' (mudaf(alpha=0)) reads a trained artefact, which ships only for the packaged "
            in message
        )
        assert f"model {folder!r} has none; one ships for {', '.join(ships)}." in message
        assert "alpha0" not in message
