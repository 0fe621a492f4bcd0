"""`midlens ask` end to end in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

QUESTION = "What film is a sequel to a German romantic fantasy film featuring Bruno Ganz and Solveig Dommartin?"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "midlens.cli", *args], capture_output=True, text=True, env=env, timeout=600, check=False
    )


def test_ask_json_on_the_embedded_corpus(tmp_path):
    out = run_cli("ask", QUESTION, "--json", "--top-k", "4", "--max-new-tokens", "12")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout[out.stdout.index("{") :])
    assert result["question"] == QUESTION and result["text"]
    assert len(result["passages"]) == 4
    assert sorted(p["rank"] for p in result["passages"]) == [1, 2, 3, 4]
    titles = [p["passage"]["title"] for p in result["passages"]]
    assert "Wings of Desire" in titles  # the retriever found the gold paragraph
    assert all(p["calibrated"] is not None for p in result["passages"])


def test_ask_prints_ranked_bars_and_refuses_unknown_methods_before_loading():
    out = run_cli("ask", QUESTION, "--top-k", "3", "--max-new-tokens", "8", "--method", "ms-poe")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "passages ranked by calibrated evidence" in out.stdout
    assert out.stdout.count("[") >= 3 and "#" in out.stdout
    bad = run_cli("ask", QUESTION, "--method", "ms-poe(ratio_max=1.5, ratio_mni=1.0)")
    assert bad.returncode == 2
    assert "unknown ms-poe option(s) ['ratio_mni']; valid options: ratio_min" in bad.stderr
    assert "Loading weights" not in bad.stderr  # refused before the model loads
    assert "Traceback" not in bad.stderr


def test_missing_corpus_is_a_clear_error():
    out = run_cli("ask", "q?", "--corpus", "/nonexistent/folder")
    assert out.returncode == 2
    assert "corpus not found: /nonexistent/folder does not exist" in out.stderr
    assert "Traceback" not in out.stderr
