"""The wheel a RAG developer installs: one import name, `midlens`, plus the two LlamaIndex integration paths."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_wheel_installs_midlens_and_the_llamaindex_paths_only(tmp_path):
    leftover = ROOT / "build"  # setuptools builds in the source tree; the test leaves it as it found it
    had_build = leftover.exists()
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if not had_build:
        shutil.rmtree(leftover, ignore_errors=True)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("midlens-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"midlens", "llama_index"}, top
    integrations = {"/".join(n.split("/")[:3]) for n in names if n.startswith("llama_index/")}
    assert integrations == {"llama_index/llms/midlens", "llama_index/postprocessor/midlens_rerank"}
    for layer in ("core", "generators", "retrievers", "rag", "training", "demo", "eval"):
        # Every package of the source, subpackages too: setuptools ships only those pyproject lists by name.
        for init in sorted((ROOT / layer).rglob("__init__.py")):
            relative = init.relative_to(ROOT / layer).as_posix()
            if layer == "rag" and relative.startswith("integrations/"):
                continue  # shipped under llama_index/ (checked above)
            assert f"midlens/{layer}/{relative}" in names, f"{layer}/{relative}"
    assert "midlens/retrievers/data/hotpotqa_corpus.jsonl" in names
    assert any(n.startswith("midlens/generators/trained/mudaf/") for n in names)

    # Unpacked and imported from elsewhere, with the source folders out of reach: the data is found through
    # the package, and the old top-level names are gone.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import midlens.retrievers.corpus as c, midlens.retrievers.hotpotqa as h\n"
        "assert c.default_corpus_path().is_file() and str(c.default_corpus_path()).startswith(sys.argv[1])\n"
        "assert h.split_of('x') in ('train', 'eval')\n"
        "import importlib.util\n"
        "assert all(importlib.util.find_spec(n) is None for n in ('core', 'generators', 'retrievers', 'rag'))\n"
        "print('ok')\n"
    )
    run = subprocess.run(
        [sys.executable, "-I", "-c", code, str(site)], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_public_names_import_from_the_top_and_only_when_used():
    """`midlens.Pipeline`, `midlens.Generator`, ... resolve, while `import midlens` alone (what `midlens --help`
    runs first) loads no torch."""
    code = "import midlens, sys; midlens.__version__; assert 'torch' not in sys.modules, 'torch was imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]

    import midlens
    from midlens.generators.answering.answer import Answer
    from midlens.generators.answering.generator import Generator
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.generators.models.loading import load_model
    from midlens.rag.pipeline import Pipeline
    from midlens.retrievers.dense import DenseRetriever

    assert midlens.Pipeline is Pipeline and midlens.Generator is Generator and midlens.load_model is load_model
    assert (midlens.Answer, midlens.EvidenceConfig, midlens.DenseRetriever) == (Answer, EvidenceConfig, DenseRetriever)
    assert all(hasattr(midlens, name) for name in midlens.__all__) and set(midlens.__all__) <= set(dir(midlens))
    with pytest.raises(AttributeError, match="no attribute 'Pipelines'"):
        midlens.Pipelines  # noqa: B018
