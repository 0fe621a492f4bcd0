"""The method registry's answers for the names users type: aliases of packaged models included."""

from __future__ import annotations

import pytest

from midlens.core.names import DEFAULT_MODEL, MODEL_ALIASES
from midlens.generators.methods.registry import available, method_config, model_for


@pytest.mark.parametrize("alias", sorted(MODEL_ALIASES))
def test_a_documented_model_alias_runs_the_trained_methods_of_its_model(alias):
    current = MODEL_ALIASES[alias]
    with pytest.warns(DeprecationWarning):
        assert model_for(method_config("mudaf"), alias, DEFAULT_MODEL) == current  # what `ask --model ALIAS` asks
    assert available(alias) == available(current)
    assert {"mudaf", "moice"} <= set(available(alias))
