"""`midlens cache` and `midlens index` on a temp cache: list, verify, clear, build, as a user runs them."""

from __future__ import annotations

import pytest

from midlens.cli import main
from midlens.core.files import indexes_dir, make_temp_dir, models_dir
from midlens.generators.models.packaged_models import record_conversion
from tests.damage import age, dead_owner, overwrite
from tests.tiny import save_tiny


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIDLENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def cli(capsys, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_cache_info_verify_and_clear_a_damaged_model(cache, capsys):
    folder = save_tiny("llama", models_dir() / "tiny")
    record_conversion(folder, "tiny", "ab" * 32)
    leftover = make_temp_dir(models_dir(), ".tiny-")
    dead_owner(leftover)

    rc, out = cli(capsys, "cache", "info")
    assert rc == 0
    assert f"midlens cache: {cache}" in out
    assert "tiny  " in out and "files in manifest, recorded at conversion" in out and str(folder) in out
    assert "retrieval indexes: none built yet" in out
    assert f"{leftover}" in out and "left by an interrupted run" in out

    rc, out = cli(capsys, "cache", "verify")
    assert rc == 0 and f"ok      model tiny: every file matches its manifest ({folder})" in out

    weights = folder / "model.safetensors"
    overwrite(weights, weights.stat().st_size - 4, b"\x00\x00\xc0\x7f")  # the last float becomes NaN
    rc, out = cli(capsys, "cache", "verify", "--model", "tiny")
    assert rc == 1
    assert "DAMAGED model tiny" in out and f"{weights}: sha256 " in out
    assert "`midlens cache clear --model tiny`, then run the command again" in out

    rc, out = cli(capsys, "cache", "clear", "--model", "tiny")
    assert rc == 0 and f"removed model {folder}" in out and "freed" in out
    assert not folder.exists() and not leftover.exists()
    assert [p.name for p in models_dir().iterdir()] == []  # nothing half-deleted either

    rc, out = cli(capsys, "cache", "clear", "--model", "tiny")
    assert rc == 0 and "nothing to clear: no cached model 'tiny'" in out


def test_cache_commands_refuse_bad_arguments_without_a_traceback(cache, capsys):
    rc, out = cli(capsys, "cache", "clear", "--model", "../models")
    assert rc == 2 and "give a cached model's name, as `midlens cache info` lists it" in out
    rc, out = cli(capsys, "cache", "verify", "--model", "absent")
    assert rc == 2 and "no cached model 'absent'" in out and "no model is cached" in out
    with pytest.raises(SystemExit) as usage:
        main(["cache", "clear"])
    assert usage.value.code == 2
    assert "one of the arguments --model --indexes --all is required" in capsys.readouterr().err


def test_a_cache_without_manifest_is_unverified_not_recorded(cache, capsys):
    folder = save_tiny("llama", models_dir() / "older")
    (folder / "SOURCE_SHA256").write_text("ab" * 32 + "\n")  # converted before manifests existed, or deleted
    rc, out = cli(capsys, "cache", "info")
    assert "unverified: no manifest" in out
    rc, out = cli(capsys, "cache", "verify")
    assert rc == 1 and "DAMAGED model older" in out and "nothing vouches for its files" in out
    assert not (folder / "MANIFEST.json").is_file()  # never recorded from what is on disk


def test_index_build_info_verify_and_clear(cache, capsys, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "volcanoes.txt").write_text("Mount Etna is an active volcano on the east coast of Sicily.")
    (docs / "whales.md").write_text("# Whales\n\nThe blue whale is the largest animal known to have lived.")

    rc, out = cli(capsys, "index", "build", "--corpus", str(docs))
    assert rc == 0 and "index ready: 2 passages" in out
    (folder,) = [p for p in indexes_dir().iterdir() if not p.name.startswith(".")]
    assert str(folder) in out

    shards = indexes_dir() / ".0123.embeddings-0123"
    shards.mkdir()
    age(shards, 7200)
    rc, out = cli(capsys, "index", "info")
    assert rc == 0 and f"{folder.name}" in out and "2 passages, flat, all-MiniLM-L6-v2" in out
    assert f"corpus: {docs.resolve()}" in out and "interrupted index build" in out

    rc, out = cli(capsys, "cache", "verify")
    assert rc == 0 and f"ok      index {folder.name}" in out
    overwrite(folder / "index.faiss", 100, b"\xff\xff")
    rc, out = cli(capsys, "cache", "verify")
    assert rc == 1 and f"DAMAGED index {folder.name}: " in out and f"{folder / 'index.faiss'}: sha256" in out

    rc, out = cli(capsys, "index", "clear")
    assert rc == 0 and f"removed index {folder}" in out and not folder.exists() and not shards.exists()
    rc, out = cli(capsys, "index", "info")
    assert "none built yet" in out

    rc, out = cli(capsys, "index", "build", "--corpus", str(tmp_path / "missing"))
    assert rc == 2 and "corpus not found" in out


def test_load_check_records_are_listed_and_cleared_with_their_model(cache, capsys):
    from midlens.core.files import load_checks_dir

    folder = save_tiny("llama", models_dir() / "tiny")
    record_conversion(folder, "tiny", "ab" * 32)
    rc, out = cli(capsys, "cache", "info")
    assert "load-time checks: none recorded yet" in out

    rc, out = cli(capsys, "cache", "verify", "--model", "tiny", "--dtype", "float32")
    assert rc == 0, out
    records = sorted(load_checks_dir().glob("*.json"))
    assert len(records) == 1  # verify ran the comparison and recorded it
    rc, out = cli(capsys, "cache", "info")
    assert f"load-time checks: 1 recorded, 0 refused or unreadable  {load_checks_dir()}" in out

    rc, out = cli(capsys, "cache", "clear", "--model", "tiny")
    assert rc == 0 and "removed 1 load-time check record(s)" in out
    assert not list(load_checks_dir().glob("*.json"))  # a reconverted model is compared again, not trusted

    cli(capsys, "cache", "verify", "--model", "tiny")  # nothing cached: refused, no record
    folder = save_tiny("llama", models_dir() / "tiny")
    record_conversion(folder, "tiny", "ab" * 32)
    cli(capsys, "cache", "verify", "--model", "tiny", "--dtype", "float32")
    rc, out = cli(capsys, "cache", "clear", "--all")
    assert rc == 0 and not load_checks_dir().exists()
