"""What `midlens check` and `Pipeline.check` refuse before any model work: an answer over the model's context window
(counted with the tokenizer alone) and a --passages file that cannot be read (named as the user gave it); and what
a long check says before it starts. The packaged SmolLM2-135M (8192-token window), in subprocesses as a user runs
the command, or in process with any model load made to fail the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from midlens.core.errors import InvalidArgumentError
from tests.conftest import planted_passages
from tests.test_cli import WEIGHTS_READ, run_cli_noting_loads

pytestmark = pytest.mark.slow  # subprocess runs

QUESTION = "When did the Kessler Bridge open?"
SMOL = ("--model", "smollm2-135m", "--method", "baseline")
# About 13,000 SmolLM2 tokens: over its 8192-token window.
TOO_LONG = "The Kessler Bridge opened in 1931 and it is painted dark green. " * 700
OVER_THE_WINDOW = "does not fit smollm2-135m's 8192-token context window: check a shorter answer"


def passages_file(tmp_path) -> str:
    path = tmp_path / "passages.jsonl"
    rows = [{"title": p.title, "text": p.text, "id": p.id} for p in planted_passages(4, 2)]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def no_model(monkeypatch):
    """Building a generator (what loads a model) fails the test."""
    from midlens.generators.answering.generator import Generator

    def loads(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(Generator, "__init__", loads)


def test_an_answer_over_the_window_is_refused_before_the_model_loads(tmp_path):
    """Defect (issue 83 I): `midlens check` loaded the model before it measured the answer (over --passages) or
    before anything at all (over a corpus: its index, then the model); a 20,000-word answer ran on silently. The
    answer is now measured with the tokenizer alone first, with Pipeline.check's limit and words."""
    for source in (["--passages", passages_file(tmp_path)], []):
        out = run_cli_noting_loads("check", QUESTION, "--answer", TOO_LONG, *source, *SMOL)
        assert out.returncode == 2, out.stderr[-2000:]
        assert OVER_THE_WINDOW in out.stderr and WEIGHTS_READ not in out.stderr


def test_pipeline_check_has_the_same_limit_and_applies_it_before_retrieving(pipeline, monkeypatch):
    def work(*args, **kwargs):
        raise AssertionError("the check retrieved or ran the model")

    monkeypatch.setattr(pipeline, "retrieve", work)
    monkeypatch.setattr(pipeline.generator, "attribute", work)
    with pytest.raises(InvalidArgumentError, match=OVER_THE_WINDOW):
        pipeline.check(QUESTION, TOO_LONG)
    with pytest.raises(InvalidArgumentError, match=OVER_THE_WINDOW):
        pipeline.check(QUESTION, TOO_LONG, planted_passages(4, 2))


def test_a_long_check_says_what_it_runs_before_the_model_loads(tmp_path, no_model, capsys):
    from midlens.cli import main

    long = "The Kessler Bridge opened in 1931. " * 120  # ~1,500 tokens: within the window, long for a CPU
    with pytest.raises(AssertionError, match="a model was loaded"):
        main(["check", QUESTION, "--answer", long, "--passages", passages_file(tmp_path), "--verify", *SMOL])
    said = capsys.readouterr().err
    assert "checking a 15" in said and "-token answer: one pass over it after a " in said, said
    assert "then one more per passage a sentence cites (--verify)" in said


# The refusal, and whether torch was imported by then (the model's modules import it: a file read after them was
# read seconds later than it need be).
READ_FIRST = (
    "import sys\nfrom midlens.cli import main\nrc = main(sys.argv[1:])\nprint('torch' in sys.modules)\nsys.exit(rc)"
)


def test_a_bad_passages_file_is_refused_by_its_option_name_before_any_heavy_import(tmp_path):
    """Defect (issue 83 I): a bad --passages file was called a "corpus" ("corpus not found", "remove it from the
    corpus") and refused after torch and the method's modules were imported (5-10 s). It is read first now, and
    the refusal names the option."""
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9".encode("latin-1"))
    (tmp_path / "blank.jsonl").write_text("\n")
    (tmp_path / "notes.pdf").write_text("x")
    cases = {
        str(tmp_path / "missing.jsonl"): f"--passages not found: {tmp_path / 'missing.jsonl'} does not exist.",
        str(latin): "latin.txt: not UTF-8 text (invalid byte 0xe9 at byte offset 3). Convert the file to UTF-8 (",
        str(tmp_path / "blank.jsonl"): f"--passages {tmp_path / 'blank.jsonl'} is empty: no document has any text.",
        str(tmp_path / "notes.pdf"): "notes.pdf: unsupported --passages file type '.pdf'; use .txt, .md or .jsonl.",
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for path, words in cases.items():
        argv = [sys.executable, "-c", READ_FIRST, "check", QUESTION, "--answer", "1931.", "--passages", path, *SMOL]
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
        assert out.returncode == 2 and words in out.stderr, out.stderr[-2000:]
        assert "corpus" not in out.stderr and out.stdout.strip() == "False", (out.stderr, out.stdout)
