"""Shared, session-scoped real parts: one SmolLM2-135M in memory, one embedded-corpus retriever."""

from __future__ import annotations

import importlib.abc
import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# dtype="auto" on this suite's CPU is fp32, in this process and the CLI runs it starts: the suite compares models
# loaded in several places (fixtures, LlamaIndex classes, subprocesses) with each other and with stock fp32 forwards
# at 1e-4..1e-5. The bf16 default itself is tested in tests/test_bf16.py, and measured in docs/results/cpu-bf16/.
os.environ["MIDLENS_CPU_DTYPE"] = "float32"
# `make test` runs two workers (pytest-xdist) on this project's two-core machines. Each worker computes on one
# thread, and so do the commands it starts: two processes asking for two threads each on two cores made OpenMP's
# spinning threads wait on each other (tests ran up to 20x slower). Set before torch is imported anywhere.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_threads] = "1"

# The layers live in top-level folders but install as `midlens.<layer>`; the repository root is on sys.path
# while tests run, so a stray `import retrievers` would work here and fail in a user's app. Refuse it here too.
LAYERS = ("core", "generators", "retrievers", "rag", "training", "demo", "eval")


class _OneNamespace(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if path is None and name.split(".")[0] in LAYERS:
            raise ModuleNotFoundError(f"import {name!r} as 'midlens.{name}': the installed package has no {name!r}")
        return None


sys.meta_path.insert(0, _OneNamespace())


@pytest.fixture(scope="session")
def loaded():
    from midlens.generators.models.loading import load_model

    # fp32, named: the exactness tests compare against stock fp32 forwards at 1e-4..1e-5, which bf16 (the CPU
    # default where it is native) cannot meet; the bf16 path is compared with fp32 in tests/test_bf16.py.
    return load_model("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def generator(loaded):
    from midlens.generators import Generator

    # The stock model, named: what the packaged model answers with by default follows measurement (core.defaults) and
    # is tested in test_defaults; the tests that take this fixture test the mechanics under one known method.
    return Generator(loaded, method="baseline")


@pytest.fixture(scope="session")
def default_retriever():
    from midlens.retrievers.corpus import default_corpus_path
    from midlens.retrievers.dense import DenseRetriever

    # The shared cache index: built once per machine (about 50 s), reused by later test runs.
    return DenseRetriever.build(default_corpus_path())


@pytest.fixture(scope="session")
def pipeline(default_retriever, generator):
    from midlens.rag.pipeline import Pipeline

    return Pipeline(default_retriever, generator, top_k=5, max_new_tokens=24)


@pytest.fixture
def measured_restack(monkeypatch) -> tuple[str, str, str]:
    """A model and method restacked where nobody says (core.defaults.MEASURED_RESTACKS), for the tests of that
    mechanism: no entry passes the out-of-domain rule today, so the one SmolLM2's default held until then is patched
    in, with the default method it restacked (no model answers with the fine-tune by default today either).
    (model, method spec, scorer)."""
    from midlens.core import defaults

    monkeypatch.setitem(defaults.ANSWER_METHODS, "smollm2-135m", "finetuned")
    monkeypatch.setitem(defaults.MEASURED_RESTACKS, ("smollm2-135m", "mudaf(alpha=0)"), "mudaf")
    return "smollm2-135m", "mudaf(alpha=0)", "mudaf"


PLANTED_FACT = "The secret code word of the Zorbland expedition is 'pelican'."


def planted_passages(n: int = 8, gold_at: int = 3):
    """n distractor paragraphs from the embedded corpus with one planted fact at 1-based `gold_at`."""
    from midlens.core.passage import Passage
    from midlens.retrievers.corpus import default_corpus_path, read_documents

    docs = read_documents(default_corpus_path())[:n]
    passages = [Passage(text=d["text"][:400], title=d["title"], id=d["id"]) for d in docs[: n - 1]]
    passages.insert(gold_at - 1, Passage(text=PLANTED_FACT, title="Zorbland expedition", id="gold"))
    return passages


# Test tiers: a test that takes one of these fixtures loads the packaged SmolLM2-135M (or builds the embedded
# index) and is marked `model`; `make test-fast` leaves out `model`, `slow`, `browser` and `gpu`.
MODEL_FIXTURES = {"loaded", "generator", "default_retriever", "pipeline", "llm", "faiss_index", "calibrated"}


# Tests that start a Ray cluster (a server, the Ray eval engine) run on one worker, one after the other: each counts
# the processes its cluster leaves behind, which another worker's cluster would muddle.
RAY_TESTS = ("tests/test_serve.py", "tests/test_eval.py::test_ray_engine_")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        # Under `make test`'s workers (--dist loadgroup) a file's tests stay together, so each module fixture is
        # built once; the Ray tests are one group, and it goes first: as the longest group, started last it would
        # leave the other worker idle at the end of the run.
        group = "ray" if item.nodeid.startswith(RAY_TESTS) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not item.nodeid.startswith(RAY_TESTS))
