"""The decode loop's incremental text equals decoding the whole answer after every token, on every tokenizer the
project ships or tests with: byte-level BPE (SmolLM2, Qwen, the tiny models) and Gemma's SentencePiece-style one,
through multi-byte characters split over tokens and special tokens (skipped), with no tolerance: the streamed text
and the citations' character ends read it."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from midlens.generators.answering.detokenize import IncrementalText
from tests.tiny import _tokenizer

TEXT = "Brea, California — 1,024 km² naïve café 東京 🎉🎉 𓂀𓃰 𠜎 <b>x</b>\n\n  spaced  out. Wim Wenders' film"


def _check(tokenizer, ids: list[int]) -> None:
    text = IncrementalText(tokenizer)
    for i, token in enumerate(ids):
        assert text.push(token) == tokenizer.decode(ids[: i + 1], skip_special_tokens=True), i


def _ids(tokenizer) -> list[int]:
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    special = [t for t in (tokenizer.eos_token_id, tokenizer.bos_token_id) if t is not None]
    return ids[:7] + special + ids[7:] + special  # a special token mid-answer decodes to nothing


def test_tiny_tokenizer():
    tok = PreTrainedTokenizerFast(tokenizer_object=_tokenizer(), unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    _check(tok, _ids(tok))


@pytest.mark.model
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
def test_packaged_tokenizers(name):
    from transformers import AutoTokenizer

    from midlens.generators.models.model_cache import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(name))
    ids = _ids(tok)
    assert any("\ufffd" in tok.decode(ids[: i + 1]) for i in range(len(ids)))  # a character split over tokens
    _check(tok, ids)
