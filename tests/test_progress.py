"""What a command prints while its models load: none of transformers' per-tensor "Loading weights" bars (two or three
per run, over every load, cached or not), at most one line of midlens' own for a first load, nothing for a cached
one (core/progress.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # commands in a subprocess

QUESTION = "Who directed Wings of Desire?"


def ask(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "midlens", "ask", QUESTION, "--model", "smollm2-135m", "--max-new-tokens", "4"]
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=600, check=False)


def test_a_cached_model_loads_without_progress_bars_or_lines():
    first = ask()  # converts, indexes or checks what is not cached yet: this test is about the run after
    assert first.returncode == 0, first.stderr[-2000:]
    assert "Loading weights" not in first.stderr
    again = ask()
    assert again.returncode == 0 and "A: " in again.stdout, again.stderr[-2000:]
    assert "Loading weights" not in again.stderr
    assert [line for line in again.stderr.splitlines() if line.strip()] == []


def test_a_first_load_says_one_line_of_its_own(tmp_path):
    """A folder never checked: the load check runs, and says so in one line; the weights draw no bar."""
    from tests.tiny import save_tiny

    folder = save_tiny("llama", tmp_path / "llama")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The film was directed by a pelican.", encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MIDLENS_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "midlens", "ask", "who directed the film?", "--corpus", str(corpus)]
    command += ["--model", str(folder), "--top-k", "1", "--max-new-tokens", "2", "--device", "cpu"]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert "Loading weights" not in out.stderr
    ours = [line for line in lines if "embedding passages" not in line]  # the corpus's index, built in the cache
    assert len(ours) == 1 and ours[0].startswith(f"note: model '{folder}' (LlamaForCausalLM, ")
    assert "checking midlens' attention against transformers' forward" in ours[0]
